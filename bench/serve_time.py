#!/usr/bin/python3
"""Inference latency of the reference DETR in PyTorch (eager, --engine torch: Debian's /usr/bin/python3) or
of its ONNX export in ONNX Runtime (--engine ort: a virtual environment with onnxruntime), for
bench/serve_compare.sh: the median of --reps forward passes (after one warm-up) on one image and on a
batch, at --threads intra-op threads. The input is the normalized tensor (no decoding, no resize, no
post-processing): random, or --input, a picture's ([1, 3, H, W] .npy, copied to fill the batch). Prints
one JSON line like bench_serve.
With --checkpoint (--engine torch) the model is a detr-c checkpoint's, built by
bench/serve_export_main.py from its model_config (--detr-repo: the Conditional DETR checkout), with
ENACT's regions fixed to those of the --input picture, as in its ONNX exports: the same computation
as ONNX Runtime runs.

  /usr/bin/python3 bench/serve_time.py --engine torch --detr-repo DIR --preset detr-r50 --weights W ...
  /usr/bin/python3 bench/serve_time.py --engine torch --detr-repo DIR --checkpoint C --input picture.npy ...
  VENV/bin/python bench/serve_time.py --engine ort --onnx-dir DIR [--input picture.npy] ...
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def median_time(run, reps):
    run()  # warm-up
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        t.append(time.perf_counter() - t0)
    return sorted(t)[len(t) // 2]


def batch_input(args, b, random):
    """[b, 3, H, W] float32: --input's picture copied b times, else random(shape)."""
    if args.input:
        return np.ascontiguousarray(np.repeat(np.load(args.input), b, axis=0))
    return random((b, 3, args.height, args.width))


def torch_runner(args):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import parity_step
    torch.set_num_threads(args.threads)
    if args.checkpoint:  # the main job's model, ENACT's regions fixed to the picture's
        import serve_export_main
        model, _, mods = serve_export_main.build_model(args.detr_repo, args.checkpoint)
        serve_export_main.freeze_on(model, mods, torch.from_numpy(np.load(args.input)))
    else:
        p = parity_step.PRESETS[args.preset]
        model, _, _ = parity_step.build_reference(args.detr_repo, p, args.seed, p.get("decoder", "detr"))
        model.eval()
        model.aux_loss = False

    def make(b):
        x = torch.from_numpy(batch_input(args, b, lambda shape: torch.rand(shape).numpy()))

        def run():
            with torch.no_grad():
                model(x)
        return run
    return make, f"pytorch-{torch.__version__}"


def ort_runner(args):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = {}

    def make(b):
        path = os.path.join(args.onnx_dir, f"model_b{b}.onnx")
        s = sessions.setdefault(b, ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]))
        x = batch_input(args, b, lambda shape: np.random.default_rng(0).random(shape, dtype=np.float32))
        return lambda: s.run(["pred_logits", "pred_boxes"], {"inputs": x})
    return make, f"onnxruntime-{ort.__version__}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["torch", "ort"], required=True)
    ap.add_argument("--detr-repo", help="torch: the reference checkout")
    ap.add_argument("--preset", default="detr-r50")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--onnx-dir", help="ort: serve_export.py's (or serve_export_main.py's) --out")
    ap.add_argument("--checkpoint", help="torch: a detr-c checkpoint (serve_export_main.py builds it; needs --input)")
    ap.add_argument("--input", help="a normalized picture [1, 3, H, W] as .npy (serve_export_main.py's picture.npy)")
    ap.add_argument("--height", type=int, default=800)
    ap.add_argument("--width", type=int, default=1066)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    if args.checkpoint and not args.input:
        ap.error("--checkpoint needs --input (ENACT's regions are the picture's)")
    if args.input:
        args.height, args.width = np.load(args.input).shape[-2:]
    make, impl = (torch_runner if args.engine == "torch" else ort_runner)(args)
    one = median_time(make(1), args.reps)
    batch = median_time(make(args.batch), args.reps) if args.batch > 0 else 0.0
    print(json.dumps({"impl": impl, "config": args.checkpoint or args.preset, "width": args.width, "height": args.height,
                      "threads": args.threads, "latency_s": round(one, 6), "batch": args.batch,
                      "batch_s": round(batch, 6), "images_per_s": round(args.batch / batch, 3) if batch else 0.0}))


if __name__ == "__main__":
    main()
