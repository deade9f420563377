#!/usr/bin/python3
"""Writes the reference fixtures of tests/test_reference.c (tests/fixtures/reference/*.safetensors): for each
model family a tiny configuration built by the official code (a checkout of each reference repository,
imported at run time through tools/parity_step.py and tools/parity_enact_official.py, whose model-building
code this reuses), run once in float32 on a seeded batch of two non-square images (the second padded), and
saved with everything detr-c must reproduce: the weights (the official state_dict's names), the batch, the
outputs of every decoder layer, the matches, every loss term, the gradient of every trainable parameter, and
the post-processed detections (the reference's own PostProcess) for non-square original image sizes. The
__metadata__ records the detr-c config (preset and --set list), the reference repository and commit, the
torch version, the float32 reference's own distance to float64 (the tolerances' measure) and this command.

  /usr/bin/python3 tools/write_reference_fixtures.py --detr-repo DETR --conditional-repo CONDITIONAL_DETR \\
      --enact-root ENACT --anchor-repo ANCHOR_DETR [--out tests/fixtures/reference] [--only NAME ...]
      [--compare DIR] [--threads N]

Each --*-repo is a checkout (or `git archive` export) of the commit in REFERENCES (a checkout at another
commit is refused); the files they hold are imported, nothing of them is copied here. --compare DIR: after
writing, prints each tensor's largest difference to the file of the same name in DIR (the reproduction check
of tests/fixtures/reference/README.md). Needs Debian's python3-torch, python3-torchvision, python3-scipy,
python3-packaging.

Small on purpose (about 90 KB a file): a ResNet-18 of width 4 (torchvision's ResNet with its stem and layers
narrowed: 4, 8, 16 channels) stopped after layer3 (detr-c's backbone_layers=3: torchvision's layer4 is an
nn.Identity, so IntermediateLayerGetter returns layer3's output), hidden 8, 2 heads, 1 encoder and 2 decoder
layers, 48 x 80 images stored as bytes, the weights rounded to bfloat16 and stored as BF16 (exact). The stem
and layer1 are frozen as DETR freezes them; only the `detr` fixture trains the rest of the backbone.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_step  # noqa: E402  (the reference's build, the batch, the reference run)
import parity_enact_official  # noqa: E402  (DETR-ENACT's build)

REFERENCES = {  # repository, the commit the committed fixtures were written from
    "detr": ("facebookresearch/detr", "29901c51d7fe8712168b8d0d64351170bc0f83e0"),
    "conditional": ("Atten4Vis/ConditionalDETR", "8ea7c3f3fff49cd287855d4f13cc12a6066bc8e9"),
    "enact": ("GSavathrakis/ENACT", "360b9cc63ec26e0e20ec316e58ecad0b715bf374"),
    "enact_anchor": ("GSavathrakis/ENACT", "360b9cc63ec26e0e20ec316e58ecad0b715bf374"),
    "anchor": ("megvii-research/AnchorDETR", "0b4358a1caacf4b311b8653312e145f1c94de3d3"),
}
WIDTH, LAYERS = 4, 3  # the narrow backbone: detr-c's backbone_width and backbone_layers
TINY = dict(backbone="resnet18", hidden=8, heads=2, enc=1, dec=2, ffn=16, queries=5, classes=4)
SIZE = (48, 80)  # the batch's H x W (stride 16: 3 x 5 tokens)
ORIG_SIZES = [(480, 640), (427, 320)]  # (h, w) of the original images post-processing scales to: both non-square
SEED = 0


def detr_c_sets(p, train_backbone, extra=()):
    """detr-c's --set list for parity_step's preset dict p (on top of the `tiny` preset)."""
    return [f"backbone_width={WIDTH}", f"backbone_layers={LAYERS}", f"train_backbone={int(train_backbone)}",
            f"hidden_dim={p['hidden']}", f"nheads={p['heads']}", f"enc_layers={p['enc']}", f"dec_layers={p['dec']}",
            f"ffn_dim={p['ffn']}", f"num_queries={p['queries']}", f"num_classes={p['classes']}",
            "dropout=0"] + list(extra)


ATTENTION = "tools/parity_attention.py's "


def family(ref, repo, p, decoder, train_backbone, sets, **more):
    return dict(ref=ref, repo=repo, p=p, decoder=decoder, train_backbone=train_backbone, sets=sets, **more)


# Each family: the reference (a REFERENCES key), its --*-repo argument, parity_step's preset dict, the
# decoder, whether the backbone trains, detr-c's --set list beyond detr_c_sets, and for the DETR-based
# variants `install`, the parity tool's module put into the reference (its source in `source`). Only DETR's
# fixture trains the backbone (the same module in every family, and its gradients are half of a file):
# the others keep it frozen, as the reference does with lr_backbone=0.
FAMILIES = {
    "detr": family("detr", "detr_repo", dict(TINY), "detr", True, []),
    # 10 queries x 10 classes: its PostProcess takes the 100 best (query, class) scores.
    "conditional_detr": family("conditional", "conditional_repo", dict(TINY, queries=10, classes=10), "conditional",
                               False, ["decoder=conditional"]),
    # sigma 1 (the official default 3 smooths the 15 positions into one run: one cluster of all of them).
    "enact_official": family("enact", "enact_root", dict(TINY), "detr", False,
                             ["encoder_attn=enact_official", "enact_official_sigma=1"], sigma=1),
    # Anchor-DETR-ENACT (parity_step.py's AnchorEnact: its one patch keeps a batch's images apart), sigma 1.
    "anchor_detr_enact": family("enact_anchor", "enact_root", dict(TINY, hidden=32, queries=6, classes=91), "anchor",
                                False, ["decoder=anchor", "encoder_attn=enact_official", "enact_official_sigma=1"],
                                sigma=1),
    # 2 anchor points x 3 patterns; its transformer has 91 classes written down, its input projection a
    # GroupNorm of 32 groups (hidden 32).
    "anchor_detr": family("anchor", "anchor_repo", dict(TINY, hidden=32, queries=6, classes=91), "anchor", False,
                          ["decoder=anchor"]),
    # detr-c's ENACT form (docs/enact.md: the supplement's), with the module's own regions. W_prob's weight
    # x 20 and sigma 1: on a 3 x 5 map the default's nearly uniform entropy gives one region per image row
    # run; this gives 11 regions of 1 to 4 pixels, each curvature at least 1% of the largest from 0.
    "enact": family("detr", "detr_repo", dict(TINY), "detr", False, ["encoder_attn=enact", "enact_sigma=1"],
                    install=("attention", "enact"), w_prob_scale=20,
                    source=ATTENTION + "EnactAttention (docs/enact.md)"),
    "kmeans": family("detr", "detr_repo", dict(TINY), "detr", False, ["decoder_cross_attn=kmeans"],
                     install=("kmeans",),
                     source="tools/parity_kmeans.py's KMeansCrossAttention (from bytedance/kmax-deeplab f8e1d04)"),
    "efficient": family("detr", "detr_repo", dict(TINY), "detr", False, ["encoder_attn=efficient"],
                        install=("attention", "efficient"),
                        source=ATTENTION + "EfficientAttention (from cmsflash/efficient-attention 46a5f9e)"),
    "hydra": family("detr", "detr_repo", dict(TINY), "detr", False, ["encoder_attn=hydra"],
                    install=("attention", "hydra"),
                    source=ATTENTION + "HydraAttention (from the paper's listing, arXiv 2209.07484)"),
    "focused": family("detr", "detr_repo", dict(TINY), "detr", False, ["encoder_attn=focused"],
                      install=("attention", "focused"),
                      source=ATTENTION + "FocusedAttention (from LeapLabTHU/FLatten-Transformer abdb115)"),
    "sra": family("detr", "detr_repo", dict(TINY), "detr", False, ["encoder_attn=sra", "sra_ratio=2"],
                  install=("attention", "sra"), source=ATTENTION + "SRAttention (from whai362/PVT 57e2dfa)"),
    # Two encoder layers: the second shifts its 3 x 3 windows (the 3 x 5 map padded to 3 x 6).
    "swin": family("detr", "detr_repo", dict(TINY, enc=2), "detr", False, ["encoder_attn=swin", "swin_window=3"],
                   install=("attention", "swin"),
                   source=ATTENTION + "SwinAttention (from microsoft/Swin-Transformer f82860b)"),
}
# What parity_attention.install reads of its command line.
ATTENTION_ARGS = argparse.Namespace(swin_window=3, swin_no_shift=False, focused_z="mean", sra_ratio=2, enact_sigma=1.0)


def narrow_resnet(depth, width, layers):
    """torchvision's ResNet-18 with its stem and layers narrowed to width, 2 * width, 4 * width (8 * width);
    with 3 layers layer4 is an nn.Identity. Returns a constructor with torchvision's resnet18 signature."""
    import torchvision
    from torchvision.models.resnet import BasicBlock

    assert depth == 18

    def make(*, replace_stride_with_dilation=None, norm_layer=None, **_):
        net = torchvision.models.resnet.ResNet(BasicBlock, [2, 2, 2, 2], norm_layer=norm_layer)
        net.inplanes = width
        net.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        net.bn1 = norm_layer(width)
        net.layer1 = net._make_layer(BasicBlock, width, 2)
        net.layer2 = net._make_layer(BasicBlock, 2 * width, 2, stride=2)
        net.layer3 = net._make_layer(BasicBlock, 4 * width, 2, stride=2)
        net.layer4 = net._make_layer(BasicBlock, 8 * width, 2, stride=2) if layers == 4 else nn.Identity()
        net.fc = nn.Identity()  # unused (IntermediateLayerGetter stops at layer4)
        for m in net.modules():  # torchvision's initialisation of its convolutions
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        return net

    return make


def patch_backbone(repo, train_backbone, as_list):
    """The reference's Backbone around the narrow ResNet: torchvision.models.resnet18 is replaced for the
    reference's getattr(torchvision.models, name); num_channels, which the references write down (512 in
    DETR's, [2048] in Anchor DETR's, where parity_step sets [512]), reads the narrow count (a property whose
    setter ignores them: as_list, Anchor DETR's list form); train_backbone (the reference's lr_backbone > 0)
    replaces the value the builders pass."""
    import torchvision
    sys.path.insert(0, repo)
    import models.backbone as backbone_mod
    sys.path.remove(repo)
    torchvision.models.resnet18 = narrow_resnet(18, WIDTH, LAYERS)
    channels = WIDTH << (LAYERS - 1)
    base_init = backbone_mod.BackboneBase.__init__

    def init(self, backbone, _train, *rest):
        base_init(self, backbone, train_backbone, *rest)

    class Narrow(backbone_mod.Backbone):
        num_channels = property(lambda self: [channels] if as_list else channels, lambda self, value: None)

    backbone_mod.BackboneBase.__init__ = init
    backbone_mod.Backbone = Narrow


def build(name, args):
    fam = FAMILIES[name]
    p, decoder, train_backbone = fam["p"], fam["decoder"], fam["train_backbone"]
    repo = getattr(args, fam["repo"])
    parity_enact_official.purge_reference_modules()  # each repository has top-level `models` and `util`
    build_reference = parity_step.build_reference

    def narrow_build(repo, *rest):  # the backbone patched in the modules build_reference imports
        patch_backbone(repo, train_backbone, decoder == "anchor")
        return build_reference(repo, *rest)

    parity_step.build_reference = narrow_build
    try:
        if fam["ref"] == "enact":  # DETR-ENACT, built by parity_enact_official (which purges and imports again)
            model, criterion, weight_dict, mods, rec, _ = parity_enact_official.build_official(
                repo, "detr", p, SEED, fam["sigma"])
            return model, criterion, weight_dict, OfficialEnact(mods, rec, fam["sigma"])
        if fam["ref"] == "enact_anchor":  # Anchor-DETR-ENACT, as parity_step.py --enact-sigma builds it
            folder = os.path.join(repo, "Anchor-DETR-ENACT")
            sys.path.insert(0, folder)
            enact = parity_step.AnchorEnact(fam["sigma"])
            model, criterion, weight_dict = parity_step.build_reference(folder, p, SEED, decoder)
            enact.attach(model)
            return model, criterion, weight_dict, enact
        model, criterion, weight_dict = parity_step.build_reference(repo, p, SEED, decoder)
    finally:
        parity_step.build_reference = build_reference
    install = fam.get("install", ())
    if install[:1] == ("attention",):
        import parity_attention
        mods = parity_attention.install(model, install[1], p, ATTENTION_ARGS, SEED)
        with torch.no_grad():
            for m in mods:
                if "w_prob_scale" in fam:
                    m.W_prob.weight.mul_(fam["w_prob_scale"])
    elif install[:1] == ("kmeans",):
        import parity_kmeans
        parity_kmeans.install(model, p)
    return model, criterion, weight_dict, None


def postprocess(model, ref_outputs):
    """The reference's own PostProcess (its models/detr.py or models/conditional_detr.py) on the float32
    outputs, for ORIG_SIZES: scores, labels, boxes (x0, y0, x1, y1 in pixels) per image."""
    post = sys.modules[type(model).__module__].PostProcess()
    outputs = {"pred_logits": torch.from_numpy(ref_outputs["pred_logits"]).float(),
               "pred_boxes": torch.from_numpy(ref_outputs["pred_boxes"]).float()}
    sizes = torch.tensor(ORIG_SIZES, dtype=torch.int64)
    res = post(outputs, sizes)
    return {"post.scores": np.stack([r["scores"].numpy() for r in res]),
            "post.labels": np.stack([r["labels"].numpy() for r in res]).astype(np.int64),
            "post.boxes": np.stack([r["boxes"].numpy() for r in res]),
            "post.orig_size": sizes.numpy()}


def float64_distance(ref32, ref64, noise):
    """The float32 reference's own max-relative distance to float64: the largest per group, and "name=d" for
    each tensor where it exceeds 1e-6 (the C test allows such a tensor 8 d). The gradients 0 in exact
    arithmetic are left out (noise_gradients)."""
    groups, each = {}, []
    for k in ref32:
        if k in noise:
            continue
        d = parity_step.rel_err(ref32[k], ref64[k])
        group = "grad" if k.startswith("grad.") else "loss" if k.startswith("loss.") else "out"
        groups[group] = max(groups.get(group, 0.0), d)
        if d > 1e-6:
            each.append(f"{k}={d:.3e}")
    return groups, each


def noise_gradients(ref32, ref64):
    """Gradients that are 0 in exact arithmetic (parity_step.drop_zero_gradients' rule: float64 below 1e-9
    of the largest gradient of the same layer): "name=scale" with the layer's float32 scale; the C test
    checks that they stay below a fraction of it instead of comparing rounding noise."""
    def layer_of(name):
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part.isdigit() and i > 0 and parts[i - 1] == "layers":
                return ".".join(parts[:i + 1])
        return name.rsplit(".", 1)[0]

    out = []
    grads = [k for k in ref64 if k.startswith("grad.")]
    for k in grads:
        siblings = [s for s in grads if layer_of(s) == layer_of(k)]
        s64 = max(np.abs(ref64[s]).max(initial=0.0) for s in siblings)
        s32 = max(np.abs(ref32[s]).max(initial=0.0) for s in siblings)
        if s64 > 0 and np.abs(ref64[k]).max(initial=0.0) <= 1e-9 * s64:
            out.append(f"{k}={s32:.6e}")
    return out


def discrete_choices(model, res):
    """What the run decided by comparisons (ENACT's cluster sizes and regions, k-means' assignments): equal
    in float32 and float64, they are far enough from a tie that another float32 program decides the same."""
    out = [res.get("cluster_sizes", np.zeros(0)).tolist()]
    for layer in getattr(getattr(model.transformer, "encoder", None), "layers", []):
        regions = getattr(layer.self_attn, "own_regions", None)  # parity_attention's EnactAttention
        out.append([r.tolist() for r in regions] if regions is not None else None)
    for layer in getattr(getattr(model.transformer, "decoder", None), "layers", []):
        index = getattr(getattr(layer, "multihead_attn", None), "last_index", None)  # parity_kmeans' module
        out.append(index.tolist() if index is not None else None)
    return out


class OfficialEnact:
    """DETR-ENACT's ClustAttn modules as parity_step.AnchorEnact offers Anchor-DETR-ENACT's: set_dtype (the
    module's constants in the run's dtype; the recorded sizes cleared) and sizes (each layer's cluster size)."""

    def __init__(self, mods, rec, sigma):
        self.mods, self.rec, self.sigma = mods, rec, sigma
        for m in mods:
            m._f32_constants = (m.gaussian_kernel, m.Sobel_2der, m.base)

    def set_dtype(self, dtype):
        parity_enact_official.set_constants(self.mods, dtype, self.sigma)
        self.rec.reset()

    @property
    def sizes(self):
        return self.rec.own_sizes


def reference_runs(model, criterion, weight_dict, images, mask, targets, enact):
    """The float32 run (the fixture) and the float64 one (the float32 reference's own error); refuses a batch
    where they decide differently (discrete_choices, the matches). enact: OfficialEnact or AnchorEnact."""
    refs, choices = {}, []
    for dtype in (torch.float32, torch.float64):
        if enact:
            enact.set_dtype(dtype)
        res, indices = parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, dtype)
        if enact:
            res["cluster_sizes"] = np.array(enact.sizes, dtype=np.int64)
        refs[dtype] = (res, indices)
        choices.append((discrete_choices(model, res), [(q.tolist(), t.tolist()) for q, t in indices]))
    if enact:
        enact.set_dtype(torch.float32)
    if choices[0] != choices[1]:
        sys.exit("write_reference_fixtures: float32 and float64 runs decide differently (cluster sizes, k-means "
                 "assignments or matches): a tie within rounding; choose another SEED")
    return refs[torch.float32], refs[torch.float64]


def round_weights_to_bf16(model):
    """Every weight and buffer rounded to bfloat16 in place before the reference runs, so that the file
    holds them exactly in half the bytes (BF16: a float32's upper 16 bits)."""
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16).to(t.dtype))


def bf16_bytes(arr):
    """A float32 array whose values are bfloat16 (round_weights_to_bf16), as BF16 bytes."""
    bits = np.ascontiguousarray(arr, np.float32).view(np.uint32)
    assert not (bits & 0xFFFF).any(), "a weight is not a bfloat16 value"
    return (bits >> 16).astype("<u2").tobytes()


def write_safetensors(path, tensors, metadata, bf16=()):
    """parity_step.write_safetensors with a __metadata__ (string values), the tensors in name order, and
    the tensors named in bf16 written as BF16."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        data = bf16_bytes(arr) if name in bf16 else arr.tobytes()
        dtype = "BF16" if name in bf16 else names[arr.dtype]
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_batch(p):
    """parity_step.make_batch's padded batch with its pixels rounded to multiples of 1/32 in [-4, 4): stored
    exactly as U8 `images_u8` (pixel = (u8 - 128) / 32: a quarter of the float32 bytes), and the padding as
    each image's valid (h, w) (make_batch pads bottom and right) instead of the mask."""
    images, mask, targets = parity_step.make_batch(p, True, SEED, SIZE)
    q = torch.clamp(torch.round(images * 32), -128, 127)
    images = q / 32
    valid = [((~m).any(1).sum().item(), (~m).any(0).sum().item()) for m in mask]
    extra = {"images_u8": (q + 128).to(torch.uint8).numpy(), "image_sizes": np.array(valid, dtype=np.int64)}
    return images, mask, targets, extra


def generator_command(name):
    """The command that writes the file (the checkouts' paths as placeholders: the file does not depend on them)."""
    arg = FAMILIES[name]["repo"].replace("_", "-")
    return (f"/usr/bin/python3 tools/write_reference_fixtures.py --{arg} {arg.split('-')[0].upper()}_CHECKOUT "
            f"--only {name}")


def check_commit(repo, key):
    """A git checkout must be at the recorded commit (an export, without .git, is taken as it is)."""
    import subprocess
    if not os.path.exists(os.path.join(repo, ".git")):
        return
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != REFERENCES[key][1]:
        sys.exit(f"write_reference_fixtures: {repo} is at {head}, the fixtures record {REFERENCES[key][1]}")


def write_family(name, args):
    fam = FAMILIES[name]
    key, p = fam["ref"], fam["p"]
    check_commit(getattr(args, fam["repo"]), key)
    model, criterion, weight_dict, enact = build(name, args)
    round_weights_to_bf16(model)
    images, mask, targets, tensors = make_batch(p)
    model.eval()  # dropout off; gradients still flow
    (ref32, indices), (ref64, _) = reference_runs(model, criterion, weight_dict, images, mask, targets, enact)
    weights = {k: v.detach().numpy() for k, v in parity_step.official_state_dict(model).items()}
    tensors.update(weights)
    for i, t in enumerate(targets):
        tensors[f"targets.{i}.boxes"], tensors[f"targets.{i}.labels"] = t["boxes"].numpy(), t["labels"].numpy()
    for i, (q, t) in enumerate(indices):
        tensors[f"match.{i}"] = np.stack([q.numpy(), t.numpy()], 1).astype(np.int64).reshape(-1, 2)
    for k, v in ref32.items():
        tensors[k] = v.astype(np.int64) if k == "cluster_sizes" else v.astype(np.float32)
    ref32.pop("cluster_sizes", None)
    tensors.update(postprocess(model, ref32))
    repo, commit = REFERENCES[key]
    noise = noise_gradients(ref32, ref64)
    dist, each = float64_distance(ref32, ref64, {n.split("=")[0] for n in noise})
    notes = {}
    if fam.get("install") == ("kmeans",):  # how far each pixel's assignment is from a tie (tools/parity_kmeans.py)
        gap = min(layer.multihead_attn.last_gap for layer in model.transformer.decoder.layers)
        notes["kmeans_min_gap"] = f"{gap:.3e}"
    if fam.get("install") == ("attention", "enact"):  # the regions the module found (its float32 run's)
        notes["enact_region_lengths"] = " ".join(
            ",".join(map(str, layer.self_attn.own_regions[1].tolist())) for layer in model.transformer.encoder.layers)
    metadata = {
        "family": name,
        "preset": "tiny",
        "sets": " ".join(detr_c_sets(p, fam["train_backbone"], fam["sets"])),
        "reference": repo + {"enact": "/DETR-ENACT", "enact_anchor": "/Anchor-DETR-ENACT"}.get(key, "") +
                     (f" with {fam['source']}" if "source" in fam else ""),
        "commit": commit,
        "torch": torch.__version__,
        "float32_vs_float64": " ".join(f"{g}={v:.3e}" for g, v in sorted(dist.items())),
        "float64_distance": " ".join(each),
        "noise_gradients": " ".join(noise),
        "generator": generator_command(name),
        **notes,
    }
    path = os.path.join(args.out, f"{name}.safetensors")
    write_safetensors(path, tensors, metadata, bf16=set(weights))
    n_params = sum(v.size for k, v in tensors.items() if k.startswith("grad."))
    print(f"{path}: {os.path.getsize(path)} bytes, {len(tensors)} tensors, {n_params} trainable values; "
          f"float32 vs float64 (max-relative): {metadata['float32_vs_float64']}")
    return path


def read_fixture(path):
    """(tensors, metadata) of a fixture: parity_step.read_safetensors' dtypes and BF16 (widened to float32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        if e["dtype"] == "BF16":
            arr = (np.frombuffer(buf[a:b], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf[a:b], dtype=parity_step.DTYPES[e["dtype"]])
        out[name] = arr.reshape(e["shape"])
    return out, header.get("__metadata__", {})


def compare_files(path, other):
    """Prints the largest max-relative difference of path's tensors to other's, and the metadata that differ."""
    (a, ma), (b, mb) = read_fixture(path), read_fixture(other)
    assert sorted(a) == sorted(b), f"{path} and {other} hold different tensors"
    noise = dict(n.split("=") for n in mb.get("noise_gradients", "").split())
    worst, worst_key = 0.0, ""
    for k in a:
        if k in noise:  # 0 in exact arithmetic: rounding noise, measured against its layer's scale
            d = float(np.abs(a[k].astype(np.float64) - b[k]).max(initial=0.0)) / float(noise[k])
        else:
            d = parity_step.rel_err(a[k], b[k]) if a[k].size else 0.0
        if d > worst:
            worst, worst_key = d, k
    meta = [k for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)]
    print(f"  {os.path.basename(path)} vs {other}: " +
          (f"largest max-relative difference {worst:.2e} ({worst_key})" if worst else "every tensor identical") +
          (f"; metadata differ: {', '.join(meta)}" if meta else "; metadata identical"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detr-repo", help=f"checkout of {REFERENCES['detr'][0]} at {REFERENCES['detr'][1][:12]}")
    ap.add_argument("--conditional-repo",
                    help=f"checkout of {REFERENCES['conditional'][0]} at {REFERENCES['conditional'][1][:12]}")
    ap.add_argument("--enact-root", help=f"checkout of {REFERENCES['enact'][0]} at {REFERENCES['enact'][1][:12]}")
    ap.add_argument("--anchor-repo", help=f"checkout of {REFERENCES['anchor'][0]} at {REFERENCES['anchor'][1][:12]}")
    ap.add_argument("--out", default="tests/fixtures/reference")
    ap.add_argument("--only", nargs="*", choices=sorted(FAMILIES), default=None)
    ap.add_argument("--compare", default=None, help="directory of fixtures to compare the written ones with")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the committed files: 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)  # 1: one summation order, which a rerun reproduces bit for bit
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or list(FAMILIES):
        if getattr(args, FAMILIES[name]["repo"]) is None:
            ap.error(f"{name}: --{FAMILIES[name]['repo'].replace('_', '-')} is needed")
        path = write_family(name, args)
        if args.compare:
            compare_files(path, os.path.join(args.compare, os.path.basename(path)))


if __name__ == "__main__":
    main()
