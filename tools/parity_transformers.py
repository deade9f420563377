#!/usr/bin/env python3
"""Parity of detr-c with Hugging Face transformers' DETR and Conditional DETR (docs/ecosystem.md).

Environment: a virtual environment outside the repository (PyPI's default wheels, which bring
CUDA's libraries, or PyTorch's CPU wheels: either runs on the CPU). Nothing is downloaded from the
hub: the models are built from their configs with random weights. About 25 minutes on 2 cores.

    python3 -m venv ~/venv-hf
    ~/venv-hf/bin/pip install torch==2.5.1 torchvision==0.20.1 'transformers==4.57.*' timm \
        safetensors scipy pillow
    ~/venv-hf/bin/python tools/parity_transformers.py --detr build/detr [--models detr-r50,...]

For each model (DETR-R50 with timm's and transformers' ResNet, DETR-R50-DC5, Conditional DETR-R50)
it builds a randomly initialised transformers model (use_pretrained_backbone=False; the frozen batch
norms get random statistics around their inputs' own, so the backbone is not the identity), saves
it with save_pretrained, and on three pictures of different aspect ratios compares:
  - logits and boxes: transformers' forward against `detr step --weights model.safetensors` on
    the same pixel_values (the image processor's);
  - one training step on two made-up targets: the loss terms of the last decoder layer and the
    gradients of every trainable tensor, relative (transformers' terms weighed as the reference
    weighs them, backward, against `detr step` with aux_loss=false: transformers' auxiliary loss
    and its Conditional DETR class weight are not the reference's, docs/ecosystem.md); the
    gradients are matched by names written here independently of nn/hf_names.c;
  - detections: transformers' image processor, forward and post_process_object_detection against
    `detr predict --weights model.safetensors` (its own resize and normalization), paired by query
    (and label, for Conditional DETR's top-100 (query, class) pairs);
  - the folder `detr export --format transformers` writes, loaded back with from_pretrained: its
    logits and boxes against the original model's.
Passes when boxes differ by at most 1e-4 of the image's longer side and scores by at most 1e-4, and
the exported model gives the same floats; the logits, loss and gradient differences are printed.
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
from safetensors.torch import load_file, save_file
from transformers import (ConditionalDetrConfig, ConditionalDetrForObjectDetection, ConditionalDetrImageProcessor,
                          DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig)

# name: (detr-c preset, transformers' architecture, config keywords, detr export's --backbone)
MODELS = {
    "detr-r50": ("detr-r50", "detr", dict(use_timm_backbone=True, backbone="resnet50"), "timm"),
    "detr-r50-no_timm": ("detr-r50", "detr",
                         dict(use_timm_backbone=False, backbone=None,
                              backbone_config=ResNetConfig(out_features=["stage4"])), "resnet"),
    "detr-r50-dc5": ("detr-r50-dc5", "detr", dict(use_timm_backbone=True, backbone="resnet50", dilation=True), "timm"),
    "conditional-detr-r50": ("conditional-detr-r50", "conditional",
                             dict(use_timm_backbone=True, backbone="resnet50"), "timm"),
}
SIZES = [(480, 640), (640, 480), (512, 900)]  # height, width
TOL = 1e-4


def build(kind, kw, seed):
    torch.manual_seed(seed)
    common = dict(use_pretrained_backbone=False, num_labels=91, **kw)
    if kind == "detr":
        model = DetrForObjectDetection(DetrConfig(**common))
    else:
        model = ConditionalDetrForObjectDetection(ConditionalDetrConfig(**common))
    model.eval()
    with torch.no_grad():  # heads that separate classes and spread boxes (the default init keeps both near flat)
        model.class_labels_classifier.weight.normal_(0, 0.2 if kind == "detr" else 0.05)
        model.bbox_predictor.layers[-1].weight.normal_(0, 0.05)
    return model


def frozen_bns(model):
    return [m for m in model.modules() if type(m).__name__.endswith("FrozenBatchNorm2d")]


def calibrate_bn(model, pixel_values, seed):
    """Random statistics near each frozen batch norm's input's own: a non-trivial backbone whose
    activations stay in range through 50 layers."""
    g = torch.Generator().manual_seed(seed)
    hooks = []

    def pre_hook(bn, args):
        x = args[0]
        mean, var = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3))
        c = mean.numel()
        bn.running_mean.copy_(mean + 0.2 * var.sqrt() * torch.randn(c, generator=g))
        bn.running_var.copy_(var * (0.5 + torch.rand(c, generator=g)))
        bn.weight.copy_(0.5 + torch.rand(c, generator=g))
        bn.bias.copy_(0.2 * torch.randn(c, generator=g))

    for bn in frozen_bns(model):
        hooks.append(bn.register_forward_pre_hook(pre_hook))
    with torch.no_grad():
        model(pixel_values=pixel_values)
    for h in hooks:
        h.remove()


def make_images(folder, seed, sizes):
    rng = np.random.default_rng(seed)
    paths = []
    for i, (h, w) in enumerate(sizes):
        y, x = np.mgrid[0:h, 0:w]
        img = np.zeros((h, w, 3))
        for c in range(3):  # smooth waves, a few rectangles and noise: shapes at several scales
            fx, fy, ph = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.3)]
            img[..., c] = 127 + 80 * np.sin(x * fx + y * fy + ph)
        for _ in range(6):
            x0, y0 = rng.integers(0, w - 60), rng.integers(0, h - 60)
            img[y0:y0 + rng.integers(30, h // 2), x0:x0 + rng.integers(30, w // 2)] = rng.uniform(0, 255, 3)
        img += rng.normal(0, 8, img.shape)
        path = os.path.join(folder, f"img{i}_{h}x{w}.png")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


BB = "model.backbone.conv_encoder.model."
DECODER_PARTS = {"norm1": "self_attn_layer_norm", "norm2": "encoder_attn_layer_norm", "norm3": "final_layer_norm",
                 "multihead_attn": "encoder_attn", "cross_attn": "encoder_attn", "linear1": "fc1", "linear2": "fc2"}
ENCODER_PARTS = {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm", "linear1": "fc1", "linear2": "fc2"}


def hf_names(name, backbone):
    """transformers' names of a detr-c (reference) tensor: one, or q, k, v for a packed in_proj."""
    import re
    if name.startswith("backbone.0.body."):
        rest = name[len("backbone.0.body."):]
        if backbone == "timm":
            return [BB + rest]
        m = re.fullmatch(r"(conv|bn)1\.(\w+)", rest)
        if m:
            return [BB + "embedder.embedder." + ("convolution." if m[1] == "conv" else "normalization.") + m[2]]
        m = re.fullmatch(r"layer(\d+)\.(\d+)\.(conv|bn)(\d)\.(\w+)", rest)
        if m:
            part = "convolution" if m[3] == "conv" else "normalization"
            return [f"{BB}encoder.stages.{int(m[1]) - 1}.layers.{m[2]}.layer.{int(m[4]) - 1}.{part}.{m[5]}"]
        m = re.fullmatch(r"layer(\d+)\.(\d+)\.downsample\.([01])\.(\w+)", rest)
        part = "convolution" if m[3] == "0" else "normalization"
        return [f"{BB}encoder.stages.{int(m[1]) - 1}.layers.{m[2]}.shortcut.{part}.{m[4]}"]
    for ours, theirs in (("input_proj.", "model.input_projection."), ("query_embed.", "model.query_position_embeddings."),
                         ("class_embed.", "class_labels_classifier."), ("bbox_embed.", "bbox_predictor."),
                         ("transformer.decoder.norm.", "model.decoder.layernorm."),
                         ("transformer.decoder.query_scale.", "model.decoder.query_scale."),
                         ("transformer.decoder.ref_point_head.", "model.decoder.ref_point_head.")):
        if name.startswith(ours):
            return [theirs + name[len(ours):]]
    m = re.fullmatch(r"transformer\.(encoder|decoder)\.layers\.(\d+)\.(\w+)\.(.+)", name)
    parts = ENCODER_PARTS if m[1] == "encoder" else DECODER_PARTS
    head, rest = parts.get(m[3], m[3]), m[4]
    prefix = f"model.{m[1]}.layers.{m[2]}.{head}."
    if rest.startswith("in_proj_"):
        return [f"{prefix}{x}_proj.{rest[len('in_proj_'):]}" for x in "qkv"]
    return [prefix + rest]


def grad_difference(step, model, backbone):
    """The largest relative difference of a tensor's gradients, |ours - theirs| / |theirs| (2-norms
    over the tensor), and the tensor, over the tensors whose gradient is at least 1e-6 of the
    largest one's; then the same over the smaller ones down to 1e-10 of it, and how many are below
    that, rounding noise on both sides (softmax ignores a constant added to a row's logits, so a key
    bias's gradient is 0 in exact arithmetic; a random model's near-uniform decoder self-attention
    gives its query and key projections gradients that cancel to 1e-10 of the largest)."""
    params = dict(model.named_parameters())
    pairs = []
    for key, ours in step.items():
        if not key.startswith("grad."):
            continue
        names = hf_names(key[len("grad."):], backbone)
        if all(params[n].grad is None for n in names):
            continue
        theirs = torch.cat([params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])
                            for n in names])
        pairs.append((key[len("grad."):], ours, theirs))
    top = max(float(t.norm()) for _, _, t in pairs)
    worst = {True: (0.0, ""), False: (0.0, "")}  # by: at least 1e-6 of the largest
    noise = 0
    for name, ours, theirs in pairs:
        scale = float(theirs.norm())
        if scale < 1e-10 * top:
            noise += 1
            continue
        d = float((ours - theirs).norm()) / scale
        big = scale >= 1e-6 * top
        if d > worst[big][0]:
            worst[big] = (d, name)
    return worst[True], worst[False], noise


def detr_step(detr, preset, weights, pixel_values, targets, folder):
    batch = {"images": pixel_values.contiguous(), "mask": torch.zeros(pixel_values.shape[0], *pixel_values.shape[2:],
                                                                       dtype=torch.uint8)}
    for i, t in enumerate(targets):
        batch[f"targets.{i}.boxes"] = t["boxes"].contiguous()
        batch[f"targets.{i}.labels"] = t["class_labels"].to(torch.int64)
    bpath, opath = os.path.join(folder, "batch.safetensors"), os.path.join(folder, "step.safetensors")
    save_file(batch, bpath)
    run([detr, "step", "--config", preset, "--set", "aux_loss=false", "--weights", weights, "--batch", bpath, "--out",
         opath, "--no-dropout"])
    return load_file(opath)


def hf_detections(processor, kind, outputs, h, w):
    r = processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=[(h, w)])[0]
    if kind == "detr":  # one per query, in query order
        queries = list(range(len(r["scores"])))
    else:  # recover each pair's query as post_process_object_detection picked it
        prob = outputs.logits.sigmoid().view(1, -1)
        idx = torch.topk(prob, min(100, prob.shape[1]), dim=1).indices[0]
        queries = (idx // outputs.logits.shape[2]).tolist()
    return {(q, int(l)): (float(s), b.tolist()) for q, l, s, b in zip(queries, r["labels"], r["scores"], r["boxes"])}


def compare_detections(hf, ours, kind, size):
    """Max box difference / longer side, max score difference; pairs by query (and label)."""
    box_d = score_d = 0.0
    unpaired = []
    for key, (s, b) in hf.items():
        if key not in ours:
            unpaired.append((key, s))
            continue
        s2, b2 = ours[key]
        score_d = max(score_d, abs(s - s2))
        box_d = max(box_d, max(abs(u - v) for u, v in zip(b, b2)) / size)
    # Conditional DETR's top 100 of 27300 scores: a pair at the cut may be the 101st on the other side.
    low = min(s for s, _ in hf.values())
    bad = [u for u in unpaired if kind == "detr" or u[1] > low + TOL]
    return box_d, score_d, len(unpaired), bad


def loss_terms(kind, outputs):
    d = outputs.loss_dict
    return {"ce": float(d["loss_ce"]), "bbox": float(d["loss_bbox"]), "giou": float(d["loss_giou"])}


def step_terms(step):
    names = {k[len("loss."):]: float(v) for k, v in step.items() if k.startswith("loss.") and v.numel() == 1}
    pick = lambda *c: next((names[n] for n in c if n in names), float("nan"))
    return {"ce": pick("loss_ce", "ce"), "bbox": pick("loss_bbox", "bbox"), "giou": pick("loss_giou", "giou")}


def check_model(name, args, work):
    preset, kind, kw, backbone = MODELS[name]
    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    Proc = DetrImageProcessor if kind == "detr" else ConditionalDetrImageProcessor
    processor = Proc()  # shortest_edge 800, longest_edge 1333, ImageNet mean and std
    images = make_images(folder, args.seed, args.sizes)
    model = build(kind, kw, args.seed)
    calibrate_bn(model, processor(images=Image.open(images[0]).convert("RGB"), return_tensors="pt")["pixel_values"],
                 args.seed)
    hf_dir = os.path.join(folder, "hf")
    model.save_pretrained(hf_dir)
    weights = os.path.join(hf_dir, "model.safetensors")
    exp_dir = os.path.join(folder, "exported")
    run([args.detr, "export", "--format", "transformers", "--weights", weights, "--config", preset, "--backbone",
         backbone, exp_dir])
    exported = (DetrForObjectDetection if kind == "detr" else ConditionalDetrForObjectDetection).from_pretrained(
        exp_dir).eval()
    pred_dir = os.path.join(folder, "pred")
    run([args.detr, "predict", "--weights", weights, "--config", preset, "--threshold", "0", "--out", pred_dir,
         "--threads", str(args.threads)] + images)
    preds = json.load(open(os.path.join(pred_dir, "predictions.json")))
    rows = []
    g = torch.Generator().manual_seed(args.seed)
    for path, pr in zip(images, preds):
        pil = Image.open(path).convert("RGB")
        w, h = pil.size
        enc = processor(images=pil, return_tensors="pt")
        targets = [{"class_labels": torch.randint(1, 91, (2,), generator=g),
                    "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.4, 0.5]])}]
        model.zero_grad(set_to_none=True)
        out = model(pixel_values=enc["pixel_values"], pixel_mask=enc["pixel_mask"], labels=targets)
        # The reference's total: transformers weighs Conditional DETR's class term 1, not its
        # cls_loss_coefficient (2, the reference's cls_loss_coef); DETR's weights are the reference's.
        d = out.loss_dict
        total = (1 if kind == "detr" else 2) * d["loss_ce"] + 5 * d["loss_bbox"] + 2 * d["loss_giou"]
        total.backward()
        with torch.no_grad():
            out_exp = exported(pixel_values=enc["pixel_values"], pixel_mask=enc["pixel_mask"])
        step = detr_step(args.detr, preset, weights, enc["pixel_values"], targets, folder)
        logit_d = float((step["pred_logits"] - out.logits).abs().max())
        rawbox_d = float((step["pred_boxes"] - out.pred_boxes).abs().max())
        ours_terms, hf_terms = step_terms(step), loss_terms(kind, out)
        loss_d = max(abs(ours_terms[k] - hf_terms[k]) / abs(hf_terms[k]) for k in hf_terms)  # relative
        loss_d = max(loss_d, abs(float(step["loss.total"]) - float(total)) / abs(float(total)))
        (grad_d, grad_where), (small_d, small_where), noise = grad_difference(step, model, backbone)
        exp_d = max(float((out_exp.logits - out.logits).abs().max()),
                    float((out_exp.pred_boxes - out.pred_boxes).abs().max()))
        hf = hf_detections(processor, kind, out, h, w)
        ours = {(d["query"], d["label"]): (d["score"], d["box"]) for d in pr["detections"]}
        box_d, score_d, n_unpaired, bad = compare_detections(hf, ours, kind, max(w, h))
        resized = tuple(enc["pixel_values"].shape[2:])
        ok = box_d <= TOL and score_d <= TOL and not bad and exp_d == 0.0
        rows.append((os.path.basename(path), resized, logit_d, rawbox_d, loss_d, grad_d, box_d, score_d, n_unpaired,
                     exp_d, ok))
        print(f"{name:22s} {os.path.basename(path):18s} resized {resized[0]}x{resized[1]}  logits {logit_d:.2e}  "
              f"boxes {rawbox_d:.2e}  loss {loss_d:.2e}  grads {grad_d:.1e}  detections: box/size {box_d:.2e} "
              f"score {score_d:.2e} unpaired {n_unpaired}  exported {exp_d:.1e}  {'ok' if ok else 'FAIL'}", flush=True)
        if args.verbose:
            print(f"    loss terms: transformers {hf_terms}, the reference's total {float(total):.7g} (transformers' "
                  f"own {float(out.loss):.7g});  detr-c {ours_terms} total {float(step['loss.total']):.7g}; "
                  f"largest gradient difference in {grad_where}; below 1e-6 of the largest gradient "
                  f"{small_d:.1e} in {small_where}; {noise} tensors below 1e-10 of it")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--detr", default="build/detr", help="the detr binary")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=None, help="folder for the models and outputs (default: a temporary one)")
    ap.add_argument("--sizes", default=",".join(f"{h}x{w}" for h, w in SIZES),
                    help="the pictures' sizes, HEIGHTxWIDTH, comma-separated")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    args.sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    torch.set_num_threads(args.threads)
    work = args.work or tempfile.mkdtemp(prefix="parity_transformers.")
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, work folder {work}")
    rows = []
    for name in args.models.split(","):
        rows += check_model(name, args, work)
    failed = sum(not r[-1] for r in rows)
    print(f"{len(rows) - failed}/{len(rows)} ok")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
