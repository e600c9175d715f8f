#!/usr/bin/env python3
"""tools/bench_checkpoint.py — what a checkpoint of a run costs: seconds per
checkpoint (summary.json's checkpoints.seconds over the checkpoints written),
against the median step time of the same run, and bytes on disk.

Runs `ddp run CONFIG --set run.steps=N --set checkpoint.every=K` R times (a
fresh output directory each time) and prints a Markdown table: median and
min–max over the runs.

usage: tools/bench_checkpoint.py [--config configs/lm-cpu.toml] [--steps 12]
                                 [--every 4] [--rounds 3] [--ddp build/bin/ddp]
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
    args = p.parse_args()
    per, step, ratio, size = [], [], [], 0
    base = tempfile.mkdtemp(prefix="ddp-bench-checkpoint-")
    try:
        for r in range(args.rounds):
            c, s, size = one_run(args, os.path.join(base, str(r)))
            per.append(c), step.append(s), ratio.append(c / s)
            print(f"round {r + 1}: {c:.3f} s per checkpoint, step {s:.3f} s", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("| config | checkpoint | s per checkpoint | median step s | checkpoint / step |")
    print("|---|---|---|---|---|")
    print(f"| {args.config} | {size / 1e6:.1f} MB | {spread(per, lambda x: f'{x:.3f}')} | "
          f"{spread(step, lambda x: f'{x:.3f}')} | {spread(ratio, lambda x: f'{x:.2f}')} |")


if __name__ == "__main__":
    main()
