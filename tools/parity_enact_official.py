#!/usr/bin/python3
"""Parity of `detr step --set encoder_attn=enact_official` with the authors' ENACT models, run from a checkout
of GSavathrakis/ENACT (--enact-root: its DETR-ENACT/ and Conditional-DETR-ENACT/ folders, imported at run time;
nothing of them is copied here): DETR-ENACT (models/transformer.py's encoder layers call
models/ENACT_attn/enact.py's ClustAttn) and Conditional-DETR-ENACT (its models/transformer.py with its
models/enact.py). Their code runs unchanged. The model is built from a seed as tools/parity_step.py builds
DETR (the same Backbone, Joiner, DETR / ConditionalDETR, SetCriterion classes, here the ENACT repository's own
copies; Transformer(device="cpu", sigma)), its state_dict is written as safetensors under the official names
(transformer.encoder.layers.N.self_attn.{W_q,W_k,W_v,W_o,W_prob}.*) and loaded by `detr step` with the strict
loader (that is the test that the official checkpoints' names load), and outputs, matches, every loss term and
every parameter gradient are compared with parity_step.py's rule (1e-4 max-relative or normwise against the
float32 reference, or within twice the float32 reference's own normwise distance to float64).

Also compared per encoder layer: the smoothed entropy (the official module's first F.conv1d output, recorded
through a wrapper of its `F`) and the cluster size (its `round(np.mean(means))`, recorded through a wrapper of
the module's `round`). The cluster size is piecewise constant: when the float32 or float64 reference computes
another one than detr-c (a curvature within rounding of 0 changes a run count), the reference is given
detr-c's (the same function is then compared) and the line says so. In float64 the module's float32 constant
tensors (gaussian_kernel, Sobel_2der, base) are replaced by float64 ones from the same formulas.

  /usr/bin/python3 tools/parity_enact_official.py --enact-root DIR [--kind detr|conditional|both] [--preset tiny]
                   [--padding | --both] [--detr build/detr] [--sigma 3] [--size HxW] [--seed N] [--keep DIR]

--both runs each kind without and with padding (image 1 smaller: the official encoder passes no mask, so padded
pixels take part in the entropy softmax, the smoothing, the chunks and the attention, in both programs) and
prints a summary. Every gradient is judged, the backbone's too, with parity_step.py's rules (the spread rule
included: at 320x480 some backbone and encoder gradients sit at a ReLU's kink and move as much under 1e-5 input
noise in the reference itself). Exit status 0 when everything judged passes. matplotlib (imported by the official enact.py for
its plotting helpers only) is replaced by an empty module when it is not installed.
"""
import argparse
import builtins
import functools
import math
import os
import sys
import tempfile
import types

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_step  # noqa: E402  (safetensors, the reference's build, the batch, the comparison)

KINDS = {"detr": ("DETR-ENACT", "detr"), "conditional": ("Conditional-DETR-ENACT", "conditional")}


def purge_reference_modules():
    """The two repositories both have top-level `models` and `util` packages: forget the previous one's."""
    for name in list(sys.modules):
        if name.split(".")[0] in ("models", "util"):
            del sys.modules[name]


def stub_matplotlib():
    try:
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        mpl = types.ModuleType("matplotlib")
        mpl.pyplot = types.ModuleType("matplotlib.pyplot")
        sys.modules["matplotlib"], sys.modules["matplotlib.pyplot"] = mpl, mpl.pyplot


class Recorder:
    """Wraps the official enact module's `round` and `F`: records each layer's cluster size and smoothed
    entropy in call order, and can hand the module given cluster sizes instead of its own."""

    def __init__(self):
        self.sizes, self.own_sizes, self.entropy, self.forced = [], [], [], None
        self._conv_calls = 0

    def reset(self, forced=None):
        self.sizes, self.own_sizes, self.entropy, self.forced = [], [], [], forced
        self._conv_calls = 0

    def round(self, x):
        own = builtins.round(x)
        self.own_sizes.append(own)
        size = own if self.forced is None else int(self.forced[len(self.sizes)])
        self.sizes.append(size)
        return size

    def functional(self):
        rec = self

        class Proxy(types.ModuleType):
            def __getattr__(self, name):
                return getattr(F, name)

            @staticmethod
            def conv1d(*args, **kwargs):
                out = F.conv1d(*args, **kwargs)
                if rec._conv_calls % 2 == 0:  # ClustAttn.forward: the Gaussian first, then the curvature
                    rec.entropy.append(out.detach().squeeze(1).double().numpy().copy())
                rec._conv_calls += 1
                return out

        return Proxy("F")


def build_official(root, kind, p, seed, sigma):
    folder, decoder = KINDS[kind]
    repo = os.path.join(root, folder)
    purge_reference_modules()
    stub_matplotlib()
    sys.path.insert(0, repo)
    import models.transformer as tm  # noqa: E402  (the official module; build_reference imports the same one)

    tm.Transformer = functools.partial(tm.Transformer, "cpu", float(sigma))
    enact_mod = sys.modules[tm.ClustAttn.__module__]
    rec = Recorder()
    enact_mod.round = rec.round  # a module global is found before the builtin
    enact_mod.F = rec.functional()
    model, criterion, weight_dict = parity_step.build_reference(repo, p, seed, decoder)
    sys.path.remove(repo)
    mods = [layer.self_attn for layer in model.transformer.encoder.layers]
    assert all(type(m).__name__ == "ClustAttn" for m in mods)
    return model, criterion, weight_dict, mods, rec, decoder


def set_constants(mods, dtype, sigma):
    """ClustAttn's constant tensors (plain attributes, not buffers) in dtype: float32 as the module makes
    them, float64 from the same formulas in float64."""
    for m in mods:
        if dtype == torch.float64:
            x = torch.arange(-(3 * sigma - 1), 3 * sigma, dtype=torch.float64)
            m.gaussian_kernel = torch.exp(-x * x / (2.0 * sigma * sigma)) / (sigma * math.sqrt(2 * math.pi))
            m.Sobel_2der = torch.tensor([-1.0, 2.0, -1.0], dtype=torch.float64)
            m.base = torch.tensor([2.0], dtype=torch.float64)
        else:
            m.gaussian_kernel, m.Sobel_2der, m.base = m._f32_constants


def run_kind(args, kind, padding, size):
    p = parity_step.PRESETS[args.preset]
    model, criterion, weight_dict, mods, rec, decoder = build_official(args.enact_root, kind, p, args.seed, args.sigma)
    for m in mods:
        m._f32_constants = (m.gaussian_kernel, m.Sobel_2der, m.base)
    images, mask, targets = parity_step.make_batch(p, padding, args.seed, size)
    model.eval()  # dropout off (ClustAttn has none of its own)
    work = os.path.join(args.keep, f"{kind}-{'pad' if padding else 'nopad'}") if args.keep else \
        tempfile.mkdtemp(prefix=f"detr-parity-enact-official-{kind}-")
    wpath, bpath, opath = parity_step.write_inputs(work, model.state_dict(), images, mask, targets)
    sets = ["encoder_attn=enact_official", f"decoder={decoder}", f"enact_official_sigma={args.sigma}"]
    ours = parity_step.run_step(args.detr, args.preset, wpath, bpath, opath, sets)
    n_layers = len(mods)
    our_sizes = [int(ours[f"enact_official.{l}.cluster_size"][0]) for l in range(n_layers)]

    notes, refs = [], {}
    for dtype in (torch.float32, torch.float64):
        set_constants(mods, dtype, args.sigma)
        rec.reset()
        parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, dtype)  # its own sizes
        own = list(rec.own_sizes)
        rec.reset(forced=our_sizes)
        res, indices = parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, dtype)
        for l in range(n_layers):
            res[f"enact_official.{l}.entropy"] = rec.entropy[l]
        refs[dtype] = (res, indices)
        name = "float32" if dtype == torch.float32 else "float64"
        same = own == our_sizes
        notes.append(f"  cluster sizes per encoder layer: detr-c {our_sizes}, {name} reference's own {own}"
                     f"{'' if same else ' (differ: the reference ran with detr-c sizes)'}")
    set_constants(mods, torch.float32, args.sigma)
    (ref32, indices), (ref64, _) = refs[torch.float32], refs[torch.float64]
    for k in list(ours):
        if k.startswith("enact_official.") and k.endswith(".cluster_size"):
            del ours[k]
    notes += parity_step.drop_zero_gradients(ours, ref32, ref64, args.tol)
    title = (f"parity encoder_attn=enact_official vs {KINDS[kind][0]} {args.preset} {size[0]}x{size[1]} "
             f"padding={padding} sigma={args.sigma} (torch {torch.__version__}; files in {work})")
    # Every gradient judged; where one is outside the other criteria, the reference's own movement
    # under 1e-5 input noise (with detr-c's cluster sizes still forced) is measured: at 320x480 some
    # backbone and encoder gradients sit at a ReLU's kink (docs/attention.md, the spread rule).
    ok, groups = parity_step.compare(ours, ref32, ref64, indices, args.tol, title,
                                     lambda: parity_step.reference_spread(
                                         model, criterion, weight_dict, images, mask, targets, ref32, indices,
                                         before_run=lambda: rec.reset(forced=our_sizes)))
    backbone_ok = ok
    print("  the encoder attention's gradients (max-relative ours/32, normwise ours/64, normwise 32/64):")
    for k in sorted(k for k in ref32 if ".self_attn.W_" in k and k in ours):
        print(f"    {k[5:]:56s} {parity_step.rel_err(ours[k], ref32[k]):9.2e} {parity_step.norm_err(ours[k], ref64[k]):9.2e} "
              f"{parity_step.norm_err(ref32[k], ref64[k]):9.2e}")
    for line in notes:
        print(line)
    return ok, groups, our_sizes, backbone_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--enact-root", required=True, help="checkout of GSavathrakis/ENACT")
    ap.add_argument("--kind", default="both", choices=["detr", "conditional", "both"])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "detr-r18-small"])
    ap.add_argument("--padding", action="store_true")
    ap.add_argument("--both", action="store_true", help="without and with padding")
    ap.add_argument("--detr", default="build/detr")
    ap.add_argument("--sigma", type=int, default=3, help="ClustAttn's sigma (an integer; the official default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="96x128")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    size = tuple(int(v) for v in args.size.split("x"))
    kinds = ["detr", "conditional"] if args.kind == "both" else [args.kind]
    paddings = [False, True] if args.both else [args.padding]
    rows = []
    for kind in kinds:
        for padding in paddings:
            ok, groups, sizes, backbone_ok = run_kind(args, kind, padding, size)
            rows.append((kind, padding, ok, groups, sizes, backbone_ok))
            print()
    print("summary (max-relative ours/ref32; grads: the worst tensor)")
    print(f"  {'reference':24s} {'padding':8s} {'sizes':10s} {'outputs':>9s} {'entropy':>9s} {'losses':>9s} "
          f"{'grads':>9s}  worst gradient{'':30s} result  backbone grads")
    for kind, padding, ok, groups, sizes, backbone_ok in rows:
        outs = max((g[0] for k, g in groups.items() if "pred_" in k), default=float("nan"))
        ent = max((g[0] for k, g in groups.items() if k.startswith("enact_official.")), default=float("nan"))
        losses = max((g[0] for k, g in groups.items() if k.startswith("loss.")), default=float("nan"))
        grads = groups.get("grad.*", [float("nan")] * 5)
        print(f"  {KINDS[kind][0]:24s} {str(padding):8s} {','.join(map(str, sizes)):10s} {outs:9.2e} {ent:9.2e} "
              f"{losses:9.2e} {grads[0]:9.2e}  {grads[4][5:]:44s} {'PASS' if ok else 'FAIL'}    "
              f"{'pass' if backbone_ok else 'fail'}")
    sys.exit(0 if all(r[2] for r in rows) else 1)


if __name__ == "__main__":
    main()
