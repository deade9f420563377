#!/usr/bin/python3
"""Loss-curve parity of detr-c's training with the official code (issue #58): DETR (facebookresearch/detr),
Conditional DETR (Atten4Vis/ConditionalDETR) and ENACT's official form (GSavathrakis/ENACT, DETR-ENACT)
trained from the same initial weights on the same sequence of batches, for a few hundred steps of a small
config each; the loss of every step and the trainable weights at the end are compared.

The reference model is built from a seed by tools/write_reference_fixtures.py's `build` (the official
classes imported from a checkout, through parity_step.py / parity_enact_official.py; a ResNet-18 of width 4
stopped after layer3), here with hidden 32, 4 heads, 2 encoder and 2 decoder layers, FFN 64, 10 queries,
4 classes, dropout 0, the backbone's layer2-3 trained. Its state_dict (the initial weights) and a pool of
synthetic batches are written as safetensors (`detr step`'s batch format: two 96 x 128 images, each image's
valid part 64-96 x 80-128 with the rest padding; 1-3 boxes an image, each a rectangle of its class's colour
on noise); step s trains on batch s % pool. The reference trains as its main.py / engine.py do: its
SetCriterion, AdamW (lr, lr_backbone on the parameters named *backbone*, weight decay 1e-4) with StepLR
stepped once per step (lr x0.1 from --lr-drop-step), clip_grad_norm_ 0.1 after backward. detr-c trains with
build-*/train_steps (tools/train_steps.c: the trainer's forward, criterion, backward and adamw_clip_step).

The drift band: float noise alone makes two trainings drift apart, so detr-c is judged against the
reference's own drift. The float32 reference R runs once as is, and again perturbed: in float64 (the exact
trajectory both float32 programs approximate), with N(0, 1e-6^2) added to the first batch's valid pixels
(--noise-seeds; AdamW's first update is lr x sign(gradient) for nearly every weight, so this perturbation
mostly dies at step 0: on DETR at 2 torch threads such runs stayed within 2.1e-7 of R for 300 steps), and
with such noise on every step's batch (--noise-every-seeds: a rounding-sized difference at every step, as
two float32 programs have).
drift_j(s) = |L_j(s) - L_R(s)| / L_R(s) for each perturbed run j; the band at step s is --factor (2) times
the largest drift_j(t) over j and t <= s (the envelope: a trajectory that has drifted stays drifted). The
factor 2: detr-c and R are two float32 programs each about the float32-vs-float64 distance d from the exact
trajectory, so their distance is up to about 2 d (the triangle inequality). Judged: |L_detr-c(s) - L_R(s)| /
L_R(s) <= band(s) at every step. Also printed: the first step at which each run's drift reaches 1e-6 ..
1e-2 (the chaotic growth's timing, detr-c's against the perturbed runs'). The final trainable weights:
normwise ||w_detr-c - w_R|| / ||w_R|| per tensor against 2 x the largest of the same over the perturbed runs.

  /usr/bin/python3 tools/parity_train.py --family detr|conditional_detr|enact_official \\
      --repo CHECKOUT [--steps 300] [--lr-drop-step 200] [--pool 20] [--noise-seeds 1] [--noise-every-seeds 2] \\
      [--train-steps build/train_steps] [--work DIR] [--threads 2] [--json OUT.json] [--chart OUT.png]

--repo: facebookresearch/detr, Atten4Vis/ConditionalDETR, or the GSavathrakis/ENACT root (its DETR-ENACT/).
Exit status 0 when every step is within the band and every final tensor within its band.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_step  # noqa: E402  (safetensors, the reference's build)
import write_reference_fixtures as wrf  # noqa: E402  (the narrow backbone, the families' builds)

CONFIG = dict(wrf.TINY, hidden=32, heads=4, enc=2, dec=2, ffn=64, queries=10, classes=4)
FAMILIES = {  # write_reference_fixtures' family, its --*-repo attribute, detr-c's --set beyond detr_c_sets
    "detr": ("detr_repo", []),
    "conditional_detr": ("conditional_repo", ["decoder=conditional"]),
    "enact_official": ("enact_root", ["encoder_attn=enact_official"]),
}
SIZE = (96, 128)  # the batch's H x W (stride 16: a 6 x 8 map)
SEED = 0


def build(name, repo, sigma):
    """The reference model, criterion and weight dict (and ENACT's OfficialEnact or None), built by
    write_reference_fixtures.build with this tool's config, the backbone trained."""
    attr, _ = FAMILIES[name]
    fam = dict(wrf.FAMILIES[name], p=dict(CONFIG), train_backbone=True)
    if name == "enact_official":
        fam["sigma"] = sigma
    saved = wrf.FAMILIES[name]
    wrf.FAMILIES[name] = fam
    try:
        return wrf.build(name, argparse.Namespace(**{attr: repo}))
    finally:
        wrf.FAMILIES[name] = saved


def make_batches(pool, classes, seed):
    """`pool` batches of two images: noise N(0, 0.3^2) with 1-3 boxes an image, each filled with its class's
    colour; image i's valid part (h, w) at the top left, zeros and mask 1 elsewhere (one image of each batch
    at full size, as DETR pads to the largest). Boxes are cxcywh normalised by the valid size."""
    g = torch.Generator().manual_seed(seed + 7)
    colours = torch.rand(classes, 3, generator=g) * 3 - 1.5
    H, W = SIZE
    batches = []
    for _ in range(pool):
        images, mask, targets = torch.zeros(2, 3, H, W), torch.ones(2, H, W, dtype=torch.bool), []
        full = int(torch.randint(0, 2, (1,), generator=g))
        for b in range(2):
            h = H if b == full else int(torch.randint(64, H + 1, (1,), generator=g))
            w = W if b == full else int(torch.randint(80, W + 1, (1,), generator=g))
            images[b, :, :h, :w] = torch.randn(3, h, w, generator=g) * 0.3
            mask[b, :h, :w] = False
            n = int(torch.randint(1, 4, (1,), generator=g))
            wh = torch.rand(n, 2, generator=g) * 0.4 + 0.15
            cxcy = wh / 2 + torch.rand(n, 2, generator=g) * (1 - wh)
            labels = torch.randint(0, classes, (n,), generator=g)
            for (cx, cy), (bw, bh), c in zip(cxcy.tolist(), wh.tolist(), labels.tolist()):
                x0, x1 = int(round((cx - bw / 2) * w)), int(round((cx + bw / 2) * w))
                y0, y1 = int(round((cy - bh / 2) * h)), int(round((cy + bh / 2) * h))
                images[b, :, y0:y1, x0:x1] += colours[c][:, None, None]
            targets.append({"boxes": torch.cat([cxcy, wh], 1), "labels": labels})
        batches.append((images, mask, targets))
    return batches


def write_batches(work, batches):
    os.makedirs(work, exist_ok=True)
    for i, (images, mask, targets) in enumerate(batches):
        t = {"images": images.numpy(), "mask": mask.numpy().astype(np.uint8)}
        for j, tg in enumerate(targets):
            t[f"targets.{j}.boxes"], t[f"targets.{j}.labels"] = tg["boxes"].numpy(), tg["labels"].numpy()
        parity_step.write_safetensors(os.path.join(work, f"batch-{i:04d}.safetensors"), t)


def train_reference(model, criterion, weight_dict, init, batches, args, dtype, noise_seed=None, every=False,
                    enact=None):
    """The official training loop (main.py's optimizer and schedule, engine.py's step) from `init` in dtype;
    noise_seed: N(0, 1e-6^2) added to the valid pixels of the first batch (every: of every step's batch).
    Returns (losses, grad norms, cluster sizes per step (ENACT), the final trainable weights as float64)."""
    from util.misc import NestedTensor

    model.load_state_dict(init)
    model.to(dtype)
    criterion.to(dtype)
    if enact:
        enact.set_dtype(dtype)
    groups = [{"params": [p for n, p in model.named_parameters() if "backbone" not in n and p.requires_grad]},
              {"params": [p for n, p in model.named_parameters() if "backbone" in n and p.requires_grad],
               "lr": args.lr_backbone}]
    opt = torch.optim.AdamW(groups, lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, args.lr_drop_step if args.lr_drop_step > 0 else 10 ** 9)
    losses, norms, sizes = [], [], []
    for s in range(args.steps):
        images, mask, targets = batches[s % len(batches)]
        images = images.to(dtype)
        if noise_seed is not None and (s == 0 or every):
            g = torch.Generator().manual_seed(1000 + 100003 * noise_seed + s)
            images = images + (torch.randn(images.shape, generator=g) * 1e-6).masked_fill(mask[:, None], 0).to(dtype)
        tg = [{k: (v.to(dtype) if v.is_floating_point() else v) for k, v in t.items()} for t in targets]
        if enact:
            enact.rec.reset()
        outputs = model(NestedTensor(images, mask))
        loss_dict = criterion(outputs, tg)
        total = sum(loss_dict[k] * weight_dict[k] for k in loss_dict if k in weight_dict)
        opt.zero_grad()
        total.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
        opt.step()
        sched.step()
        losses.append(float(total))
        if enact:
            sizes.append(list(enact.sizes))
    final = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters() if p.requires_grad}
    model.to(torch.float32)
    criterion.to(torch.float32)
    if enact:
        enact.set_dtype(torch.float32)
    return np.array(losses), np.array(norms), sizes, final


def train_detr_c(args, name, wpath, work, sigma):
    out = os.path.join(work, "detr-c-final.safetensors")
    sets = wrf.detr_c_sets(CONFIG, True, FAMILIES[name][1])
    if name == "enact_official":
        sets.append(f"enact_official_sigma={sigma}")
    cmd = [args.train_steps, "--config", "tiny", "--weights", wpath, "--batches", work, "--pool", str(args.pool),
           "--steps", str(args.steps), "--lr", str(args.lr), "--lr-backbone", str(args.lr_backbone),
           "--lr-drop-step", str(args.lr_drop_step), "--out", out]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout[-2000:], run.stderr[-4000:])
        sys.exit(f"parity_train: train_steps failed ({run.returncode}): {' '.join(cmd)}")
    lines = [line.split() for line in run.stdout.splitlines() if line.startswith("step ")]
    losses, norms = [float(f[3]) for f in lines], [float(f[5]) for f in lines]
    sizes = [[int(v) for v in f[7].split(",")] if len(f) > 7 else [] for f in lines]  # ENACT's per layer
    # %.9g round-trips a float32, not the double it reads as: back through float32 to compare exact values.
    losses = np.array(losses, dtype=np.float32).astype(np.float64)
    return losses, np.array(norms), sizes, parity_step.read_safetensors(out), time.time() - t0, " ".join(cmd)


def crossings(result, thresholds=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2)):
    """The first step at which detr-c's and each perturbed reference run's relative drift from R reaches each
    threshold (None: never): {threshold: {run: step}}."""
    L = np.array(result["reference"])
    runs = dict(result["drift"], **{"detr-c": (np.abs(np.array(result["detr_c"]) - L) / L).tolist()})
    out = {}
    for th in thresholds:
        out[th] = {k: (int(np.argmax(np.array(v) >= th)) if max(v) >= th else None) for k, v in runs.items()}
    return out


def draw_chart(result, png, tool):
    """The losses and detr-c's relative difference against the band, as PNG (tools/parity_train_chart.c)."""
    rows = "".join(f"{s} {r!r} {o!r} {abs(o - r) / r!r} {b!r}\n" for s, (r, o, b) in
                   enumerate(zip(result["reference"], result["detr_c"], result["band"])))
    title = f"{result['family']}: detr-c vs the official code, {result['steps']} steps"
    run = subprocess.run([tool, "--title", title, "--out", png], input=rows, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"parity_train: {tool} failed: {run.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--repo", required=True, help="checkout of the family's official repository (ENACT: its root)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--lr-backbone", type=float, default=1e-5)
    ap.add_argument("--lr-drop-step", type=int, default=200)
    ap.add_argument("--pool", type=int, default=20, help="distinct batches (step s trains on s %% pool)")
    ap.add_argument("--noise-seeds", type=int, default=1, help="float32 reference runs with 1e-6 noise on batch 0")
    ap.add_argument("--noise-every-seeds", type=int, default=2,
                    help="float32 reference runs with 1e-6 noise on every step's batch")
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--sigma", type=int, default=1, help="ENACT's sigma")
    ap.add_argument("--train-steps", default="build/train_steps")
    ap.add_argument("--work", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the curves and the verdict here")
    ap.add_argument("--chart", default=None, help="draw the curves and the band as this PNG")
    ap.add_argument("--chart-tool", default="build/parity_train_chart")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    name = args.family
    model, criterion, weight_dict, enact = build(name, args.repo, args.sigma)
    model.eval()  # dropout off (the config's dropout is 0 too); frozen batch norm does not care
    init = copy.deepcopy(model.state_dict())
    work = args.work or tempfile.mkdtemp(prefix=f"detr-parity-train-{name}-")
    os.makedirs(work, exist_ok=True)
    wpath = os.path.join(work, "init.safetensors")
    parity_step.write_safetensors(wpath, {k: v.numpy() for k, v in parity_step.official_state_dict(model).items()})
    batches = make_batches(args.pool, CONFIG["classes"], SEED)
    write_batches(work, batches)

    t0 = time.time()
    ref = train_reference(model, criterion, weight_dict, init, batches, args, torch.float32, enact=enact)
    t_ref = time.time() - t0
    others = {}
    for k in range(args.noise_seeds):
        others[f"noise-first{k}"] = train_reference(model, criterion, weight_dict, init, batches, args, torch.float32,
                                                    k, enact=enact)
    for k in range(args.noise_every_seeds):
        others[f"noise-every{k}"] = train_reference(model, criterion, weight_dict, init, batches, args,
                                                    torch.float32, 50 + k, True, enact)
    others["float64"] = train_reference(model, criterion, weight_dict, init, batches, args, torch.float64, enact=enact)
    ours_loss, ours_norm, ours_sizes, ours_w, t_ours, cmd = train_detr_c(args, name, wpath, work, args.sigma)
    if len(ours_loss) != args.steps:
        sys.exit(f"parity_train: train_steps printed {len(ours_loss)} steps, expected {args.steps}")

    L = ref[0]
    drift = {k: np.abs(v[0] - L) / L for k, v in others.items()}
    envelope = np.maximum.accumulate(np.max(np.stack(list(drift.values())), 0))
    band = args.factor * envelope
    ours = np.abs(ours_loss - L) / L
    ratio = ours / np.maximum(band, 1e-30)
    worst = int(np.argmax(ratio))
    outside = [int(s) for s in np.nonzero(ours > band)[0]]

    # Final trainable weights: normwise distance to R per tensor, against the perturbed runs' largest.
    wrows, wfail = [], []
    for n, w in ref[3].items():
        spread = max(parity_step.norm_err(v[3][n], w) for v in others.values())
        d = parity_step.norm_err(ours_w[n], w) if n in ours_w else float("inf")
        wrows.append((d / max(args.factor * spread, 1e-30), n, d, spread))
        if d > args.factor * spread:
            wfail.append(n)
    wrows.sort(reverse=True)

    print(f"parity_train {name}: {args.steps} steps, pool {args.pool}, lr {args.lr} / {args.lr_backbone}, "
          f"x0.1 from step {args.lr_drop_step}; torch {torch.__version__}, {args.threads} threads; files in {work}")
    print(f"  loss: reference first {L[0]:.6f} last {L[-1]:.6f} (min {L.min():.6f}); detr-c last {ours_loss[-1]:.6f}")
    for k, d in drift.items():
        at = ", ".join(f"step {s} {d[s]:.2e}" for s in (0, 10, 100) if s < len(d))
        print(f"  reference's own drift ({k}): {at}, max {d.max():.2e} (at step {int(np.argmax(d))})")
    for s in sorted({0, 1, 10, 50, 100, 200, args.steps - 1}):
        if s < args.steps:
            print(f"  step {s:4d}: reference {L[s]:.6f} detr-c {ours_loss[s]:.6f} |diff|/ref {ours[s]:.2e} "
                  f"band {band[s]:.2e} ({ratio[s]:.2f} of it)")
    print(f"  worst step vs band: step {worst}: {ours[worst]:.2e} vs {band[worst]:.2e} ({ratio[worst]:.2f} of the band)")
    print(f"  steps outside the band: {len(outside)}" + (f" (first {outside[:10]})" if outside else ""))
    curves = {"reference": L.tolist(), "detr_c": ours_loss.tolist(), "drift": {k: v.tolist() for k, v in drift.items()}}
    for th, steps in crossings(curves).items():
        print(f"  first step with drift >= {th:.0e}: " + ", ".join(f"{k} {v}" for k, v in steps.items()))
    print(f"  final weights (normwise vs reference; band {args.factor:g} x the perturbed runs' largest): worst "
          + "; ".join(f"{n} {d:.2e} vs {sp:.2e} ({r:.2f})" for r, n, d, sp in wrows[:3]))
    print(f"  final tensors outside their band: {len(wfail)} of {len(wrows)}" + (f" ({wfail[:5]})" if wfail else ""))
    if enact:
        changes = [s for s in range(1, args.steps) if ref[2][s] != ref[2][s - 1]]
        print(f"  ENACT cluster sizes (float32 reference): step 0 {ref[2][0]}, last {ref[2][-1]}, "
              f"{len(changes)} steps where they change from the previous step")
        for k, sz in [(k, v[2]) for k, v in others.items()] + [("detr-c", ours_sizes)]:
            diff = [s for s in range(args.steps) if sz[s] != ref[2][s]]
            print(f"    {k}: sizes differ from the reference at {len(diff)} steps" +
                  (f" (first {diff[0]}: {sz[diff[0]]} vs {ref[2][diff[0]]})" if diff else ""))
    print(f"  wall: reference {t_ref:.1f} s a run, detr-c {t_ours:.1f} s")
    print(f"  command: {cmd}")
    ok = not outside and not wfail
    print("PASS" if ok else "FAIL")
    result = {"family": name, "steps": args.steps, "reference": L.tolist(), "detr_c": ours_loss.tolist(),
               "drift": {k: v.tolist() for k, v in drift.items()}, "band": band.tolist(),
               "reference_grad_norm": ref[1].tolist(), "detr_c_grad_norm": ours_norm.tolist(),
               "worst_step": worst, "worst_ratio": float(ratio[worst]), "outside": outside,
               "weights": [[n, d, sp] for _, n, d, sp in wrows], "weights_outside": wfail,
               "cluster_sizes": ref[2], "detr_c_cluster_sizes": ours_sizes, "wall_reference_s": t_ref, "wall_detr_c_s": t_ours,
               "ok": ok}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if args.chart:
        draw_chart(result, args.chart, args.chart_tool)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
