#!/usr/bin/python3
"""The reference DETR training step in PyTorch, for bench/compare_torch.sh and tools/gpu_bench.sh.

Builds the reference model (facebookresearch/detr, or Atten4Vis/ConditionalDETR with --decoder
conditional or a conditional-* preset; imported from --detr-repo as tools/parity_step.py does) at a
detr-c preset, and times forward + loss + backward + gradient clipping (0.1) + AdamW (lr 1e-4,
backbone 1e-5, weight decay 1e-4) on a fixed batch, dropout on. Prints one JSON line like
bench_step: median seconds and peak RSS; on CUDA also the GPU's name, torch.cuda's
max_memory_allocated and max_memory_reserved, and the device memory in use at the end
(torch.cuda.mem_get_info: every process, the CUDA context and the libraries' workspaces included).

The batch: --batch-file (a `detr step` batch file), else --batch random images of --hw (or
--size x --size) with --boxes targets each. The weights: --weights (reference names, as `detr
step --weights` reads them), else the seeded initialisation of tools/parity_step.py (seed 1).
--write-weights FILE and --write-batch B:HxW:FILE (repeatable; random images as above, --boxes
targets each) write them for detr-c (tools/gpu_bench.sh) and exit.

--math fp32: TF32 off for matmuls and cuDNN; tf32: matmul TF32 on and cuDNN's default (TF32 on).
cudnn.benchmark stays off (PyTorch's default).
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import parity_step  # noqa: E402


def make_batch(p, B, H, W, boxes, seed=7):
    """B random images of H x W (no padding) and `boxes` random targets each."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(B, 3, H, W, generator=g)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    targets = []
    for _ in range(B):
        cxcy = torch.rand(boxes, 2, generator=g) * 0.6 + 0.2
        wh = torch.rand(boxes, 2, generator=g) * 0.2 + 0.1
        labels = torch.randint(0, p["classes"], (boxes,), generator=g)
        targets.append({"boxes": torch.cat([cxcy, wh], 1), "labels": labels})
    return images, mask, targets


def read_batch(path):
    t = parity_step.read_safetensors(path)
    images, mask = torch.from_numpy(t["images"].copy()), torch.from_numpy(t["mask"].astype(bool))
    targets = [{"boxes": torch.from_numpy(t[f"targets.{i}.boxes"].copy()),
                "labels": torch.from_numpy(t[f"targets.{i}.labels"].copy())} for i in range(images.shape[0])]
    return images, mask, targets


def write_batch(path, images, mask, targets):
    batch = {"images": images.numpy(), "mask": mask.numpy().astype(np.uint8)}
    for i, t in enumerate(targets):
        batch[f"targets.{i}.boxes"] = t["boxes"].numpy()
        batch[f"targets.{i}.labels"] = t["labels"].numpy()
    parity_step.write_safetensors(path, batch)


def has_attr(obj, name):
    try:  # torch.backends.cuda.matmul raises AssertionError for a name it does not know
        getattr(obj, name)
        return True
    except (AttributeError, AssertionError):
        return False


def set_math(math):
    """TF32 on or off for matmuls and cuDNN convolutions; returns the settings as read back. PyTorch
    2.9 and later: the fp32_precision settings ("tf32" / "ieee"; mixing them with the older
    allow_tf32 flags is refused); earlier: allow_tf32."""
    tf32 = math == "tf32"
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if has_attr(matmul, "fp32_precision") and has_attr(conv, "fp32_precision"):
        matmul.fp32_precision = conv.fp32_precision = "tf32" if tf32 else "ieee"
        return f"matmul {matmul.fp32_precision}, cudnn conv {conv.fp32_precision}"
    matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    return f"matmul allow_tf32 {matmul.allow_tf32}, cudnn allow_tf32 {torch.backends.cudnn.allow_tf32}"


def legacy_pretrained():
    """The reference builds its ResNet with `pretrained=False`, which torchvision deprecated in 0.13
    for `weights=None`: where the builders take `weights`, `pretrained` is turned into it."""
    import inspect

    import torchvision

    for name in ("resnet18", "resnet34", "resnet50", "resnet101"):
        build = getattr(torchvision.models, name)
        if "weights" not in inspect.signature(build).parameters:
            return

        def wrapped(*a, _build=build, pretrained=False, **k):
            if pretrained:
                raise ValueError("torch_step: pretrained weights are never downloaded here")
            return _build(*a, weights=None, **k)

        setattr(torchvision.models, name, wrapped)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detr-repo", required=True)
    ap.add_argument("--preset", default="detr-r18-small", choices=sorted(parity_step.PRESETS))
    ap.add_argument("--decoder", default=None, choices=["detr", "conditional"], help="default: the preset's")
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--hw", default=None, help="HxW (default --size x --size)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--math", default="fp32", choices=["fp32", "tf32"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: the forward and loss under torch.autocast(device, dtype=torch.bfloat16)")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--batch-file", default=None)
    ap.add_argument("--write-weights", default=None)
    ap.add_argument("--write-batch", action="append", default=[], metavar="B:HxW:FILE")
    args = ap.parse_args()
    args.h, args.w = (int(v) for v in args.hw.split("x")) if args.hw else (args.size, args.size)
    return args


def build(args, p, decoder):
    """The reference model (weights from --weights, else the seed), its criterion, weights and AdamW."""
    model, criterion, weight_dict = parity_step.build_reference(args.detr_repo, p, 1, decoder)
    if args.weights:
        state = {k: torch.from_numpy(v.copy()) for k, v in parity_step.read_safetensors(args.weights).items()}
        model.load_state_dict(state)
    model.to(args.device)
    criterion.to(args.device)
    model.train()
    groups = [
        {"params": [q for n, q in model.named_parameters() if "backbone" not in n and q.requires_grad]},
        {"params": [q for n, q in model.named_parameters() if "backbone" in n and q.requires_grad], "lr": 1e-5},
    ]
    return model, criterion, weight_dict, torch.optim.AdamW(groups, lr=1e-4, weight_decay=1e-4)


def time_steps(args, model, criterion, weight_dict, opt, images, mask, targets):
    """Seconds of each of --reps steps after one warm-up step."""
    from util.misc import NestedTensor

    cuda = args.device == "cuda"
    times, first_loss = [], None
    for r in range(-1, args.reps):
        t0 = time.perf_counter()
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):  # mixed precision
            outputs = model(NestedTensor(images, mask))
            losses = criterion(outputs, targets)
            total = sum(losses[k] * weight_dict[k] for k in losses if k in weight_dict)
        if r < 0:
            first_loss = total.item()  # as bench_step: the warm-up step's loss
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if r >= 0:
            times.append(time.perf_counter() - t0)
    return times, first_loss


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    p = parity_step.PRESETS[args.preset]
    decoder = args.decoder or p.get("decoder", "detr")
    legacy_pretrained()
    if args.write_weights or args.write_batch:
        if args.write_weights:
            model, _, _ = parity_step.build_reference(args.detr_repo, p, 1, decoder)
            parity_step.write_safetensors(args.write_weights, {k: v.detach().numpy() for k, v in model.state_dict().items()})
        for spec in args.write_batch:
            b, hw, path = spec.split(":", 2)
            h, w = (int(v) for v in hw.split("x"))
            write_batch(path, *make_batch(p, int(b), h, w, args.boxes))
        return
    math = set_math(args.math) if args.device == "cuda" else "cpu"
    model, criterion, weight_dict, opt = build(args, p, decoder)
    images, mask, targets = (read_batch(args.batch_file) if args.batch_file
                             else make_batch(p, args.batch, args.h, args.w, args.boxes))
    images, mask = images.to(args.device), mask.to(args.device)
    targets = [{k: v.to(args.device) for k, v in t.items()} for t in targets]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, first_loss = time_steps(args, model, criterion, weight_dict, opt, images, mask, targets)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    B, _, H, W = images.shape
    row = {"impl": "pytorch-" + torch.__version__.split("+")[0], "preset": args.preset, "decoder": decoder,
           "size": args.size, "hw": f"{H}x{W}", "batch": B, "enact": False, "precision": args.precision,
           "tf32": args.device == "cuda" and args.math == "tf32", "median_s": round(sorted(times)[len(times) // 2], 4), "first_loss": round(first_loss, 6),
           "peak_rss_mb": round(peak_mb, 1), "steps_s": [round(t, 4) for t in times], "torch": torch.__version__}
    if args.device == "cuda":
        free, total = torch.cuda.mem_get_info()
        row.update({"device": "cuda", "gpu": torch.cuda.get_device_name(),
                    "max_memory_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
                    "max_memory_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20, 1),
                    "device_used_mb": round((total - free) / 2**20, 1), "device_total_mb": round(total / 2**20, 1),
                    "cudnn": torch.backends.cudnn.version(), "math": math})
    print(json.dumps(row))


if __name__ == "__main__":
    main()
