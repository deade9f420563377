#!/usr/bin/env bash
# detr-c vs PyTorch on the same DETR training step, alternating runs on this machine.
#   bash bench/compare_torch.sh --detr-repo DIR [--preset detr-r18-small] [--size 320] [--rounds 3] [--reps 5]
#                               [--build DIR]
# Each round runs $build/bench/bench_step and bench/torch_step.py once each (each times --reps steps
# after a warm-up and reports its median); the report gives the median over rounds of each, the
# ratio detr-c / PyTorch, and each one's peak resident memory. Needs Debian's python3-torch and
# python3-torchvision and a checkout of facebookresearch/detr. --build (default build) names the
# build of bench_step: Debian's PyTorch has no CUDA, so compare with a CPU-only build
#   cmake -S . -B build-cpu -DDETR_CUDA=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build build-cpu --target bench_step
# (a CUDA-enabled binary maps ~150 MB of CUDA libraries even when it runs on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="" preset="detr-r18-small" size=320 rounds=3 reps=5 boxes=3 build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --detr-repo) repo="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --boxes) boxes="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    *) echo "compare_torch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$repo" ] || { echo "compare_torch.sh: --detr-repo DIR is required" >&2; exit 2; }
[ -x "$build/bench/bench_step" ] || { echo "compare_torch.sh: no $build/bench/bench_step: build it first (see above)" >&2; exit 2; }
out=$(mktemp)
for r in $(seq "$rounds"); do
  OMP_NUM_THREADS=2 "$build/bench/bench_step" --preset "$preset" --size "$size" --boxes "$boxes" --reps "$reps" >> "$out"
  /usr/bin/python3 bench/torch_step.py --detr-repo "$repo" --preset "$preset" --size "$size" --boxes "$boxes" \
    --reps "$reps" --threads 2 2>/dev/null >> "$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["impl"], []).append(r)
c, t = by["detr-c"], by["pytorch"]
mc = statistics.median(r["median_s"] for r in c)
mt = statistics.median(r["median_s"] for r in t)
pc = max(r["peak_rss_mb"] for r in c)
pt = max(r["peak_rss_mb"] for r in t)
print(f"{c[0]['preset']} {c[0]['size']}x{c[0]['size']}, batch 2, {len(c)} rounds:")
print(f"  detr-c   median step {mc:.3f} s   peak RSS {pc:.0f} MB   (rounds: {', '.join(str(r['median_s']) for r in c)})")
print(f"  PyTorch  median step {mt:.3f} s   peak RSS {pt:.0f} MB   (rounds: {', '.join(str(r['median_s']) for r in t)})")
print(f"  ratio detr-c / PyTorch: time {mc / mt:.2f}, peak memory {pc / pt:.2f}")
PY
rm -f "$out"
