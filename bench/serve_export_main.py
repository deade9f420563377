#!/usr/bin/python3
"""The main job's model in PyTorch and ONNX, for bench/serve_compare.sh --checkpoint: so that ONNX Runtime
and PyTorch are timed beside detr-c on a detr-c checkpoint, as serve_export.py makes that possible for the
reference presets. Two steps, in two interpreters:

  /usr/bin/python3 bench/serve_export_main.py --checkpoint C --detr-repo CONDITIONAL_DETR_CHECKOUT \\
      [--picture FILE] [--height H --width W] [--batch 4] [--detr build-cpu/detr] --out DIR
  VENV/bin/python bench/serve_export_main.py --check-onnx DIR

The first (Debian's python3-torch 1.13) builds the checkpoint's model from its model_config with the
Conditional DETR checkout's own modules (tools/parity_step.py's build_reference at the config's sizes;
the reference has no narrow ResNet stopping early, so its backbone body becomes torchvision's
BasicBlocks at backbone_width channels stopping after backbone_layers stages, with the checkout's
FrozenBatchNorm2d, under the same names), puts ENACT (docs/enact.md; tools/parity_attention.py's
EnactAttention, written from that page) in place of every encoder self-attention when
encoder_attn=enact, and loads the checkpoint's tensors strictly: every name and shape, or it stops
(the optim.* tensors are the optimizer's state, not the model's). It then runs the picture (--picture,
any image file, else serve_check.py's synthetic one at --height x --width) and checks its detections
against `detr predict` on the same bytes by serve_check.py's rule (every one of the 100 best
(query, class) sigmoid scores within 1e-4, rank by rank, the same labels), or stops. Then it writes
into --out the ONNX exports of the inference forward for batch 1 and --batch (copies of the picture),
made as serve_export.py makes them (torch.onnx.export, opset 12, constant folding, input "inputs",
outputs "pred_logits" and "pred_boxes"), the picture as binary PPM (bench_serve --image) and as its
normalized tensor (serve_time.py --input), detr-c's detections and PyTorch's outputs.

ENACT's regions are fixed in the ONNX graphs. They depend on the data (runs of equal curvature sign of
each encoder layer's smoothed entropy map: how many, and where, change with the picture), and torch
1.13's tracer would record the region finding's Python loops as constants anyway. So the regions are
those the model finds on this picture (recorded in an eager forward) and each export clusters with them as a constant [L, N] assignment, through ops
opset 12 has (a softmax of the smoothed entropy masked to each region, then a matmul; the eager
module's scatters have none). The graphs therefore compute the model on this picture only (and on
copies of it): fine for timing on it, not a general export. The entropy, smoothing, cluster weights
and attention over the clusters are computed in the graph as in the model; only the region finding
(curvature sign and runs, which detr-c computes on each call) is not. The second step checks that
the graphs, in ONNX Runtime, give detr-c's detections on this picture (same rule, every image of the
batch), and counts the graphs' nodes (as exported, and after ONNX Runtime's optimisations) and
profiles one thread's run (time inside kernels against the run's time), to show whether ONNX Runtime
is bound by per-node overhead on this small model.
"""
import argparse
import json
import os
import re
import sys
import warnings
from collections import OrderedDict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

# The model_config keys this builder reads, and the values it builds (anything else stops it: a model
# it would build wrongly is worse than none). Keys that only matter in training are accepted as they are.
BUILT = {"decoder": {"conditional"}, "encoder_attn": {"enact", "dense"}, "backbone": {"18", "34"},
         "dilation": {"false"}, "pre_norm": {"false"}, "enact_1d": {"false"}, "enact_sign_factor": {"false"}}
SIZES = ("backbone_width", "backbone_layers", "hidden_dim", "nheads", "enc_layers", "dec_layers", "ffn_dim",
         "num_queries", "num_classes", "enact_sigma")
TRAINING_ONLY = ("train_backbone", "frozen_stages", "dropout", "aux_loss", "tf32", "bf16")  # eval: dropout off


def read_checkpoint(path):
    """(model_config as a dict of strings, the model's tensors as numpy) of a detr-c checkpoint."""
    import parity_step
    tensors, metadata = parity_step.read_safetensors(path, with_metadata=True)
    text = metadata.get("model_config")
    if text is None:
        sys.exit(f"serve_export_main: {path} has no model_config in its metadata: not a detr-c checkpoint")
    cfg = dict(line.split("=", 1) for line in text.splitlines() if line.strip())
    unknown = sorted(set(cfg) - set(BUILT) - set(SIZES) - set(TRAINING_ONLY))
    wrong = [f"{k}={cfg.get(k)}" for k, ok in BUILT.items() if cfg.get(k) not in ok]
    if unknown or wrong:
        sys.exit(f"serve_export_main: {path}: this builder does not build {', '.join(wrong + unknown)} "
                 f"(it builds {'; '.join(f'{k} in {sorted(v)}' for k, v in BUILT.items())})")
    return cfg, {k: v for k, v in tensors.items() if not k.startswith("optim.")}


def resnet_body(depth, width, stages, norm):
    """torchvision's ResNet-18/34 (its BasicBlock, conv1x1 downsampling, the stem's 7x7 and max pool) with
    `width` channels at the stem and layer1, doubling per stage, stopping after `stages` stages: detr-c's
    backbone_width / backbone_layers, under torchvision's module names. Returns (body, channels out)."""
    import torch.nn as nn
    from torchvision.models.resnet import BasicBlock, conv1x1
    blocks = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}[depth]
    mods = OrderedDict(conv1=nn.Conv2d(3, width, 7, 2, 3, bias=False), bn1=norm(width), relu=nn.ReLU(inplace=True),
                       maxpool=nn.MaxPool2d(3, 2, 1))
    inplanes = width
    for i in range(stages):
        planes, stride = width << i, 1 if i == 0 else 2
        layer = []
        for j in range(blocks[i]):
            down = None
            if j == 0 and (stride != 1 or inplanes != planes):
                down = nn.Sequential(conv1x1(inplanes, planes, stride), norm(planes))
            layer.append(BasicBlock(inplanes, planes, stride if j == 0 else 1, down, norm_layer=norm))
            inplanes = planes
        mods[f"layer{i + 1}"] = nn.Sequential(*layer)
    return nn.Sequential(mods), inplanes


def enact_module():
    """The ENACT encoder self-attention class (defined here so that the check step needs no torch)."""
    import torch
    import torch.nn.functional as F
    import parity_attention

    class EnactForExport(parity_attention.EnactAttention):
        """ENACT as parity_attention.EnactAttention computes it (regions from the layer's own smoothed
        entropy map, each call), plus a frozen form for tracing: after freeze(), the regions of the latest
        forward (one image's) are a constant [L, N] assignment and every image of a batch is clustered
        with them (so every image must be the picture they came from)."""

        def __init__(self, d, nhead, sigma):
            super().__init__(d, nhead, sigma)
            self.assign = None  # [L, N] bool, pixel n in region l, once frozen

        def freeze(self):
            starts, lengths = self.own_regions
            N = self.hw[0] * self.hw[1]
            assert int(starts.max()) < N, "freeze after a forward of one image"
            self.assign = torch.zeros(len(starts), N, dtype=torch.bool)
            for j, (s, n) in enumerate(zip(starts, lengths)):
                self.assign[j, s:s + n] = True

        def attend(self, q_in, k_in, v_in, valid):
            if self.assign is None:
                return super().attend(q_in, k_in, v_in, valid)
            # The smoothed entropy Hsm, as EnactAttention.attend computes it.
            B, N, d = k_in.shape
            H, W = self.hw
            fvalid = valid.to(k_in.dtype)
            p = self.W_prob(k_in).squeeze(-1).masked_fill(~valid, float("-inf")).softmax(dim=1)
            hmap = (-p * torch.log2(p + 1e-8) * fvalid).reshape(B, 1, H, W)
            taps = parity_attention.gaussian_taps(self.sigma, k_in.dtype)
            r = taps.numel() // 2
            m = F.conv2d(hmap, taps.reshape(1, 1, 1, -1), padding=(0, r))  # along rows
            hsm = F.conv2d(m, taps.reshape(1, 1, -1, 1), padding=(r, 0)).reshape(B, N) * fvalid  # then columns
            # Each region's K' = sum_i softmax(Hsm)_i K_i over its pixels (V' the same): a masked softmax
            # and a matmul, docs/enact.md's clustering in its dense form.
            w = hsm[:, None, :].masked_fill(~self.assign, float("-inf")).softmax(dim=-1)  # [B, L, N]
            kc, vc = w @ k_in, w @ v_in
            # Multi-head attention of every pixel over the L clusters (no mask: every image has all L).
            h, hd, L = self.num_heads, d // self.num_heads, kc.shape[1]
            q = self.proj(q_in, 0).reshape(B, N, h, hd).transpose(1, 2)
            k = self.proj(kc, 1).reshape(B, L, h, hd).transpose(1, 2)
            v = self.proj(vc, 2).reshape(B, L, h, hd).transpose(1, 2)
            attn = ((q * hd ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
            return (attn @ v).transpose(1, 2).reshape(B, N, d)

    return EnactForExport


def build_model(repo, checkpoint):
    """The checkpoint's model in eval mode, its weights loaded strictly; returns (model, config, ENACT modules)."""
    import torch
    import torch.nn as nn
    import parity_step
    cfg, tensors = read_checkpoint(checkpoint)
    i = {k: int(float(cfg[k])) for k in SIZES if k != "enact_sigma"}
    p = dict(backbone="resnet18", hidden=i["hidden_dim"], heads=i["nheads"], enc=i["enc_layers"], dec=i["dec_layers"],
             ffn=i["ffn_dim"], queries=i["num_queries"], classes=i["num_classes"])
    model, _, _ = parity_step.build_reference(repo, p, 0, "conditional")  # the checkout's modules, at these sizes
    from torchvision.models._utils import IntermediateLayerGetter
    from models.backbone import FrozenBatchNorm2d  # the checkout's (eps 1e-5)
    width = i["backbone_width"] or 64  # detr-c: 0 is torchvision's 64
    body, channels = resnet_body(int(cfg["backbone"]), width, i["backbone_layers"], FrozenBatchNorm2d)
    backbone = model.backbone[0]
    backbone.body = IntermediateLayerGetter(body, {f"layer{i['backbone_layers']}": "0"})
    backbone.num_channels = channels
    model.input_proj = nn.Conv2d(channels, p["hidden"], kernel_size=1)
    mods = []
    if cfg["encoder_attn"] == "enact":
        Enact = enact_module()
        for layer in model.transformer.encoder.layers:
            layer.self_attn = Enact(p["hidden"], p["heads"], float(cfg["enact_sigma"]))
            mods.append(layer.self_attn)

        def set_hw(_module, inputs):  # the feature map's size, which ENACT's 2-D filters need
            for m in mods:
                m.hw = tuple(inputs[0].shape[-2:])
        model.transformer.register_forward_pre_hook(set_hw)
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    shapes = [f"{k} {list(tensors[k].shape)} (model {list(own[k].shape)})" for k in own
              if k in tensors and tuple(tensors[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        sys.exit(f"serve_export_main: {checkpoint} does not fit the model built from its model_config:\n"
                 f"  missing in the checkpoint: {missing}\n  not in the model: {unexpected}\n  shapes: {shapes}")
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}, strict=True)
    model.eval()
    model.aux_loss = False  # the last decoder layer's outputs only (detr-c computes every layer's heads)
    return model, cfg, mods


def forward(model, x):
    """(pred_logits, pred_boxes) of the normalized images x [B, 3, H, W], as numpy."""
    import torch
    with torch.no_grad():
        out = model(x)
    return out["pred_logits"].numpy(), out["pred_boxes"].numpy()


def freeze_on(model, mods, x):
    """Runs the picture x [1, 3, H, W] and fixes each ENACT layer's regions to the ones it found; returns
    each layer's region count."""
    forward(model, x)
    for m in mods:
        m.freeze()
    return [int(m.assign.shape[0]) for m in mods]


def load_picture(args):
    """H x W x 3 bytes: --picture (decoded by PIL), else serve_check.py's synthetic picture."""
    import serve_check
    from PIL import Image
    if args.picture:
        img = np.array(Image.open(args.picture).convert("RGB"))
        if (args.height or img.shape[0]) != img.shape[0] or (args.width or img.shape[1]) != img.shape[1]:
            sys.exit(f"serve_export_main: {args.picture} is {img.shape[0]}x{img.shape[1]}, not "
                     f"{args.height}x{args.width} (--height x --width)")
        return img
    if not args.height or not args.width:
        sys.exit("serve_export_main: --picture, or --height and --width for the synthetic picture")
    return serve_check.picture(args.height, args.width)


def box_difference(dets, picks, boxes, w, h):
    """Largest |difference| in pixels between detr-c's boxes and the reference's for the same picks."""
    worst = 0.0
    for d, (_, _, q) in zip(dets, picks):
        cx, cy, bw, bh = (float(v) for v in boxes[q])
        ref = [(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h]
        worst = max(worst, max(abs(a - b) for a, b in zip(d["box"], ref)))
    return worst


def export(args):
    import torch
    import serve_check
    from PIL import Image
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # tracing fixes shapes: expected here
    img = load_picture(args)
    h, w = img.shape[:2]
    model, cfg, mods = build_model(args.detr_repo, args.checkpoint)
    x = serve_check.normalized(img)

    # PyTorch (ENACT's regions found on the picture, as the model does) against `detr predict`.
    logits, boxes = forward(model, x)
    dets = serve_check.detr_predict(args.detr, img, ["--checkpoint", args.checkpoint])
    picks = serve_check.sigmoid_picks(logits[0])
    ok, ds, labels = serve_check.compare(dets, picks, args.tol)
    print(f"serve_export_main: PyTorch against detr predict on the {h}x{w} picture: {len(dets)} detections, max "
          f"|score difference| {ds:.3g}, labels equal {labels}/{len(picks)}, max |box difference| "
          f"{box_difference(dets, picks, boxes[0], w, h):.3g} px (detr-c's JSON has 2 decimals)", file=sys.stderr)
    if not ok:
        sys.exit("serve_export_main: detr-c and the PyTorch model disagree on the checkpoint: nothing exported")

    # Regions fixed to the picture's: the same outputs, then the exports.
    counts = freeze_on(model, mods, x)
    flogits, fboxes = forward(model, x)
    print(f"serve_export_main: ENACT regions on the picture per encoder layer: {counts} (of "
          f"{mods[0].hw[0] * mods[0].hw[1] if mods else 0} pixels); frozen against found: max |logit difference| "
          f"{np.abs(flogits - logits).max():.3g}, max |box difference| {np.abs(fboxes - boxes).max():.3g}",
          file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    for b in sorted({1, args.batch}):
        path = os.path.join(args.out, f"model_b{b}.onnx")
        with torch.no_grad():
            torch.onnx.export(model, x.repeat(b, 1, 1, 1), path, do_constant_folding=True, opset_version=12,
                              input_names=["inputs"], output_names=["pred_logits", "pred_boxes"])
        print(f"serve_export_main: {path}", file=sys.stderr)
    Image.fromarray(img).save(os.path.join(args.out, "picture.ppm"))  # binary P6
    np.save(os.path.join(args.out, "picture.npy"), x.numpy())
    np.savez(os.path.join(args.out, "torch_out.npz"), pred_logits=flogits, pred_boxes=fboxes)
    with open(os.path.join(args.out, "detr-c.json"), "w") as f:
        json.dump({"checkpoint": args.checkpoint, "height": h, "width": w, "tol": args.tol,
                   "enact_regions": counts, "detections": dets}, f)


def ort_profile(path, x, runs=20):
    """One thread, `runs` runs after a warm-up with ONNX Runtime's profiler: (mean run time, mean time
    inside node kernels, nodes run per run), in seconds."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(os.path.dirname(path), "ort_profile")
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        s.run(None, {"inputs": x})
    events = json.load(open(s.end_profiling()))
    run = [e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][1:]
    kernels = [e["dur"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = len(kernels) // (runs + 1)
    kernel = sum(kernels[per_run:]) / runs  # the warm-up run's nodes first
    return sum(run) / len(run) * 1e-6, kernel * 1e-6, per_run


def check_onnx(work):
    """ONNX Runtime on the exports against detr-c's detections on the picture, every image of each batch."""
    import glob
    import onnx
    import onnxruntime as ort
    import serve_check
    ref = json.load(open(os.path.join(work, "detr-c.json")))
    x = np.load(os.path.join(work, "picture.npy"))
    torch_out = np.load(os.path.join(work, "torch_out.npz"))
    ok = True
    exports = [p for p in glob.glob(os.path.join(work, "model_b*.onnx")) if re.fullmatch(r"model_b\d+\.onnx", os.path.basename(p))]
    for path in sorted(exports):
        b = int(os.path.basename(path)[len("model_b"):-len(".onnx")])
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.log_severity_level = 3  # not the warning that the optimised graph is for this machine: it is only counted
        so.optimized_model_filepath = os.path.join(work, f"ort_optimized_b{b}.onnx")  # ONNX Runtime's graph, to count
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        logits, boxes = s.run(["pred_logits", "pred_boxes"], {"inputs": np.repeat(x, b, axis=0)})
        worst_ds, worst_labels = 0.0, len(ref["detections"])
        for i in range(b):
            good, ds, labels = serve_check.compare(ref["detections"], serve_check.sigmoid_picks(logits[i]), ref["tol"])
            ok &= good
            worst_ds, worst_labels = max(worst_ds, ds), min(worst_labels, labels)
        nodes = len(onnx.load(path).graph.node)
        optimized = len(onnx.load(so.optimized_model_filepath).graph.node)
        print(f"serve_export_main: ONNX Runtime {ort.__version__} batch {b} against detr-c on the picture: max |score "
              f"difference| {worst_ds:.3g}, labels equal {worst_labels}/{len(ref['detections'])} (worst image); "
              f"against PyTorch: max |logit difference| {np.abs(logits - torch_out['pred_logits']).max():.3g}; "
              f"graph nodes {nodes} exported, {optimized} after ONNX Runtime's optimisations", file=sys.stderr)
        if b == 1:
            run, kernel, per_run = ort_profile(path, x)
            print(f"serve_export_main: ONNX Runtime profile, batch 1, 1 thread: {run * 1e3:.2f} ms a run, "
                  f"{kernel * 1e3:.2f} ms inside {per_run} node kernels ({kernel / run:.0%}; the profiler slows "
                  f"each run and node: serve_time.py's latency is the unprofiled one)", file=sys.stderr)
    if not ok:
        sys.exit("serve_export_main: the ONNX graphs and detr-c disagree on the picture")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-onnx", metavar="DIR", help="the second step: ONNX Runtime on DIR's exports")
    ap.add_argument("--checkpoint", help="a detr-c checkpoint (its model_config and weights)")
    ap.add_argument("--detr-repo", help="a checkout of Atten4Vis/ConditionalDETR")
    ap.add_argument("--picture", help="an image file (default: serve_check.py's synthetic picture)")
    ap.add_argument("--height", type=int, default=0)
    ap.add_argument("--width", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--detr", default="build-cpu/detr")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--out", help="where the exports go (outside the repository)")
    args = ap.parse_args()
    if args.check_onnx:
        return check_onnx(args.check_onnx)
    if not (args.checkpoint and args.detr_repo and args.out):
        ap.error("--checkpoint, --detr-repo and --out (or --check-onnx DIR)")
    export(args)


if __name__ == "__main__":
    main()
