#!/usr/bin/python3
"""The reference DETR at a detr-c preset, seeded, for bench/serve_compare.sh: its weights as safetensors
under the reference's names (detr-c loads them with detr_open_weights) and ONNX exports of its
inference forward, made as facebookresearch/detr's test_all.py makes them (torch.onnx.export, opset 12,
constant folding, input "inputs", outputs "pred_logits" and "pred_boxes"), one per batch size (the
reference's ONNX path unrolls the batch when tracing). The model is tools/parity_step.py's
build_reference (the reference's own modules from --detr-repo, random frozen batch-norm statistics),
in eval mode and without the auxiliary outputs. Needs Debian's python3-torch and python3-torchvision.

  /usr/bin/python3 bench/serve_export.py --detr-repo DIR --preset detr-r50 --height 800 --width 1066 \\
      --batch 1 --batch 4 --out DIR
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import parity_step  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--detr-repo", required=True)
    ap.add_argument("--preset", default="detr-r50", choices=sorted(parity_step.PRESETS))
    ap.add_argument("--height", type=int, default=800)
    ap.add_argument("--width", type=int, default=1066)
    ap.add_argument("--batch", type=int, action="append", help="batch sizes to export (default 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    p = parity_step.PRESETS[args.preset]
    model, _, _ = parity_step.build_reference(args.detr_repo, p, args.seed, p.get("decoder", "detr"))
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    parity_step.write_safetensors(os.path.join(args.out, "weights.safetensors"),
                                  {k: v.detach().numpy() for k, v in model.state_dict().items()})
    model.aux_loss = False  # the last decoder layer's outputs only (detr-c computes every layer's heads)
    for b in args.batch or [1]:
        x = torch.rand(b, 3, args.height, args.width)
        path = os.path.join(args.out, f"model_b{b}.onnx")
        with torch.no_grad():
            torch.onnx.export(model, x, path, do_constant_folding=True, opset_version=12, input_names=["inputs"],
                              output_names=["pred_logits", "pred_boxes"])
        print(f"serve_export: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
