#!/usr/bin/env python3
"""Compares `detr cocoeval` with pycocotools' COCOeval (iouType='bbox') on random data.

Each seed writes a random instances JSON and results JSON covering what COCOeval treats specially:
category ids with gaps (listed out of order), categories without detections and without ground
truth, detections of categories the GT does not list, GT annotations of unlisted images and
categories, crowd annotations (with detections inside them), the three area ranges (areas exactly
on their bounds, GT areas that differ from w * h), "ignore" fields, images without annotations,
images with more than 100 detections, tied scores, integer boxes (IoUs exactly on a threshold),
zero-size boxes and, in some seeds, an annotation with id 0. It then runs COCOeval and
`detr cocoeval --json`, and compares the 12 numbers (tolerance 1e-4, the largest difference is
reported) and the summary lines (exact text).

    pip install pycocotools numpy
    python3 tools/check_cocoeval.py --detr build/detr --seeds 50
    python3 tools/check_cocoeval.py --detr build/detr --seed 7 --keep /tmp/case7   # keep the files
"""
import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile

NAMES = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"]


def rand_box(rng, size, W, H, integer):
    """A box whose w * h falls in the range `size` (small / medium / large)."""
    lo, hi = {"small": (2, 31), "medium": (32, 95), "large": (96, 400)}[size]
    w, h = rng.uniform(lo, hi), rng.uniform(lo, hi)
    x, y = rng.uniform(0, max(1, W - w)), rng.uniform(0, max(1, H - h))
    if integer:
        return [float(round(x)), float(round(y)), float(max(1, round(w))), float(max(1, round(h)))]
    return [round(x, 2), round(y, 2), round(w, 2), round(h, 2)]


def jitter(rng, box, amount, integer):
    x, y, w, h = box
    dx, dy = rng.uniform(-amount, amount) * w, rng.uniform(-amount, amount) * h
    dw, dh = rng.uniform(-amount, amount) * w, rng.uniform(-amount, amount) * h
    out = [x + dx, y + dy, max(0.5, w + dw), max(0.5, h + dh)]
    return [float(round(v)) for v in out] if integer else [round(v, 3) for v in out]


def make_case(seed, scale=1.0):
    rng = random.Random(seed)
    n_cats = rng.randint(1, 8)
    cat_ids = rng.sample(range(1, 91), n_cats)  # gaps, file order unsorted
    gt_cats = [c for c in cat_ids if rng.random() < 0.8] or cat_ids[:1]  # the rest have no GT
    det_cats = [c for c in cat_ids if rng.random() < 0.85] or cat_ids[:1]  # the rest no detections
    unlisted_cat = next(c for c in range(91, 200) if c not in cat_ids)
    n_images = max(1, int(rng.randint(1, 40) * scale))
    image_ids = rng.sample(range(1, 10**6), n_images)
    integer = rng.random() < 0.5
    tie_levels = rng.choice([None, None, 3, 10])  # quantized scores: many ties
    images, anns, dets = [], [], []

    def score():
        s = rng.random()
        return round(s * tie_levels) / tie_levels if tie_levels else s

    for img_id in image_ids:
        W, H = rng.randint(64, 640), rng.randint(64, 640)
        images.append({"id": img_id, "width": W, "height": H, "file_name": f"{img_id:012d}.jpg"})
        n_gt = 0 if rng.random() < 0.15 else rng.randint(1, 15)
        img_gts = []
        for _ in range(n_gt):
            size = rng.choice(["small", "medium", "large"])
            box = rand_box(rng, size, W, H, integer)
            crowd = rng.random() < 0.1
            if crowd:
                box = rand_box(rng, "large", W, H, integer)
            area = box[2] * box[3]
            r = rng.random()
            if r < 0.3:
                area *= rng.uniform(0.4, 1.0)  # a segmentation's area, smaller than its box
            elif r < 0.35:
                area = rng.choice([1024, 9216, 1024.0, 32 * 32 - 1e-9, 96 * 96 + 1e-9])
            x, y, w, h = box
            a = {"image_id": img_id, "category_id": rng.choice(gt_cats), "bbox": box, "area": area,
                 "iscrowd": int(crowd), "segmentation": [[x, y, x + w, y, x, y + h]]}
            if rng.random() < 0.1:
                a["ignore"] = rng.randint(0, 1)
            if rng.random() < 0.02:
                a["bbox"][2] = 0.0  # zero-size GT box
            anns.append(a)
            img_gts.append(a)
        # Detections: jittered copies of the GTs (some exact, some of another category), random
        # false positives, several inside crowd regions, and > 100 on some images.
        for g in img_gts:
            for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
                cat = g["category_id"] if rng.random() < 0.85 else rng.choice(det_cats)
                if cat not in det_cats:
                    continue
                if rng.random() < 0.15:
                    box = list(g["bbox"])
                else:
                    box = jitter(rng, g["bbox"], rng.choice([0.05, 0.15, 0.4]), integer)
                if g["iscrowd"]:
                    x, y, w, h = g["bbox"]
                    box = [x + rng.uniform(0, w / 2), y + rng.uniform(0, h / 2),
                           rng.uniform(5, w / 2), rng.uniform(5, h / 2)]
                dets.append({"image_id": img_id, "category_id": cat, "bbox": box, "score": score()})
        n_fp = rng.randint(110, 180) if rng.random() < 0.1 else rng.randint(0, 8)
        for _ in range(n_fp):
            box = rand_box(rng, rng.choice(["small", "medium", "large"]), W, H, integer)
            if rng.random() < 0.02:
                box[3] = 0.0  # zero-size detection
            dets.append({"image_id": img_id, "category_id": rng.choice(det_cats), "bbox": box, "score": score()})
    if rng.random() < 0.3:  # pycocotools leaves these out
        dets.append({"image_id": image_ids[0], "category_id": unlisted_cat, "bbox": [1, 1, 10, 10], "score": 0.99})
    if rng.random() < 0.3:
        anns.append({"image_id": image_ids[0], "category_id": unlisted_cat, "bbox": [1, 1, 10, 10], "area": 100,
                     "iscrowd": 0})
        anns.append({"image_id": max(image_ids) + 1, "category_id": cat_ids[0], "bbox": [1, 1, 10, 10], "area": 100,
                     "iscrowd": 0})
    rng.shuffle(anns)
    rng.shuffle(dets)
    rng.shuffle(images)
    first_id = 0 if rng.random() < 0.1 else 1  # id 0: a quirk of pycocotools (see eval/cocoeval.h)
    for i, a in enumerate(anns):
        a["id"] = first_id + i
    if not dets:  # COCO.loadRes cannot read an empty results list
        dets.append({"image_id": image_ids[0], "category_id": det_cats[0], "bbox": [0, 0, 8, 8], "score": 0.5})
    cats = [{"id": c, "name": f"c{c}", "supercategory": "s"} for c in cat_ids]
    gt = {"info": {"description": f"check_cocoeval seed {seed}"}, "licenses": [], "images": images,
          "annotations": anns, "categories": cats}
    return gt, dets


def run_pycocotools(gt_path, res_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gt = COCO(gt_path)
        dt = gt.loadRes(res_path)
        ev = COCOeval(gt, dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    lines = [l for l in out.getvalue().splitlines() if l.startswith(" Average")]
    return [float(v) for v in ev.stats], lines


def check(detr, seed, scale, folder):
    gt, dets = make_case(seed, scale)
    gt_path, res_path, out_path = (os.path.join(folder, n) for n in ("gt.json", "res.json", "stats.json"))
    with open(gt_path, "w") as f:
        json.dump(gt, f)
    with open(res_path, "w") as f:
        json.dump(dets, f)
    ref, ref_lines = run_pycocotools(gt_path, res_path)
    p = subprocess.run([detr, "cocoeval", "--ann", gt_path, "--results", res_path, "--json", out_path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"seed {seed}: detr cocoeval failed ({p.returncode}): {p.stderr}")
    with open(out_path) as f:
        ours = json.load(f)
    diffs = [abs(ours[n] - r) for n, r in zip(NAMES, ref)]
    lines = [l for l in p.stdout.splitlines() if l.startswith(" Average")]
    info = (f"{len(gt['images'])} images, {len(gt['categories'])} categories, "
            f"{len(gt['annotations'])} anns, {len(dets)} dets")
    return max(diffs), lines == ref_lines, ref, [ours[n] for n in NAMES], info, (ref_lines, lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--detr", default="build/detr", help="the detr binary")
    ap.add_argument("--seeds", type=int, default=50, help="check seeds [start, start + seeds)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, help="check this one seed")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the number of images")
    ap.add_argument("--keep", help="write the files of the (last) seed here")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    worst, worst_seed, failed = 0.0, None, []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            folder = args.keep or tmp
            if args.keep:
                os.makedirs(folder, exist_ok=True)
            diff, same_text, ref, ours, info, texts = check(args.detr, seed, args.scale, folder)
        ok = diff <= args.tol and same_text
        print(f"seed {seed:4d}: {info}: max |diff| {diff:.3g}{'' if same_text else ', summary text differs'}"
              f"{'' if ok else '  FAIL'}")
        if not ok:
            failed.append(seed)
            for n, r, o in zip(NAMES, ref, ours):
                print(f"    {n:6s} pycocotools {r: .6f}  detr {o: .6f}")
            if not same_text:
                print("\n".join(["    pycocotools:"] + texts[0] + ["    detr:"] + texts[1]))
        if diff >= worst:
            worst, worst_seed = diff, seed
    print(f"{len(seeds)} seeds, max |diff| over all 12 numbers: {worst:.3g} (seed {worst_seed}); "
          f"{'all passed' if not failed else f'FAILED: seeds {failed}'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
