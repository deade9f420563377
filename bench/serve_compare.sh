#!/usr/bin/env bash
# Serving: detr-c's C API against ONNX Runtime and PyTorch on the same DETR weights, alternating runs.
#   bash bench/serve_compare.sh --detr-repo DIR [--preset detr-r50] [--height 800] [--width 1066]
#        [--threads "1 2"] [--batch 4] [--rounds 3] [--reps 5] [--build build-cpu] [--venv DIR] [--work DIR]
#        [--precisions "fp32 bf16"] [--gomp-spincount N]
#   bash bench/serve_compare.sh --checkpoint runs/main/best.safetensors --detr-repo CONDITIONAL_DETR_CHECKOUT
#        [--picture FILE] [--height H --width W] [...]
# With --checkpoint (a detr-c checkpoint, e.g. the main job's: ENACT encoder, Conditional DETR decoder,
# quarter-width ResNet-18 to layer3) and --detr-repo a checkout of Atten4Vis/ConditionalDETR, the three
# engines run on the checkpoint's model and one picture (--picture, any image file, H x W its size; else
# bench/serve_check.py's synthetic picture at --height x --width). bench/serve_export_main.py builds the
# model in PyTorch from the checkpoint's model_config with the checkout's modules (a narrow ResNet body
# in place of its ResNet-18's, ENACT in the encoder), loads its weights strictly, checks its detections
# on the picture against `detr predict` (serve_check.py's rule, on the 100 best (query, class) sigmoid
# scores), and writes into --work (default /tmp/detr-serve-DIR-NAME for runs/DIR/NAME.safetensors,
# rewritten each time) the ONNX exports for batch 1 and --batch (copies of the picture), the picture as
# PPM and as its normalized tensor. ENACT's regions (data-dependent: docs/enact.md) are fixed in those
# graphs to the ones the model finds on the picture, so they compute the model on that picture only:
# right for timing on it, not a general export; the region finding that detr-c does on each call is
# not in them. Then the venv's ONNX Runtime must give detr-c's detections on the picture from the
# graphs (every image of the batch), and each round times bench_serve --image (the same picture),
# serve_time.py --engine ort --input (the picture's tensor) and --engine torch --checkpoint (eager, the
# same regions fixed), reported as for the presets. Without --detr-repo, --checkpoint times detr-c
# alone, on seeded noise of --height x --width. bench_serve needs --image (a build from this tree).
# For a preset, bench/serve_export.py (Debian's /usr/bin/python3, python3-torch 1.13) builds the reference model
# from the facebookresearch/detr checkout at the preset, seeded (tools/parity_step.py's build_reference),
# and writes its weights as safetensors and its ONNX exports (torch.onnx, opset 12, as the reference's
# test_all.py) for batch 1 and --batch, into --work (default /tmp/detr-serve-PRESET-HxW; reused when
# there). bench/serve_check.py then checks that `detr predict` on those weights gives the reference's
# detections (every query's score within 1e-4, the same labels). Then each round runs, for each thread count: $build/bench/bench_serve (the C API:
# detr_open_weights with options.threads, detr_detect_rgb on one HxW image, detr_detect_batch on
# --batch), bench/serve_time.py --engine ort (the venv's ONNX Runtime on the exports, intra-op threads)
# and --engine torch (eager PyTorch, torch.set_num_threads), each reporting the median of --reps after
# a warm-up. The report gives, per thread count, the median over rounds of each one's latency of one
# image and images/s at --batch, and detr-c's latency as a fraction of ONNX Runtime's.
# --precisions: detr-c once per precision in each round (bf16: the C API's sets given bf16=true, on a CPU
# with AVX512-BF16 or AMX; reported as detr-c-bf16 - a different arithmetic from the other engines' fp32).
# bench_serve runs in libgomp's default wait policy, as an application linking libdetr does (the
# library sets none; on the main job's model at 2 threads the default's fp32 latency is 0.91-0.94x
# that with a spin of 1000, bf16's about the same: bench/README.md#bench_serve); --gomp-spincount N
# runs it with GOMP_SPINCOUNT=N instead, e.g. 1000, the setting the detr tool makes for itself
# (kernels/cpu/cpu_runtime.c), so `detr predict`'s.
# detr-c's time includes what its API does beyond the forward (normalising the RGB bytes, DETR's
# post-processing, the heads of every decoder layer); ONNX Runtime's and PyTorch's are the forward on
# a normalized tensor. ONNX Runtime in a virtual environment outside the repository:
#   python3 -m venv --system-site-packages /work/venv-ort && /work/venv-ort/bin/pip install onnxruntime onnx
# Build bench_serve in a CPU-only Release build:
#   cmake -S . -B build-cpu -DDETR_CUDA=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build build-cpu --target bench_serve
set -euo pipefail
cd "$(dirname "$0")/.."
repo="" checkpoint="" picture="" preset="detr-r50" height="" width="" threads="1 2" batch=4 rounds=3 reps=5
build=build-cpu venv=/work/venv-ort work="" precisions=fp32 spincount=
while [ $# -gt 0 ]; do
  case "$1" in
    --detr-repo) repo="$2"; shift 2 ;;
    --checkpoint) checkpoint="$2"; shift 2 ;;
    --picture) picture="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --height) height="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --gomp-spincount) spincount="$2"; shift 2 ;;
    *) echo "serve_compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# serve_detr_c ARGS...: bench_serve once per precision, its JSON line's impl named after the precision.
serve_detr_c() {
  local p
  for p in $precisions; do
    case $p in
      fp32) env ${spincount:+GOMP_SPINCOUNT=$spincount} "$build/bench/bench_serve" "$@" ;;
      bf16) env ${spincount:+GOMP_SPINCOUNT=$spincount} "$build/bench/bench_serve" "$@" --set bf16=true |
              sed 's/"impl": "detr-c"/"impl": "detr-c-bf16"/' ;;
      *) echo "serve_compare.sh: --precisions takes fp32 and bf16" >&2; return 2 ;;
    esac
  done
}
# report FILE: the median over rounds of each engine's JSON lines, per thread count, and detr-c's latency
# as a fraction of ONNX Runtime's.
report() {
  /usr/bin/python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
r0 = rows[0]
# Seconds, or milliseconds for a model that runs in under 0.1 s (three decimals of a second are too few).
ms = max(r["latency_s"] for r in rows) < 0.1
show = (lambda v: f"{v * 1e3:7.3f} ms") if ms else (lambda v: f"{v:7.3f} s")
print(f"{r0['config']} {r0['height']}x{r0['width']}, batch {r0['batch']}, {len(rows)} runs alternating (median over rounds):")
for t in sorted({r["threads"] for r in rows}):
    med = {}
    for impl in sorted({r["impl"] for r in rows if r["threads"] == t}):
        rs = [r for r in rows if r["threads"] == t and r["impl"] == impl]
        lat = statistics.median(r["latency_s"] for r in rs)
        ips = statistics.median(r["images_per_s"] for r in rs)
        med[impl] = lat
        print(f"  {t} thread{'s' if t > 1 else ' '} {impl:22s} latency {show(lat)}   {ips:6.2f} images/s at batch "
              f"{r0['batch']}   (latencies: {', '.join(str(r['latency_s']) for r in rs)})")
    ort = [k for k in med if k.startswith("onnxruntime")]
    for impl in ("detr-c", "detr-c-bf16"):
        if impl in med and ort:
            # Each round's two runs, taken one after the other, as a pair: on a noisy machine the median
            # of the pairs' ratios moves less than the ratio of the medians.
            pairs = zip((r["latency_s"] for r in rows if r["threads"] == t and r["impl"] == impl),
                        (r["latency_s"] for r in rows if r["threads"] == t and r["impl"] == ort[0]))
            ratios = sorted(a / b for a, b in pairs)
            print(f"  {t} thread{'s' if t > 1 else ' '} {impl} latency / ONNX Runtime's: {med[impl] / med[ort[0]]:.2f} "
                  f"(rounds' ratios: median {statistics.median(ratios):.2f}, {ratios[0]:.2f}-{ratios[-1]:.2f})")
PY
}
[ -n "$repo" ] || [ -n "$checkpoint" ] || { echo "serve_compare.sh: --detr-repo DIR (or --checkpoint C) is required" >&2; exit 2; }
[ -x "$build/bench/bench_serve" ] || { echo "serve_compare.sh: no $build/bench/bench_serve: build it first (see above)" >&2; exit 2; }
if [ -n "$checkpoint" ] && [ -z "$repo" ]; then  # detr-c alone on its own model
  : "${height:=800}" "${width:=1066}"
  out=$(mktemp)
  for r in $(seq "$rounds"); do
    for t in $threads; do
      serve_detr_c --checkpoint "$checkpoint" --height "$height" --width "$width" \
        --threads "$t" --reps "$reps" --batch "$batch" >> "$out"
    done
  done
  report "$out"  # detr-c's lines alone: no ratio
  rm -f "$out"
  exit 0
fi
[ -x "$venv/bin/python" ] || { echo "serve_compare.sh: no $venv/bin/python with onnxruntime (see above)" >&2; exit 2; }
if [ -n "$checkpoint" ]; then  # the checkpoint's model in the three engines, on one picture
  [ -n "$work" ] || work="/tmp/detr-serve-$(basename "$(dirname "$checkpoint")")-$(basename "$checkpoint" .safetensors)"
  /usr/bin/python3 bench/serve_export_main.py --checkpoint "$checkpoint" --detr-repo "$repo" ${picture:+--picture "$picture"} \
    ${height:+--height "$height"} ${width:+--width "$width"} --batch "$batch" --detr "$build/detr" --out "$work" ||
    { echo "serve_compare.sh: no PyTorch model of $checkpoint that gives detr-c's detections: nothing timed" >&2; exit 1; }
  "$venv/bin/python" bench/serve_export_main.py --check-onnx "$work" ||
    { echo "serve_compare.sh: ONNX Runtime on the exports and detr-c disagree on the picture: nothing timed" >&2; exit 1; }
  out="$work/runs.jsonl"
  : > "$out"
  for r in $(seq "$rounds"); do
    for t in $threads; do
      serve_detr_c --checkpoint "$checkpoint" --image "$work/picture.ppm" --threads "$t" --reps "$reps" \
        --batch "$batch" >> "$out"
      "$venv/bin/python" bench/serve_time.py --engine ort --onnx-dir "$work" --input "$work/picture.npy" \
        --threads "$t" --reps "$reps" --batch "$batch" --preset "$checkpoint" >> "$out"
      /usr/bin/python3 bench/serve_time.py --engine torch --detr-repo "$repo" --checkpoint "$checkpoint" \
        --input "$work/picture.npy" --threads "$t" --reps "$reps" --batch "$batch" >> "$out"
    done
  done
  report "$out"
  exit 0
fi
: "${height:=800}" "${width:=1066}"
[ -n "$work" ] || work="/tmp/detr-serve-$preset-${height}x$width"
if [ ! -f "$work/model_b$batch.onnx" ] || [ ! -f "$work/model_b1.onnx" ] || [ ! -f "$work/weights.safetensors" ]; then
  /usr/bin/python3 bench/serve_export.py --detr-repo "$repo" --preset "$preset" --height "$height" --width "$width" \
    --batch 1 --batch "$batch" --out "$work"
fi
# The same detections from the same weights (detr predict against the reference in PyTorch, at a
# small size), or nothing is timed.
/usr/bin/python3 bench/serve_check.py --detr-repo "$repo" --preset "$preset" --weights "$work/weights.safetensors" \
  --detr "$build/detr" || { echo "serve_compare.sh: detr-c and the reference disagree on the weights" >&2; exit 1; }
out="$work/runs.jsonl"
: > "$out"
for r in $(seq "$rounds"); do
  for t in $threads; do
    serve_detr_c --weights "$work/weights.safetensors" --config "$preset" --height "$height" \
      --width "$width" --threads "$t" --reps "$reps" --batch "$batch" >> "$out"
    "$venv/bin/python" bench/serve_time.py --engine ort --onnx-dir "$work" --height "$height" --width "$width" \
      --threads "$t" --reps "$reps" --batch "$batch" --preset "$preset" >> "$out"
    /usr/bin/python3 bench/serve_time.py --engine torch --detr-repo "$repo" --preset "$preset" --height "$height" \
      --width "$width" --threads "$t" --reps "$reps" --batch "$batch" >> "$out"
  done
done
report "$out"
