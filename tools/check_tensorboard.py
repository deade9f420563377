#!/usr/bin/env python3
"""A `detr train` run's TensorBoard events, read by TensorBoard's own reader, against its metrics.jsonl.

    python3 tools/check_tensorboard.py RUN_DIR [RUN_DIR ...]

For each run directory: EventAccumulator (tensorboard.backend.event_processing, every event kept,
orphaned data purged as TensorBoard does) must hold, for every row of metrics.jsonl and every
number in it but the row's step, epoch and batch, the scalar "<type>/<key>" at the row's step
with the value the row prints (as float32, which TensorBoard stores); each step once; no scalar
that metrics.jsonl lacks; and at every evaluation step at least one "eval/predictions/..." image,
a PNG of the size its summary states. Exit status 0 when all match, 1 naming the first
differences, 77 (ctest's skip) when the `tensorboard` package is not installed.
"""
import json
import os
import struct
import sys

SKIP = 77
INDEX_KEYS = ("type", "step", "epoch", "batch")


def float32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def expected_scalars(metrics_path):
    """{tag: {step: value}} from metrics.jsonl; the steps of its evaluations."""
    want, eval_steps = {}, []
    with open(metrics_path) as f:
        for n, line in enumerate(f, 1):
            row = json.loads(line)
            step = row["step"]
            if row["type"] == "eval":
                eval_steps.append(step)
            for key, value in row.items():
                if key in INDEX_KEYS or not isinstance(value, (int, float)):
                    continue
                tag = "%s/%s" % (row["type"], key)
                if step in want.setdefault(tag, {}):
                    raise SystemExit("%s:%d: %s at step %d twice in metrics.jsonl" % (metrics_path, n, tag, step))
                want[tag][step] = float32(float(value))
    return want, eval_steps


def check_run(run, event_accumulator):
    problems = []
    want, eval_steps = expected_scalars(os.path.join(run, "metrics.jsonl"))
    acc = event_accumulator.EventAccumulator(
        run, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in sorted(set(tags["scalars"]) - set(want)):
        problems.append("%s: scalar %s is not in metrics.jsonl" % (run, tag))
    for tag, by_step in sorted(want.items()):
        if tag not in tags["scalars"]:
            problems.append("%s: no scalar %s (metrics.jsonl has it at %d steps)" % (run, tag, len(by_step)))
            continue
        seen = {}
        for ev in acc.Scalars(tag):
            if ev.step in seen:
                problems.append("%s: %s at step %d twice" % (run, tag, ev.step))
            seen[ev.step] = ev.value
        if sorted(seen) != sorted(by_step):
            problems.append("%s: %s at steps %s, metrics.jsonl at %s" % (run, tag, sorted(seen), sorted(by_step)))
        for step, value in sorted(by_step.items()):
            if step in seen and seen[step] != value:
                problems.append("%s: %s at step %d is %r, metrics.jsonl %r" % (run, tag, step, seen[step], value))
    pictures = [t for t in tags["images"] if t.startswith("eval/predictions/")]
    for step in eval_steps:
        at_step = [ev for t in pictures for ev in acc.Images(t) if ev.step == step]
        if not at_step:
            problems.append("%s: no eval/predictions image at evaluation step %d" % (run, step))
        for ev in at_step:
            png = ev.encoded_image_string
            if png[:8] != b"\x89PNG\r\n\x1a\n" or struct.unpack(">II", png[16:24]) != (ev.width, ev.height):
                problems.append("%s: an image at step %d is not a %dx%d PNG" % (run, step, ev.width, ev.height))
    n_scalars = sum(len(v) for v in want.values())
    return problems, n_scalars, len(eval_steps)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        print("check_tensorboard: skipped: the tensorboard package is not installed for %s (%s): "
              "pip install tensorboard" % (sys.executable, e))
        return SKIP
    status = 0
    for run in sys.argv[1:]:
        problems, n_scalars, n_evals = check_run(run, event_accumulator)
        for p in problems[:20]:
            print("check_tensorboard: " + p)
        if problems:
            status = 1
            print("check_tensorboard: %s: %d differences" % (run, len(problems)))
        else:
            print("check_tensorboard: %s: %d scalars match metrics.jsonl, images at each of %d evaluations"
                  % (run, n_scalars, n_evals))
    return status


if __name__ == "__main__":
    sys.exit(main())
