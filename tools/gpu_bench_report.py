#!/usr/bin/env python3
"""tools/gpu_bench.sh's report: its runs (one JSON object per line: the run's settings and the JSON
line bench_step or bench/torch_step.py printed) and its notes as markdown on stdout. Standard
library only (it runs with whatever Python the GPU machine has).

  python3 tools/gpu_bench_report.py --runs OUT/runs.jsonl --meta OUT/meta.txt [--elapsed S]
"""
import argparse
import csv
import json
import math
import os
import statistics

# Encoder layers and heads of the presets gpu_bench.sh runs (nn/presets.c).
ENCODER = {"detr-r50": (6, 8), "conditional-detr-r50": (6, 8), "tiny": (2, 4)}


def fmt(v, digits=0):
    return "-" if v is None else f"{v:.{digits}f}"


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def peak(rows, key):
    values = [r["result"].get(key) for r in rows if r["result"].get(key) is not None]
    return max(values) if values else None


def memory(rows, keys):
    return " / ".join(fmt(peak(rows, k)) for k in keys)


def ms(rows):
    """The median over rounds of each run's median step, in ms, and the rounds' values."""
    values = [1000 * r["result"]["median_s"] for r in rows]
    return med(values), ", ".join(f"{v:.1f}" for v in values)


def step_table(runs, gpu):
    groups = {}
    for r in runs:
        if r["section"] == "step" and r["result"]:
            groups.setdefault((r["model"], r["decoder"], r["batch"], r["hw"], r["math"]), {}).setdefault(
                "detr-c" if r["impl"] == "detr-c" else "pytorch", []).append(r)
    if not groups:
        return ["No training-step run finished."]
    if gpu:
        c_mem, t_mem = ["peak_device_mb", "peak_device_held_mb", "device_used_mb"], \
            ["max_memory_allocated_mb", "max_memory_reserved_mb", "device_used_mb"]
        c_head, t_head = "detr-c MB: allocator peak live / peak held / device in use", \
            "PyTorch MB: max allocated / max reserved / device in use"
    else:
        c_mem, t_mem = ["alloc_peak_mb", "alloc_held_peak_mb", "peak_rss_mb"], ["peak_rss_mb"]
        c_head, t_head = "detr-c MB: allocator peak live / peak held / peak RSS", "PyTorch MB: peak RSS"
    lines = [f"| model | batch | HxW | math | detr-c ms (rounds) | PyTorch ms (rounds) | detr-c / PyTorch | {c_head} | {t_head} | same inputs | first loss detr-c / PyTorch |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, decoder, batch, hw, mth), g in groups.items():
        c, t = g.get("detr-c", []), g.get("pytorch", [])
        cm, cl = ms(c) if c else (None, "")
        tm, tl = ms(t) if t else (None, "")
        cl, tl = (f" ({x})" if x else "" for x in (cl, tl))
        ratio = f"{cm / tm:.2f}" if cm and tm else "-"
        same = all(r["shared_inputs"] for r in c + t) and bool(t)
        losses = " / ".join(fmt(med([r["result"].get("first_loss") for r in g]), 3) for g in (c, t))
        lines.append(f"| {model} ({decoder}) | {batch} | {hw} | {mth} | {fmt(cm, 1)}{cl} | {fmt(tm, 1)}{tl} | {ratio} "
                     f"| {memory(c, c_mem) if c else '-'} | {memory(t, t_mem) if t else '-'} | {'yes' if same else 'no'} | {losses} |")
    return lines


def enact_table(runs, gpu):
    groups = {}
    for r in runs:
        if r["section"] == "enact" and r["result"]:
            groups.setdefault((r["model"], r["batch"], r["hw"], r["math"]), {}).setdefault(
                "enact" if r["impl"].endswith("enact") else "dense", []).append(r)
    if not groups:
        return ["No ENACT run finished."]
    live = "peak_device_mb" if gpu else "alloc_peak_mb"
    lines = ["| model | batch | HxW | math | dense ms | ENACT ms | ENACT / dense | dense peak live MB | ENACT peak live MB "
             "| ENACT saves MB (share of dense peak) | dense attention maps MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, batch, hw, mth), g in groups.items():
        d, e = g.get("dense", []), g.get("enact", [])
        dm, em = (ms(d)[0] if d else None), (ms(e)[0] if e else None)
        dp, ep = peak(d, live), peak(e, live)
        saved = f"{dp - ep:.0f} ({(dp - ep) / dp:.0%})" if dp and ep else "-"
        layers, heads = ENCODER.get(model, (6, 8))
        h, w = (int(v) for v in hw.split("x"))
        n = math.ceil(h / 32) * math.ceil(w / 32)  # the backbone's stride-32 map, unpadded
        maps = layers * batch * heads * n * n * 4 / 2**20
        lines.append(f"| {model} | {batch} | {hw} | {mth} | {fmt(dm, 1)} | {fmt(em, 1)} | "
                     f"{f'{em / dm:.2f}' if dm and em else '-'} | {fmt(dp)} | {fmt(ep)} | {saved} | {maps:.0f} |")
    lines += ["", "Dense attention maps: one fp32 `[B, heads, N, N]` softmax per encoder layer, N the pixels of the "
              "stride-32 feature map (a yardstick of what dense attention keeps for the backward, not a measurement)."]
    return lines


def convs_table(runs):
    """bench_step --conv-survey: the step's convolution time under each algorithm choice, and the
    passes where determinism costs most."""
    rows = [r for r in runs if r["section"] == "convs" and r["result"]]
    if not rows:
        return []
    lines = ["", "## The cost of deterministic cuDNN algorithms (detr-c, bench_step --conv-survey)", "",
             "Every convolution pass of one training step (geometry and direction, times its runs a step) timed by "
             "cuDNN's Find in every algorithm on zero tensors, within the workspace limit; summed over the step's "
             "passes where all four choices were timed (the others: 'passes left out'). Find's times leave out "
             "detr-c's bf16 and channels-last copies around cuDNN. "
             "Deterministic picks: detr-c's default; heuristic picks: `--cudnn-any` (DETR_CUDNN_DETERMINISTIC=0).", "",
             "| model | batch | HxW | math | passes | deterministic picks ms | heuristic picks ms | fastest ms "
             "| fastest deterministic ms | passes left out |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        res, t = r["result"], r["result"].get("step_conv_ms", {})
        lines.append(f"| {r['model']} | {r['batch']} | {r['hw']} | {r['math']} | {res.get('passes')} | "
                     f"{fmt(t.get('deterministic_picks'), 1)} | {fmt(t.get('heuristic_picks'), 1)} | "
                     f"{fmt(t.get('fastest'), 1)} | {fmt(t.get('fastest_deterministic'), 1)} | "
                     f"{res.get('passes_left_out', '-')} |")
    for r in rows:
        costliest = r["result"].get("costliest", [])
        if not costliest:
            continue
        lines += ["", f"{r['math']}: where the deterministic pick costs most (ms a step)", "",
                  "| convolution | pass | runs a step | deterministic pick | fastest | fastest algo (deterministic?) |",
                  "|---|---|---|---|---|---|"]
        for c in costliest:
            lines.append(f"| {c['conv']} | {c['pass']} | {c['calls']} | {fmt(c.get('deterministic_ms'), 2)} | "
                         f"{fmt(c.get('fastest_ms'), 2)} | {c.get('fastest_algo')} "
                         f"({'yes' if c.get('fastest_is_deterministic') else 'no'}) |")
    return lines


def read_ncu(path):
    """Nsight Compute's raw CSV (one row per kernel launch): {kernel name: [launches, total ns]}."""
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return None
    kernels = {}
    for row in csv.DictReader(lines[start:]):
        value = (row.get("gpu__time_duration.sum") or "").replace(",", "")
        if not row.get("ID") or not value:
            continue  # the units row
        k = kernels.setdefault(row.get("Kernel Name", "?"), [0, 0.0])
        k[0] += 1
        k[1] += float(value)
    return kernels


# Profiled variants: the runs whose unprofiled wall time each is compared with (section, impl, math,
# which size: the ENACT part's or the bf16 part's).
PROFILED = {"dense": ("enact", "detr-c", "fp32", "enact"), "enact": ("enact", "detr-c-enact", "fp32", "enact"),
            "bf16": ("step", "detr-c", "bf16", "step"), "tf32": ("step", "detr-c", "tf32", "step")}


def profile_tables(folder, runs, profiled, profiled_step):
    """Per variant: launches and kernel time in the profiled step against the step's wall time, the
    kernels that take the time, and bf16's conversion kernels."""
    sizes = {"enact": profiled.split(":") if profiled else ("", ""),
             "step": profiled_step.split(":") if profiled_step else ("", "")}
    lines = []
    for variant, (section, impl, precision, size) in PROFILED.items():
        path = os.path.join(folder, f"ncu-{variant}.csv")
        kernels = read_ncu(path) if os.path.isfile(path) else None
        if not kernels:
            if os.path.isfile(path):
                lines += ["", f"{variant}: ncu-{variant}.csv holds no kernel rows (see logs/ncu-{variant}.log)."]
            continue
        batch, hw = sizes[size]
        wall = med([1000 * r["result"]["median_s"] for r in runs if r["section"] == section and r["result"] and
                    r["impl"] == impl and r["math"] == precision and r["hw"] == hw and str(r["batch"]) == batch])
        launches = sum(k[0] for k in kernels.values())
        busy = sum(k[1] for k in kernels.values()) / 1e6
        share = f"{busy / wall:.0%} of the step's wall time {wall:.1f} ms (its timed runs, unprofiled)" if wall else \
            "no unprofiled run to compare with"
        lines += ["", f"### {variant} (batch {batch}, {hw}, {precision}): {launches} kernel launches, {busy:.1f} ms of kernel "
                  f"time in one step; {share}", "",
                  "| kernel | launches | total ms | share of kernel time |", "|---|---|---|---|"]
        for name, (n, ns) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:15]:
            lines.append(f"| `{name[:100].replace('|', '/')}` | {n} | {ns / 1e6:.2f} | {ns / 1e6 / busy:.1%} |")
        # detr-c's own conversions between fp32 and bf16 (the staging copies of docs/precision.md)
        conv = [(name, n, ns) for name, (n, ns) in kernels.items() if name.split("(")[0].endswith("bf16_kernel") or
                name.split("(")[0].endswith("bf16_x4_kernel")]
        if conv:
            n_all = sum(c[1] for c in conv)
            ms_all = sum(c[2] for c in conv) / 1e6
            lines += ["", f"Conversions to and from bf16 (`to_bf16`, `from_bf16`, `weight_bf16` kernels): {n_all} launches, {ms_all:.2f} ms, "
                      f"{ms_all / busy:.1%} of kernel time: " +
                      ", ".join(f"`{c[0].split('(')[0]}` {c[1]} x {c[2] / 1e6:.2f} ms" for c in sorted(conv, key=lambda c: -c[2]))]
    if lines:
        lines = ["", "## Where the GPU time goes (Nsight Compute, detr-r50)", "",
                 "Kernel durations from `ncu --metrics gpu__time_duration.sum --clock-control none` over the step after "
                 "the warm-up (`bench_step --capture`); ncu serialises kernels, so the wall-time share compares with "
                 "the unprofiled runs above. Wall time not covered by kernels is the GPU waiting: launch gaps, host "
                 "work and host round trips (the matcher, ENACT's regions)."] + lines
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--elapsed", default="?")
    ap.add_argument("--profiled", default="", help="B:HxW of the dense and ENACT profiled runs")
    ap.add_argument("--profiled-step", default="", help="B:HxW of the bf16 and TF32 profiled runs")
    args = ap.parse_args()
    meta = []
    if os.path.isfile(args.meta):
        meta = [line.rstrip("\n").split("\t", 1) for line in open(args.meta) if "\t" in line]
    runs = [json.loads(line) for line in open(args.runs)] if os.path.isfile(args.runs) else []
    gpu = any(r["result"] and r["result"].get("device") == "cuda" for r in runs) or \
        any(k == "mode" and v.startswith("GPU") for k, v in meta)
    out = ["# detr-c against PyTorch: the DETR training step (tools/gpu_bench.sh)", ""]
    out += [f"- {k}: {v}" for k, v in meta]
    out += [f"- elapsed: {args.elapsed} s; {len(runs)} runs, {sum(r['status'] == 'ok' for r in runs)} finished", ""]
    out += ["Times: the median over rounds of each process's median step (forward, loss, backward, clipping at 0.1, "
            "AdamW), after one warm-up step; each round runs detr-c and PyTorch one after the other, PyTorch first in "
            "even rounds. fp32: PyTorch with TF32 off for matmuls and cuDNN, detr-c as it runs by default; TF32: "
            "PyTorch's cuDNN default (TF32) and matmul TF32, detr-c `--set tf32=true`; bf16: PyTorch's "
            "torch.autocast(bfloat16) with TF32 off for what stays fp32, detr-c `--set bf16=true` (bf16 GEMM and "
            "convolution inputs, fp32 accumulation; docs/precision.md). Memory: the largest over "
            "rounds; 'device in use' is cudaMemGetInfo's total - free at the end (contexts, libraries and caches "
            "included; neither allocator returns memory, so it is the high-water mark). 'same inputs': both read "
            "the same weights and batch files; 'first loss': the warm-up step's total loss (both sides draw their own "
            "dropout masks, so it agrees roughly, not exactly: a check that both run the same model on the same data)."]
    if not gpu:
        out += ["", "On the CPU, fp32 and TF32 run the same math (both switches are CUDA settings): the TF32 rows "
                "exercise the path only."]
    out += ["", "## Training step", ""]
    out += step_table(runs, gpu)
    out += ["", "## ENACT against dense (detr-c)", ""]
    out += enact_table(runs, gpu)
    out += convs_table(runs)
    out += profile_tables(os.path.dirname(os.path.abspath(args.runs)), runs, args.profiled, args.profiled_step)
    out += ["", "## Runs, in order", "", "| # | section | model | batch | HxW | math | impl | round | status | s | median ms | steps ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        res = r["result"] or {}
        steps = ", ".join(f"{1000 * t:.1f}" for t in res.get("steps_s", []))
        median = fmt(1000 * res["median_s"], 1) if "median_s" in res else "-"
        out.append(f"| {r['n']} | {r['section']} | {r['model']} ({r['decoder']}) | {r['batch']} | {r['hw']} | {r['math']} | "
                   f"{r['impl']} | {r['round']} | {r['status']} | {r['secs']} | {median} | {steps} |")
    out += ["", "Logs: logs/ beside this report (each run's full output); every run's JSON: runs.jsonl."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
