#!/usr/bin/env python3
"""tools/bench_checkpoint.py — what a checkpoint of a run costs: seconds per
checkpoint (summary.json's checkpoints.seconds over the checkpoints written),
against the median step time of the same run, and bytes on disk.

Runs `ddp run CONFIG --set run.steps=N --set checkpoint.every=K` R times (a
fresh output directory each time) and prints a Markdown table: median and
min–max over the runs.

usage: tools/bench_checkpoint.py [--config configs/lm-cpu.toml] [--steps 12]
                                 [--every 4] [--rounds 3] [--ddp build/bin/ddp]
                                 [--vs OTHER_DDP]

--vs: an A/B comparison: each round runs both binaries, in alternating
order, and a last row gives the ratio of their seconds per checkpoint
(OTHER / --ddp), median and range over the rounds.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def one_run(args, out):
    cmd = [args.ddp, "run", args.config, "--set", f"run.steps={args.steps}",
           "--set", f"checkpoint.every={args.every}", "--set", f'run.output_dir="{out}"',
           "--set", f"run.log_every={args.steps}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    done = summary["checkpoints"]["after_steps"]
    per = summary["checkpoints"]["seconds"] / len(done)
    step = statistics.median(summary["step_time_s"])
    last = os.path.join(out, "checkpoints", "step-%08d" % done[-1])
    size = sum(os.path.getsize(os.path.join(last, f)) for f in os.listdir(last))
    return per, step, size


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/lm-cpu.toml")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ddp", default="build/bin/ddp")
    p.add_argument("--vs", default=None)
    args = p.parse_args()
    binaries = [args.ddp] + ([args.vs] if args.vs else [])
    results = {b: ([], [], [], 0) for b in binaries}
    base = tempfile.mkdtemp(prefix="ddp-bench-checkpoint-")
    try:
        for r in range(args.rounds):
            for i, b in enumerate(binaries) if r % 2 == 0 else reversed(list(enumerate(binaries))):
                out = os.path.join(base, f"{r}-{i}")
                c, s, size = one_run(argparse.Namespace(**{**vars(args), "ddp": b}), out)
                per, step, ratio, _ = results[b]
                per.append(c), step.append(s), ratio.append(c / s)
                results[b] = (per, step, ratio, size)
                print(f"round {r + 1} {b}: {c:.3f} s per checkpoint, step {s:.3f} s", file=sys.stderr)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("| ddp | config | checkpoint | s per checkpoint | median step s | checkpoint / step |")
    print("|---|---|---|---|---|---|")
    for b, (per, step, ratio, size) in results.items():
        print(f"| {b} | {args.config} | {size / 1e6:.1f} MB | {spread(per, lambda x: f'{x:.3f}')} | "
              f"{spread(step, lambda x: f'{x:.3f}')} | {spread(ratio, lambda x: f'{x:.2f}')} |")
    if args.vs:
        a, b = results[args.ddp][0], results[args.vs][0]
        print(f"\n{args.vs} / {args.ddp}, seconds per checkpoint, per round: "
              f"{spread([y / x for x, y in zip(a, b)], lambda x: f'{x:.3f}')}")


if __name__ == "__main__":
    main()
