#!/usr/bin/python3
"""Parity of `detr step` with the reference DETR (facebookresearch/detr) on the same weights and batch.

Builds the reference model from a checkout of the reference repository (its own code, imported at
run time; nothing of it is copied here), initialises it from a seed (random frozen batch-norm
statistics so the backbone is not the identity), writes its state_dict and a random batch as
safetensors, runs `detr step --no-dropout`, and compares the outputs, matches, every loss term and
every parameter gradient with the reference's. Needs Debian's python3-torch, python3-torchvision,
python3-scipy.

  /usr/bin/python3 tools/parity_step.py --detr-repo DIR --preset tiny [--padding] [--detr build/detr]

Exit status 0 when every compared quantity agrees to --tol (max |a - b| / max |b|), else 1.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

PRESETS = {  # must match nn/config.c
    "detr-r50": dict(backbone="resnet50", hidden=256, heads=8, enc=6, dec=6, ffn=2048, queries=100, classes=91),
    "detr-r18-small": dict(backbone="resnet18", hidden=128, heads=4, enc=2, dec=2, ffn=512, queries=50, classes=91),
    "tiny": dict(backbone="resnet18", hidden=32, heads=4, enc=2, dec=2, ffn=64, queries=10, classes=7),
}
DTYPES = {"F32": np.float32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_, "F64": np.float64, "I32": np.int32}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    names = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        data = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(buf[a:b], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
    return out


def build_reference(repo, p, seed):
    sys.path.insert(0, repo)
    import models.backbone as backbone_mod  # noqa: E402  (the reference's own modules)
    from models.detr import DETR, SetCriterion
    from models.matcher import HungarianMatcher
    from models.position_encoding import PositionEmbeddingSine
    from models.transformer import Transformer

    backbone_mod.is_main_process = lambda: False  # no ImageNet download: weights come from the seed
    torch.manual_seed(seed)
    backbone = backbone_mod.Backbone(p["backbone"], True, False, False)
    joiner = backbone_mod.Joiner(backbone, PositionEmbeddingSine(p["hidden"] // 2, normalize=True))
    joiner.num_channels = backbone.num_channels
    transformer = Transformer(d_model=p["hidden"], dropout=0.1, nhead=p["heads"], dim_feedforward=p["ffn"],
                              num_encoder_layers=p["enc"], num_decoder_layers=p["dec"], normalize_before=False,
                              return_intermediate_dec=True)
    model = DETR(joiner, transformer, num_classes=p["classes"], num_queries=p["queries"], aux_loss=True)
    # Frozen batch norms as a pretrained backbone has them: scales near 1, small means.
    g = torch.Generator().manual_seed(seed + 1)
    for name, buf in model.named_buffers():
        if "running_var" in name:
            buf.copy_(torch.rand(buf.shape, generator=g) * 0.5 + 0.75)
        elif "running_mean" in name or name.endswith(".bias"):
            buf.copy_((torch.rand(buf.shape, generator=g) - 0.5) * 0.2)
        elif name.endswith(".weight"):
            buf.copy_(torch.rand(buf.shape, generator=g) * 0.4 + 0.4)
    weight_dict = {"loss_ce": 1, "loss_bbox": 5, "loss_giou": 2}
    for i in range(p["dec"] - 1):
        weight_dict.update({k + f"_{i}": v for k, v in list(weight_dict.items())[:3]})
    matcher = HungarianMatcher(cost_class=1, cost_bbox=5, cost_giou=2)
    criterion = SetCriterion(p["classes"], matcher, weight_dict, eos_coef=0.1, losses=["labels", "boxes", "cardinality"])
    return model, criterion, weight_dict


def make_batch(p, padding, seed, size):
    g = torch.Generator().manual_seed(seed + 2)
    B, H, W = 2, size[0], size[1]
    images = torch.randn(B, 3, H, W, generator=g)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    if padding:  # image 1 is smaller: padded bottom and right, zeros there as the reference pads
        h1, w1 = H * 3 // 4, W * 5 // 8
        mask[1, h1:, :] = True
        mask[1, :, w1:] = True
        images[1, :, h1:, :] = 0
        images[1, :, :, w1:] = 0
    targets = []
    for b, n in enumerate([3, 2]):
        cxcy = torch.rand(n, 2, generator=g) * 0.6 + 0.2
        wh = torch.rand(n, 2, generator=g) * 0.3 + 0.1
        labels = torch.randint(0, p["classes"], (n,), generator=g)
        targets.append({"boxes": torch.cat([cxcy, wh], 1), "labels": labels})
    return images, mask, targets


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = max(np.abs(b).max(initial=0.0), 1e-12)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detr-repo", required=True, help="checkout of facebookresearch/detr")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--padding", action="store_true", help="second image padded bottom/right")
    ap.add_argument("--detr", default="build/detr", help="the detr binary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default=None, help="HxW of the batch (default: 96x128, 320x320 for detr-r50)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--keep", default=None, help="directory to keep the files in")
    args = ap.parse_args()
    p = PRESETS[args.preset]
    size = tuple(int(v) for v in (args.size or ("320x320" if args.preset == "detr-r50" else "96x128")).split("x"))
    torch.set_num_threads(2)

    model, criterion, weight_dict = build_reference(args.detr_repo, p, args.seed)
    from util.misc import NestedTensor

    images, mask, targets = make_batch(p, args.padding, args.seed, size)
    model.eval()  # dropout off; frozen batch norm does not care; gradients still flow
    outputs = model(NestedTensor(images, mask))
    out_no_aux = {k: v for k, v in outputs.items() if k != "aux_outputs"}
    indices = criterion.matcher(out_no_aux, targets)
    losses = criterion(outputs, targets)
    total = sum(losses[k] * weight_dict[k] for k in losses if k in weight_dict)
    total.backward()

    work = args.keep or tempfile.mkdtemp(prefix="detr-parity-")
    os.makedirs(work, exist_ok=True)
    wpath, bpath, opath = (os.path.join(work, n) for n in ("weights.safetensors", "batch.safetensors", "out.safetensors"))
    write_safetensors(wpath, {k: v.detach().numpy() for k, v in model.state_dict().items()})
    batch = {"images": images.numpy(), "mask": mask.numpy().astype(np.uint8)}
    for i, t in enumerate(targets):
        batch[f"targets.{i}.boxes"] = t["boxes"].numpy()
        batch[f"targets.{i}.labels"] = t["labels"].numpy()
    write_safetensors(bpath, batch)
    cmd = [args.detr, "step", "--config", args.preset, "--weights", wpath, "--batch", bpath, "--out", opath, "--no-dropout"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout, run.stderr)
        sys.exit(f"parity: detr step failed ({run.returncode})")
    ours = read_safetensors(opath)

    rows = []
    rows.append(("pred_logits", rel_err(ours["pred_logits"], outputs["pred_logits"].detach())))
    rows.append(("pred_boxes", rel_err(ours["pred_boxes"], outputs["pred_boxes"].detach())))
    for l, aux in enumerate(outputs["aux_outputs"]):
        rows.append((f"aux.{l}.pred_logits", rel_err(ours[f"aux.{l}.pred_logits"], aux["pred_logits"].detach())))
        rows.append((f"aux.{l}.pred_boxes", rel_err(ours[f"aux.{l}.pred_boxes"], aux["pred_boxes"].detach())))
    match_ok = True
    for i, (q, t) in enumerate(indices):
        ref = np.stack([q.numpy(), t.numpy()], 1) if len(q) else np.zeros((0, 2), np.int64)
        match_ok &= ours[f"match.{i}"].shape == ref.shape and bool((ours[f"match.{i}"] == ref).all())
    for k in sorted(losses):
        key = f"loss.{k}"
        if key in ours:
            rows.append((key, rel_err(ours[key], losses[k].detach())))
    rows.append(("loss.total", rel_err(ours["loss.total"], total.detach())))
    grad_worst, grad_name, n_grads = 0.0, "", 0
    for name, param in model.named_parameters():
        if not param.requires_grad:
            if f"grad.{name}" in ours:
                sys.exit(f"parity: {name} is frozen in the reference but detr-c wrote a gradient")
            continue
        ref = param.grad if param.grad is not None else torch.zeros_like(param)
        e = rel_err(ours[f"grad.{name}"], ref)
        n_grads += 1
        if e > grad_worst:
            grad_worst, grad_name = e, name
    rows.append((f"grad.* ({n_grads} parameters; worst {grad_name})", grad_worst))
    ours_trainable = sum(1 for k in ours if k.startswith("grad."))
    worst = max(e for _, e in rows)
    print(f"parity {args.preset} {size[0]}x{size[1]} padding={args.padding}:")
    for name, e in rows:
        print(f"  {name:60s} {e:.2e}")
    print(f"  matches identical: {match_ok}; trainable tensors: reference {n_grads}, detr-c {ours_trainable}")
    ok = match_ok and worst <= args.tol and n_grads == ours_trainable
    print("PASS" if ok else "FAIL", f"(worst relative error {worst:.2e}, tolerance {args.tol:.0e})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
