#!/usr/bin/env bash
# detr-c vs PyTorch on the same DETR training step, alternating runs on this machine.
#   bash bench/compare_torch.sh --detr-repo DIR [--preset detr-r18-small] [--size 320] [--rounds 3] [--reps 5]
#                               [--build DIR] [--python PY ...] [--precision fp32|bf16]
# Each round runs $build/bench/bench_step and bench/torch_step.py once each (each times --reps steps
# after a warm-up and reports its median); the report gives the median over rounds of each, the
# ratio detr-c / PyTorch, and each one's peak resident memory. Needs Debian's python3-torch and
# python3-torchvision and a checkout of facebookresearch/detr. --build (default build) names the
# build of bench_step: Debian's PyTorch has no CUDA, so compare with a CPU-only build
#   cmake -S . -B build-cpu -DDETR_CUDA=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build build-cpu --target bench_step
# (a CUDA-enabled binary maps ~150 MB of CUDA libraries even when it runs on the CPU).
# --precision bf16: detr-c's `--precision bf16` beside PyTorch's CPU autocast to bfloat16 (forward and
# loss under torch.autocast("cpu", dtype=torch.bfloat16), as its documentation shows), both on a CPU
# with AVX512-BF16 or AMX.
# --python (repeatable; default /usr/bin/python3, Debian's PyTorch 1.13) adds a PyTorch: each round
# runs every one, alternating with detr-c. PyTorch 2.x from PyPI, in a virtual environment outside
# the repository (about 3 GB: PyPI's Linux wheels bring CUDA's libraries; they run on the CPU):
#   python3 -m venv ~/venvs/torch2 && ~/venvs/torch2/bin/pip install torch==2.5.1 torchvision==0.20.1 scipy packaging
#   bash bench/compare_torch.sh --detr-repo DIR --python /usr/bin/python3 --python ~/venvs/torch2/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
repo="" preset="detr-r18-small" size=320 rounds=3 reps=5 boxes=3 build=build precision=fp32
pythons=()
while [ $# -gt 0 ]; do
  case "$1" in
    --detr-repo) repo="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --boxes) boxes="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --python) pythons+=("$2"); shift 2 ;;
    --precision) precision="$2"; shift 2 ;;
    *) echo "compare_torch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$repo" ] || { echo "compare_torch.sh: --detr-repo DIR is required" >&2; exit 2; }
[ -x "$build/bench/bench_step" ] || { echo "compare_torch.sh: no $build/bench/bench_step: build it first (see above)" >&2; exit 2; }
[ ${#pythons[@]} -gt 0 ] || pythons=(/usr/bin/python3)
out=$(mktemp)
for r in $(seq "$rounds"); do
  for py in "${pythons[@]}"; do
    OMP_NUM_THREADS=2 "$build/bench/bench_step" --preset "$preset" --size "$size" --boxes "$boxes" --reps "$reps" \
      --precision "$precision" >> "$out"
    "$py" bench/torch_step.py --detr-repo "$repo" --preset "$preset" --size "$size" --boxes "$boxes" \
      --reps "$reps" --threads 2 --precision "$precision" 2> "$out.err" >> "$out" || { echo "compare_torch.sh: $py failed:" >&2; tail -5 "$out.err" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["impl"], []).append(r)
c = by.pop("detr-c")
mc = statistics.median(r["median_s"] for r in c)
pc = max(r["peak_rss_mb"] for r in c)
print(f"{c[0]['preset']} {c[0]['size']}x{c[0]['size']}, batch 2, {'bf16' if c[0].get('bf16') else 'fp32'}, "
      f"{len(rows)} runs alternating:")
print(f"  detr-c         median step {mc:.3f} s   peak RSS {pc:.0f} MB   (runs: {', '.join(str(r['median_s']) for r in c)})")
best = None
for impl, t in sorted(by.items()):
    mt = statistics.median(r["median_s"] for r in t)
    pt = max(r["peak_rss_mb"] for r in t)
    print(f"  {impl:14s} median step {mt:.3f} s   peak RSS {pt:.0f} MB   (runs: {', '.join(str(r['median_s']) for r in t)})")
    print(f"  ratio detr-c / {impl}: time {mc / mt:.2f}, peak memory {pc / pt:.2f}")
    if best is None or mt < best[1]:
        best = (impl, mt, pt)
if best and len(by) > 1:
    print(f"  against the faster ({best[0]}): time {mc / best[1]:.2f}, peak memory {pc / best[2]:.2f}")
PY
rm -f "$out" "$out.err"
