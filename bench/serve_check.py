#!/usr/bin/python3
"""Checks, before bench/serve_compare.sh times anything, that detr-c and the reference compute the same
detections from the weights serve_export.py wrote: one picture (a gradient with two coloured
rectangles) of --height x --width through `detr predict` (the C API's path: the folded inference
forward) with the input size set to the picture's, and through the reference model in PyTorch
(tools/parity_step.py's build_reference, the same seed) on the same pixels normalized as detr-c does,
with DETR's post-processing. Every query's score and box, matched by query. Exit 1 when a score
differs by more than --tol or a label differs.

  /usr/bin/python3 bench/serve_check.py --detr-repo DIR --preset detr-r50 --weights W --height 256 --width 352
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import parity_step  # noqa: E402


def picture(h, w):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], -1).astype(np.uint8)
    img[h // 6:h // 2, w // 6:w // 2] = [240, 30, 30]
    img[h // 2:h * 9 // 10, w // 2:w * 9 // 10] = [20, 200, 60]
    return img


def reference(args, img):
    p = parity_step.PRESETS[args.preset]
    model, _, _ = parity_step.build_reference(args.detr_repo, p, args.seed, p.get("decoder", "detr"))
    model.eval()
    model.aux_loss = False
    t = torch.from_numpy(img).permute(2, 0, 1).float() / 255.0
    t = (t - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    with torch.no_grad():
        out = model(t[None])
    prob = out["pred_logits"].softmax(-1)[0, :, :-1]  # DETR's softmax head (the detr-* presets)
    score, label = prob.max(-1)
    return [(float(s), int(l)) for s, l in zip(score, label)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--detr-repo", required=True)
    ap.add_argument("--preset", default="detr-r50")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--detr", default="build-cpu/detr")
    ap.add_argument("--height", type=int, default=256)
    ap.add_argument("--width", type=int, default=352)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    img = picture(args.height, args.width)
    with tempfile.TemporaryDirectory() as work:
        Image.fromarray(img).save(os.path.join(work, "img.png"))
        side, longest = min(args.height, args.width), max(args.height, args.width)
        subprocess.run([args.detr, "predict", "--weights", args.weights, "--config", args.preset, "--image-size",
                        str(side), "--max-size", str(longest), "--threshold", "0", os.path.join(work, "img.png"),
                        "--out", os.path.join(work, "out")], check=True, capture_output=True)
        ours = json.load(open(os.path.join(work, "out", "predictions.json")))
    dets = (ours[0] if isinstance(ours, list) else ours["images"][0])["detections"]
    ref = reference(args, img)
    by_query = sorted(range(len(ref)), key=lambda q: (-ref[q][0], q))  # detr-c's order: falling score
    ds = max(abs(d["score"] - ref[q][0]) for d, q in zip(dets, by_query))
    labels = sum(d["label"] == ref[q][1] for d, q in zip(dets, by_query))
    print(f"serve_check: {args.preset} {args.height}x{args.width}: {len(dets)} detections, max |score difference| "
          f"{ds:.3g}, labels equal {labels}/{len(ref)}", file=sys.stderr)
    sys.exit(0 if len(dets) == len(ref) and ds <= args.tol and labels == len(ref) else 1)


if __name__ == "__main__":
    main()
