#!/usr/bin/python3
"""The reference DETR training step in PyTorch, for bench/compare_torch.sh.

Builds the reference model (facebookresearch/detr, imported from --detr-repo as tools/parity_step.py
does) at a detr-c preset, and times forward + loss + backward + gradient clipping (0.1) + AdamW
(lr 1e-4, backbone 1e-5, weight decay 1e-4) on a fixed batch of 2 images with --boxes targets each,
dropout on. Prints one JSON line like bench_step: median seconds and peak RSS.
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import parity_step  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--detr-repo", required=True)
    ap.add_argument("--preset", default="detr-r18-small", choices=sorted(parity_step.PRESETS))
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: the forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = ap.parse_args()
    bf16 = args.precision == "bf16"
    torch.set_num_threads(args.threads)
    p = parity_step.PRESETS[args.preset]
    model, criterion, weight_dict = parity_step.build_reference(args.detr_repo, p, 1)
    from util.misc import NestedTensor

    model.train()
    groups = [
        {"params": [q for n, q in model.named_parameters() if "backbone" not in n and q.requires_grad]},
        {"params": [q for n, q in model.named_parameters() if "backbone" in n and q.requires_grad], "lr": 1e-5},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-4, weight_decay=1e-4)
    g = torch.Generator().manual_seed(7)
    images = torch.randn(2, 3, args.size, args.size, generator=g)
    mask = torch.zeros(2, args.size, args.size, dtype=torch.bool)
    targets = []
    for b in range(2):
        cxcy = torch.rand(args.boxes, 2, generator=g) * 0.6 + 0.2
        wh = torch.rand(args.boxes, 2, generator=g) * 0.2 + 0.1
        labels = torch.randint(0, p["classes"], (args.boxes,), generator=g)
        targets.append({"boxes": torch.cat([cxcy, wh], 1), "labels": labels})
    times = []
    for r in range(-1, args.reps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # PyTorch's mixed precision
            outputs = model(NestedTensor(images, mask))
            losses = criterion(outputs, targets)
            total = sum(losses[k] * weight_dict[k] for k in losses if k in weight_dict)
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        if r >= 0:
            times.append(time.perf_counter() - t0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"impl": "pytorch-" + torch.__version__.split("+")[0], "preset": args.preset, "size": args.size, "enact": False, "precision": args.precision,
                      "median_s": round(sorted(times)[len(times) // 2], 4), "peak_rss_mb": round(peak_mb, 1),
                      "steps_s": [round(t, 4) for t in times], "torch": torch.__version__}))


if __name__ == "__main__":
    main()
