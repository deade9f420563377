#!/usr/bin/python3
"""Checks, before bench/serve_compare.sh times anything, that detr-c and the reference compute the same
detections from the weights serve_export.py wrote: one picture (a gradient with two coloured
rectangles) of --height x --width through `detr predict` (the C API's path: the folded inference
forward) with the input size set to the picture's, and through the reference model in PyTorch
(tools/parity_step.py's build_reference, the same seed) on the same pixels normalized as detr-c does,
with DETR's post-processing. Every query's score and box, matched by query. Exit 1 when a score
differs by more than --tol or a label differs. Its pieces (detr_predict, softmax_picks, sigmoid_picks,
compare) also check the main job's model (bench/serve_export_main.py).

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


def normalized(img):
    """[1, 3, H, W] float32 from H x W x 3 bytes, normalized with ImageNet's mean and std as detr-c does."""
    t = torch.from_numpy(img).permute(2, 0, 1).float() / 255.0
    t = (t - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    return t[None]


def softmax_picks(logits):
    """DETR's post-processing (the detr-* presets' softmax head) of one image's logits [Q, C + 1]: each
    query's best class without "no object", as (score, label), by falling score (ties: query order)."""
    score, label = torch.as_tensor(logits).softmax(-1)[:, :-1].max(-1)
    ref = [(float(s), int(l)) for s, l in zip(score, label)]
    return [ref[q] for q in sorted(range(len(ref)), key=lambda q: (-ref[q][0], q))]


def sigmoid_picks(logits, k=100):
    """Conditional DETR's post-processing (a sigmoid head: PostProcess's topk(prob, 100)) of one image's
    logits [Q, C]: the k best (query, class) sigmoid scores as (score, label, query), by falling score
    (ties: the flat index order, as detr-c's nn/class_focal.c). numpy only: ONNX Runtime's outputs are
    read in a virtual environment whose numpy the system's torch may not take."""
    logits = np.asarray(logits, np.float32)
    prob = (1.0 / (1.0 + np.exp(-logits))).flatten().tolist()
    C = logits.shape[-1]
    best = sorted(range(len(prob)), key=lambda i: (-prob[i], i))[:k]
    return [(prob[i], i % C, i // C) for i in best]


def reference(args, img):
    p = parity_step.PRESETS[args.preset]
    model, _, _ = parity_step.build_reference(args.detr_repo, p, args.seed, p.get("decoder", "detr"))
    model.eval()
    model.aux_loss = False
    with torch.no_grad():
        out = model(normalized(img))
    return softmax_picks(out["pred_logits"][0])  # the detr-* presets' softmax head


def detr_predict(detr, img, model_args, threads=0):
    """`detr predict` (model_args: --weights W --config P, or --checkpoint C) on the picture img
    (H x W x 3 bytes, written as PNG: lossless) with the input size set to the picture's, so that the
    val resize leaves it as it is; every detection (threshold 0), best first."""
    h, w = img.shape[:2]
    with tempfile.TemporaryDirectory() as work:
        Image.fromarray(img).save(os.path.join(work, "img.png"))
        cmd = [detr, "predict", *model_args, "--image-size", str(min(h, w)), "--max-size", str(max(h, w)),
               "--threshold", "0", os.path.join(work, "img.png"), "--out", os.path.join(work, "out")]
        if threads:
            cmd += ["--threads", str(threads)]
        subprocess.run(cmd, check=True, capture_output=True)
        ours = json.load(open(os.path.join(work, "out", "predictions.json")))
    return (ours[0] if isinstance(ours, list) else ours["images"][0])["detections"]


def compare(dets, ref, tol):
    """detr-c's detections against the reference's picks (score, label), rank by rank: (passed, max |score
    difference|, labels equal)."""
    ds = max((abs(d["score"] - r[0]) for d, r in zip(dets, ref)), default=float("inf"))
    labels = sum(d["label"] == r[1] for d, r in zip(dets, ref))
    return len(dets) == len(ref) and ds <= tol and labels == len(ref), ds, labels


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
    dets = detr_predict(args.detr, img, ["--weights", args.weights, "--config", args.preset])
    ref = reference(args, img)
    ok, ds, labels = compare(dets, ref, args.tol)
    print(f"serve_check: {args.preset} {args.height}x{args.width}: {len(dets)} detections, max |score difference| "
          f"{ds:.3g}, labels equal {labels}/{len(ref)}", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
