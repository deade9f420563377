#!/usr/bin/env python3
"""Accuracy parity over whole runs (issue #58 part 2): the main job's task trained to the end by detr-c and by
the official code, seed by seed, each side's best checkpoint evaluated by the same COCO evaluation
(`detr cocoeval`, checked against pycocotools by tools/check_cocoeval.py).

The task is the main job's (tools/main_job_config.sh): its synthetic set, its model, its schedule (7 epochs,
lr 2e-4, backbone 5e-5, lr x0.1 after 5, batch 4, AdamW with weight decay 1e-4, clipping 0.1, an evaluation
after every epoch, the best by AP kept), its image sizes (shortest side 160, longest at most 224) and its
augmentation (DETR's: flip, then the multi-scale resize or the resize-crop-resize, every size x 160/800).
The families, each with the encoder in ENACT's official form so that both sides run the same math:
  conditional_enact  Conditional DETR + ENACT: GSavathrakis/ENACT's Conditional-DETR-ENACT (the main job's
                     decoder)
  detr_enact         DETR's dense decoder + ENACT: GSavathrakis/ENACT's DETR-ENACT
The official side runs its own code unchanged: its main.py's argument parser, build_model, datasets.coco
(CocoDetection, ConvertCocoPolysToMask, its transforms.py classes), collate_fn, RandomSampler / BatchSampler
(drop_last) and DataLoader (its 2 workers), engine.train_one_epoch (forward, SetCriterion, clip_grad_norm_,
AdamW) and StepLR, seeded as its main.py seeds. What the official code writes down for COCO and R50 is given
the main job's values by the least change that does it, each named here:
  - make_coco_transforms' numbers (scales 480..800, max 1333, 400/500/600, crop 384-600, val 800) are the main
    job's (each x 0.2, rounded half away from 0 as detr-c rounds them; max 224), with the same T classes;
  - num_classes (91 for 'coco' in its build) is 14, the main job's (category ids up to 13), by the module's
    model and SetCriterion classes called with 14;
  - the backbone is the main job's narrow ResNet-18 (16 channels at the stem, stopped after layer3:
    write_reference_fixtures.narrow_resnet) and, where torchvision would download ImageNet weights, loads the
    backbone `detr pretrain` wrote for this seed (the same file detr-c starts from); every stage trains, as
    the main job's frozen_stages=0 does (the official Backbone freezes the stem and layer1);
  - Conditional DETR's gen_sineembed_for_position writes hidden_dim / 2 = 128 down: it gets 64 for hidden 128.
The official main.py keeps only its last checkpoint; here each epoch's val detections are written, scored by
`detr cocoeval`, and the best epoch's (by AP, as detr-c keeps best.safetensors) are the run's result. An
interrupted reference run resumes from its last finished epoch (model, optimizer, StepLR, best so far).

  python3 -m venv --system-site-packages V && V/bin/pip install pycocotools   # the official datasets/coco.py
  V/bin/python tools/parity_accuracy.py --enact-root ENACT_CHECKOUT [--family conditional_enact|detr_enact|all]
      [--seeds 1 2 3] [--sides detr-c reference] [--detr build-main/detr] [--work runs/parity-accuracy]
      [--epochs 7] [--threads 2] [--pretrain-only | --report-only]

--pretrain-only writes the data set and the seeds' backbones and stops (do it first when several of these run
side by side: they would pretrain the same seed at once). --threads: each run's threads (OMP_NUM_THREADS for
detr-c, torch.set_num_threads for the official code).

Each finished run leaves WORK/FAMILY/seedS/SIDE/result.json (AP, AP50, the best epoch, the wall time); the
table (per seed, means, ranges, and the judgement: mean AP50 within 0.03, each side's values overlapping the
other's range) is printed and written to WORK/report.md and WORK/report.json from whatever has finished.
A rerun skips what is finished and resumes what is not.
"""
import argparse
import functools
import json
import math
import os
import shlex
import subprocess
import sys
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
FAMILIES = {  # the ENACT checkout's folder, detr-c's decoder
    "conditional_enact": ("Conditional-DETR-ENACT", "conditional"),
    "detr_enact": ("DETR-ENACT", "detr"),
}


@functools.lru_cache(maxsize=None)
def main_job_config():
    """The main job's data set, model flags, training flags and pretraining passes, read once from
    tools/main_job_config.sh."""
    script = (f"source {shlex.quote(os.path.join(TOOLS, 'main_job_config.sh'))}; printf '%s\\0%s\\0%s\\0%s' "
              "\"$main_data\" \"$main_model\" \"$main_train_flags\" \"$main_pretrain_epochs\"")
    data, model, flags, pretrain_epochs = subprocess.run(["bash", "-c", script], check=True, capture_output=True,
                                                         text=True).stdout.split("\0")
    return data, model.split(), flags.split(), pretrain_epochs


@functools.lru_cache(maxsize=None)
def lr_drop(epochs):
    """The main job's learning-rate drop for a run of this many epochs (main_lr_drop)."""
    script = f"source {shlex.quote(os.path.join(TOOLS, 'main_job_config.sh'))}; main_lr_drop {int(epochs)}"
    return subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout.strip()


def main_job_settings():
    """What the official side is given of the main job: its --set values (over the `tiny` preset's, which sets
    4 heads and 2 encoder layers) and its training flags' values, by name."""
    _, model, flags, _ = main_job_config()
    assert model[:2] == ["--config", "tiny"], model
    sets = dict(nheads="4", enc_layers="2")
    sets.update(model[i + 1].split("=", 1) for i in range(len(model)) if model[i] == "--set")
    given = {flags[i].lstrip("-"): flags[i + 1] for i in range(0, len(flags), 2)}
    return sets, given


def detr_c_model_flags(family):
    """The main job's model flags with the family's decoder and ENACT's official form (sigma 3, the official
    default)."""
    _, model, _, _ = main_job_config()
    flags = []
    for word in model:
        flags.append("decoder=" + FAMILIES[family][1] if word.startswith("decoder=") else word)
    return flags + ["--set", "encoder_attn=enact_official"]


def scaled(x, image_size):
    """detr-c's aug_config_scaled: x * image_size / 800, rounded half away from 0 (lround)."""
    return int(math.floor(x * image_size / 800 + 0.5))


def timed(cmd, log, env=None):
    """Runs cmd with its output appended to log; returns its wall seconds (raises on failure)."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, env=env)
    return time.time() - t0


def add_wall(path, seconds):
    """Wall seconds accumulate over the launches of a run (an interrupted run is resumed)."""
    total = seconds + (json.load(open(path))["wall_s"] if os.path.exists(path) else 0.0)
    json.dump({"wall_s": total}, open(path, "w"))
    return total


def cocoeval(args, results, out):
    data = main_job_config()[0]
    ann = os.path.join(ROOT, data, "annotations", "instances_val.json")
    subprocess.run([args.detr, "cocoeval", "--ann", ann, "--results", results, "--json", out], check=True,
                   capture_output=True)
    return json.load(open(out))


def pretrain(args, seed):
    """The seed's backbone, pretrained by `detr pretrain` as the main job does; both sides start from it. The
    main job's data set is written first unless it is there (main_make_data)."""
    path = os.path.join(args.work, f"backbone-seed{seed}.safetensors")
    if not os.path.exists(path):
        data, model, _, epochs = main_job_config()
        subprocess.run(["bash", "-c", f"cd {shlex.quote(ROOT)} && source tools/main_job_config.sh && "
                        f"main_make_data {shlex.quote(args.detr)}"], check=True)
        timed([args.detr, "pretrain", "--data", os.path.join(ROOT, data), "--out", path, *model, "--epochs", epochs,
               "--seed", str(seed)], path + ".log")
    return path


def run_detr_c(args, family, seed, out):
    """`detr train` as tools/main.sh runs it (the family's decoder, ENACT's official form), then `detr eval`
    of its best checkpoint as tools/main.sh evaluates it (batches of 4), its detections scored by cocoeval."""
    data, _, train_flags, _ = main_job_config()
    data = os.path.join(ROOT, data)
    backbone = pretrain(args, seed)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if not os.path.exists(os.path.join(out, "trained")):
        wall = timed([args.detr, "train", "--data", data, "--out", os.path.join(out, "run"),
                      *detr_c_model_flags(family), "--init-backbone", backbone, *train_flags, "--lr-drop",
                      lr_drop(args.epochs), "--epochs", str(args.epochs), "--eval-every", "1", "--seed", str(seed),
                      "--resume", "auto", "--no-progress"], os.path.join(out, "log.txt"), env)
        add_wall(os.path.join(out, "wall.json"), wall)
        open(os.path.join(out, "trained"), "w").close()
    results = os.path.join(out, "results.json")
    _, given = main_job_settings()
    timed([args.detr, "eval", "--checkpoint", os.path.join(out, "run", "best.safetensors"), "--data", data,
           "--results", results, "--image-size", given["image-size"], "--max-size", given["max-size"], "--batch",
           given["batch"]], os.path.join(out, "log.txt"), env)
    best_epoch = max((json.loads(line) for line in open(os.path.join(out, "run", "metrics.jsonl"))
                      if '"type": "eval"' in line), key=lambda m: m["AP"])["epoch"]
    return results, best_epoch


def run_reference(args, family, seed, out):
    """This script's --reference-run in the venv's Python (a fresh interpreter: the official repository's
    top-level `models`, `util` and `datasets` packages)."""
    backbone = pretrain(args, seed)
    os.makedirs(out, exist_ok=True)
    if not os.path.exists(os.path.join(out, "trained")):  # its wall.json is written epoch by epoch
        timed([sys.executable, os.path.abspath(__file__), "--reference-run", "--family", family, "--seed", str(seed),
               "--enact-root", args.enact_root, "--backbone", backbone, "--out", out, "--epochs", str(args.epochs),
               "--threads", str(args.threads), "--detr", args.detr], os.path.join(out, "log.txt"))
        open(os.path.join(out, "trained"), "w").close()
    state = json.load(open(os.path.join(out, "best.json")))
    return os.path.join(out, "best_results.json"), state["best_epoch"]


def run_one(args, family, seed, side):
    out = os.path.join(args.work, family, f"seed{seed}", side)
    done = os.path.join(out, "result.json")
    if os.path.exists(done):
        return json.load(open(done))
    print(f"parity_accuracy: {family} seed {seed} {side} ...", flush=True)
    try:
        results, best_epoch = (run_detr_c if side == "detr-c" else run_reference)(args, family, seed, out)
    except subprocess.CalledProcessError as e:
        sys.exit(f"parity_accuracy: {family} seed {seed} {side}: {os.path.basename(e.cmd[0])} exited with "
                 f"{e.returncode}; its output is in {os.path.join(out, 'log.txt')} (the pretraining's: "
                 f"{os.path.join(args.work, f'backbone-seed{seed}.safetensors.log')}); a rerun resumes")
    metrics = cocoeval(args, results, os.path.join(out, "cocoeval.json"))
    result = dict(AP=metrics["AP"], AP50=metrics["AP50"], best_epoch=best_epoch,
                  wall_s=json.load(open(os.path.join(out, "wall.json")))["wall_s"])
    json.dump(result, open(done, "w"), indent=1)
    print(f"parity_accuracy: {family} seed {seed} {side}: AP {result['AP']:.3f} AP50 {result['AP50']:.3f} "
          f"(epoch {best_epoch + 1}), {result['wall_s'] / 60:.1f} min", flush=True)
    return result


def epoch_curves(args, family, side, by_seed):
    """The mean val AP50 after each epoch over the seeds in by_seed (detr-c's metrics.jsonl eval lines, the
    reference's log.jsonl)."""
    per_seed = []
    for seed in by_seed:
        out = os.path.join(args.work, family, f"seed{seed}", side)
        if side == "detr-c":
            lines = [json.loads(line) for line in open(os.path.join(out, "run", "metrics.jsonl"))
                     if '"type": "eval"' in line]
        else:
            lines = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
        by_epoch = {m["epoch"]: m["AP50"] for m in lines}  # a resumed run may log an epoch again: the last
        per_seed.append([by_epoch[e] for e in sorted(by_epoch)])
    n = min(len(c) for c in per_seed)
    return [sum(c[e] for c in per_seed) / len(per_seed) for e in range(n)]


def report(args):
    """The table from every finished run: per seed, means and ranges, and the judgement."""
    lines, summary = [], {}
    for family in FAMILIES:
        rows = {}
        for side in ("detr-c", "reference"):
            for seed in args.seeds:
                path = os.path.join(args.work, family, f"seed{seed}", side, "result.json")
                if os.path.exists(path):
                    rows.setdefault(side, {})[seed] = json.load(open(path))
        if not rows:
            continue
        lines += [f"### {family}", "", "| side | seed | AP | AP50 | best epoch | wall (min) |",
                  "|---|---|---|---|---|---|"]
        stats = {}
        for side, by_seed in rows.items():
            for seed, r in sorted(by_seed.items()):
                lines.append(f"| {side} | {seed} | {r['AP']:.3f} | {r['AP50']:.3f} | {r['best_epoch'] + 1} | "
                             f"{r['wall_s'] / 60:.1f} |")
            ap50 = [r["AP50"] for r in by_seed.values()]
            ap = [r["AP"] for r in by_seed.values()]
            wall = [r["wall_s"] for r in by_seed.values()]
            stats[side] = dict(n=len(ap50), AP50_mean=sum(ap50) / len(ap50), AP50_min=min(ap50), AP50_max=max(ap50),
                               AP_mean=sum(ap) / len(ap), AP_min=min(ap), AP_max=max(ap),
                               wall_mean_s=sum(wall) / len(wall))
            s = stats[side]
            lines.append(f"| {side} | mean (range) over {s['n']} | {s['AP_mean']:.3f} ({s['AP_min']:.3f}-"
                         f"{s['AP_max']:.3f}) | {s['AP50_mean']:.3f} ({s['AP50_min']:.3f}-{s['AP50_max']:.3f}) | | "
                         f"{s['wall_mean_s'] / 60:.1f} |")
        curves = {side: epoch_curves(args, family, side, by_seed) for side, by_seed in rows.items()}
        epochs = max(len(c) for c in curves.values())
        lines += ["", "Val AP50 after each epoch, the mean over the finished seeds:", "",
                  "| side | " + " | ".join(str(e + 1) for e in range(epochs)) + " |", "|---" * (epochs + 1) + "|"]
        for side, c in curves.items():
            lines.append(f"| {side} | " + " | ".join(f"{v:.3f}" for v in c) + " |")
        if len(stats) == 2:
            a, b = stats["detr-c"], stats["reference"]
            diff = a["AP50_mean"] - b["AP50_mean"]
            overlap = a["AP50_min"] <= b["AP50_max"] and b["AP50_min"] <= a["AP50_max"]
            stats["judged"] = dict(AP50_mean_diff=diff, within_0_03=abs(diff) <= 0.03, ranges_overlap=overlap,
                                   complete=a["n"] == b["n"] == len(args.seeds))
            lines += ["", f"detr-c's mean AP50 minus the reference's: {diff:+.3f} (judged: within 0.03: "
                      f"{'yes' if abs(diff) <= 0.03 else 'NO'}; ranges overlap: {'yes' if overlap else 'NO'}"
                      f"{'' if stats['judged']['complete'] else '; not all seeds finished'})."]
        lines.append("")
        summary[family] = dict(runs={side: {str(k): v for k, v in r.items()} for side, r in rows.items()}, **stats)
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.work, exist_ok=True)
    open(os.path.join(args.work, "report.md"), "w").write(text + "\n")
    json.dump(summary, open(os.path.join(args.work, "report.json"), "w"), indent=1)
    return summary


# --- the official side, in its own interpreter ---------------------------------------------------------------

def reference_run(args):
    """One official run (in its own interpreter). The wall time of each finished epoch, the start-up before the
    first one included, is added to wall.json as it finishes: an interrupted epoch, done again on resume, is
    not counted twice."""
    started = time.time()
    import random

    import numpy as np
    import torch
    import torchvision

    sys.path.insert(0, TOOLS)
    import parity_enact_official
    import parity_step
    import write_reference_fixtures as wrf

    torch.set_num_threads(args.threads)
    folder, decoder = FAMILIES[args.family]
    repo = os.path.join(args.enact_root, folder)
    parity_enact_official.stub_matplotlib()  # the official enact.py imports it for its plotting helpers
    parity_step.torch_1x_names()
    sys.path.insert(0, repo)
    import datasets.coco as coco_mod
    import datasets.transforms as T
    import main as official_main
    import models.transformer as transformer_mod
    import util.misc as utils
    from engine import train_one_epoch
    from models import build_model

    model_mod = sys.modules["models.conditional_detr" if decoder == "conditional" else "models.detr"]
    sets, given = main_job_settings()
    assert sets["frozen_stages"] == "0" and sets["dropout"] == "0", sets  # what is given below
    num_classes, hidden = int(sets["num_classes"]), int(sets["hidden_dim"])
    image_size, max_size = int(given["image-size"]), int(given["max-size"])

    # The narrow backbone, "pretrained" with the seed's detr-c backbone; all stages trained (below).
    wrf.WIDTH, wrf.LAYERS = int(sets["backbone_width"]), int(sets["backbone_layers"])
    wrf.patch_backbone(repo, True, False)
    narrow = torchvision.models.resnet18
    weights = parity_step.read_safetensors(args.backbone)
    prefix = "backbone.0.body."

    def pretrained_resnet18(*, pretrained=False, **kw):
        net = narrow(**kw)
        if pretrained:
            state = {k[len(prefix):]: torch.from_numpy(v.copy()) for k, v in weights.items() if k.startswith(prefix)}
            missing, unexpected = net.load_state_dict(state, strict=False)
            assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
        return net

    torchvision.models.resnet18 = pretrained_resnet18

    class Model(getattr(model_mod, "ConditionalDETR" if decoder == "conditional" else "DETR")):
        def __init__(self, *a, num_classes, **k):
            super().__init__(*a, num_classes=num_classes, **k)

    class Criterion(model_mod.SetCriterion):
        def __init__(self, num_classes, *a, **k):
            super().__init__(num_classes, *a, **k)

    setattr(model_mod, Model.__mro__[1].__name__, Model)
    model_mod.SetCriterion = Criterion
    if decoder == "conditional":
        transformer_mod.gen_sineembed_for_position = parity_step.sine_embed_for_position(hidden // 2)

    def make_coco_transforms(image_set):  # the official function with the main job's numbers
        normalize = T.Compose([T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        scales = [scaled(s, image_size) for s in [480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800]]
        if image_set == "train":
            return T.Compose([
                T.RandomHorizontalFlip(),
                T.RandomSelect(
                    T.RandomResize(scales, max_size=max_size),
                    T.Compose([
                        T.RandomResize([scaled(s, image_size) for s in (400, 500, 600)]),
                        T.RandomSizeCrop(scaled(384, image_size), scaled(600, image_size)),
                        T.RandomResize(scales, max_size=max_size),
                    ])
                ),
                normalize,
            ])
        return T.Compose([T.RandomResize([scaled(800, image_size)], max_size=max_size), normalize])

    coco_mod.make_coco_transforms = make_coco_transforms

    # The official layout (train2017, val2017, annotations/instances_*2017.json) as links to the synthetic set.
    data = main_job_config()[0]
    coco = os.path.join(args.out, "coco")
    os.makedirs(os.path.join(coco, "annotations"), exist_ok=True)
    for split in ("train", "val"):
        for link, target in ((os.path.join(coco, f"{split}2017"), os.path.join(ROOT, data, split)),
                             (os.path.join(coco, "annotations", f"instances_{split}2017.json"),
                              os.path.join(ROOT, data, "annotations", f"instances_{split}.json"))):
            if not os.path.lexists(link):
                os.symlink(target, link)

    official = official_main.get_args_parser().parse_args([
        "--lr", given["lr"], "--lr_backbone", given["lr-backbone"], "--batch_size", given["batch"],
        "--epochs", str(args.epochs), "--lr_drop", lr_drop(args.epochs), "--backbone", "resnet18",
        "--enc_layers", sets["enc_layers"], "--dec_layers", sets["dec_layers"], "--dim_feedforward", sets["ffn_dim"],
        "--hidden_dim", sets["hidden_dim"], "--dropout", sets["dropout"], "--nheads", sets["nheads"],
        "--num_queries", sets["num_queries"], "--device", "cpu", "--coco_path", coco, "--seed", str(args.seed),
        "--output_dir", args.out])
    official.distributed = False
    print(official, flush=True)

    # main.py's order: the seeds, the model, the optimizer, the data.
    torch.manual_seed(official.seed)
    np.random.seed(official.seed)
    random.seed(official.seed)
    model, criterion, postprocessors = build_model(official)
    for p in model.backbone.parameters():  # frozen_stages=0: the stem and layer1 train too
        p.requires_grad_(True)
    param_dicts = [
        {"params": [p for n, p in model.named_parameters() if "backbone" not in n and p.requires_grad]},
        {"params": [p for n, p in model.named_parameters() if "backbone" in n and p.requires_grad],
         "lr": official.lr_backbone},
    ]
    optimizer = torch.optim.AdamW(param_dicts, lr=official.lr, weight_decay=official.weight_decay)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, official.lr_drop)
    dataset_train = coco_mod.build("train", official)
    if args.smoke:  # a check of the setup: the first N training images
        dataset_train = torch.utils.data.Subset(dataset_train, range(args.smoke))
    dataset_val = coco_mod.build("val", official)
    batch_sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset_train), official.batch_size,
                                                  drop_last=True)
    loader_train = torch.utils.data.DataLoader(dataset_train, batch_sampler=batch_sampler,
                                               collate_fn=utils.collate_fn, num_workers=official.num_workers)
    loader_val = torch.utils.data.DataLoader(dataset_val, official.batch_size,
                                             sampler=torch.utils.data.SequentialSampler(dataset_val), drop_last=False,
                                             collate_fn=utils.collate_fn, num_workers=official.num_workers)

    state_path, best_path = os.path.join(args.out, "checkpoint.pth"), os.path.join(args.out, "best.json")
    best = dict(best_epoch=-1, AP=-1.0)
    start = 0
    if os.path.exists(state_path):  # as its main.py --resume: model, optimizer, StepLR, the next epoch
        ckpt = torch.load(state_path, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        lr_scheduler.load_state_dict(ckpt["lr_scheduler"])
        start, best = ckpt["epoch"] + 1, ckpt["best"]
        torch.set_rng_state(ckpt["rng"])
        print(f"resumed after epoch {ckpt['epoch']}", flush=True)
    for epoch in range(start, official.epochs):
        t0 = time.time()
        train_stats = train_one_epoch(model, criterion, loader_train, optimizer, torch.device("cpu"), epoch,
                                      official.clip_max_norm)
        lr_scheduler.step()
        t1 = time.time()
        results = evaluate(model, postprocessors["bbox"], loader_val)
        path = os.path.join(args.out, f"results_epoch{epoch}.json")
        json.dump(results, open(path, "w"))
        metrics = cocoeval(args, path, os.path.join(args.out, "cocoeval_epoch.json"))
        if metrics["AP"] > best["AP"]:
            best = dict(best_epoch=epoch, AP=metrics["AP"], AP50=metrics["AP50"])
            os.replace(path, os.path.join(args.out, "best_results.json"))
        else:
            os.remove(path)
        line = dict(epoch=epoch, train_loss=train_stats["loss"], AP=metrics["AP"], AP50=metrics["AP50"],
                    train_s=t1 - t0, eval_s=time.time() - t1)
        print(json.dumps(line), flush=True)
        with open(os.path.join(args.out, "log.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
        torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                        lr_scheduler=lr_scheduler.state_dict(), epoch=epoch, best=best, rng=torch.get_rng_state()),
                   state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)
        add_wall(os.path.join(args.out, "wall.json"), time.time() - started)
        started = time.time()
    json.dump(best, open(best_path, "w"))


def evaluate(model, postprocess, loader):
    """engine.evaluate's detections without its CocoEvaluator: the official PostProcess at each image's original
    size, as COCO results (x, y, w, h)."""
    import torch
    model.eval()
    out = []
    with torch.no_grad():
        for samples, targets in loader:
            outputs = model(samples)
            sizes = torch.stack([t["orig_size"] for t in targets], dim=0)
            for t, r in zip(targets, postprocess(outputs, sizes)):
                for score, label, box in zip(r["scores"].tolist(), r["labels"].tolist(), r["boxes"].tolist()):
                    out.append(dict(image_id=int(t["image_id"]), category_id=label,
                                    bbox=[box[0], box[1], box[2] - box[0], box[3] - box[1]], score=score))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--enact-root", help="a GSavathrakis/ENACT checkout")
    ap.add_argument("--family", default="all", choices=list(FAMILIES) + ["all"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--sides", nargs="+", default=["detr-c", "reference"], choices=["detr-c", "reference"])
    ap.add_argument("--detr", default=os.path.join(ROOT, "build-main", "detr"))
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "parity-accuracy"))
    ap.add_argument("--epochs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--pretrain-only", action="store_true", help="pretrain the seeds' backbones and stop")
    ap.add_argument("--smoke", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--reference-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--backbone", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.detr = os.path.abspath(args.detr)
    if args.reference_run:
        return reference_run(args)
    if args.pretrain_only:
        args.work = os.path.abspath(args.work)
        os.makedirs(args.work, exist_ok=True)
        for seed in args.seeds:
            pretrain(args, seed)
        return
    if not args.report_only:
        if not args.enact_root:
            ap.error("--enact-root is needed to train")
        args.work = os.path.abspath(args.work)
        families = list(FAMILIES) if args.family == "all" else [args.family]
        for family in families:  # seed by seed, both sides: a partial run still compares like with like
            for seed in args.seeds:
                for side in args.sides:
                    run_one(args, family, seed, side)
    report(args)


if __name__ == "__main__":
    main()
