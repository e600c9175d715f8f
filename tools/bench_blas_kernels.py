#!/usr/bin/env python3
"""tools/bench_blas_kernels.py — the lm-cpu step with the BLAS kernel `ddp run` chooses by itself
(run.blas_kernel = "auto", from this machine's cache or a fresh measurement) against each kernel
forced by hand, in one invocation: the runs alternate for --rounds rounds (the order rotated each
round), each run's step is the median of its steps after the first --skip; the table gives each
kernel's median step over the rounds and its per-round ratio to auto's, median (min–max).
Kernels that cannot run on this CPU (a run that fails) are reported and left out.

usage: tools/bench_blas_kernels.py [--config configs/lm-cpu.toml] [--set KEY=VALUE]... [--rounds 3]
                                   [--steps 12] [--skip 3] [--ddp build/bin/ddp]
(default sets: run.world_size=1, data.batch_size=8: one rank, 8 sequences)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from step_bench_args import ROOT, step_parser
KERNELS = ["auto", "default", "Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake"]


def step_time(ddp, config, sets, kernel, steps, skip, out):
    cmd = [ddp, "run", os.path.join(ROOT, config), *[a for s in sets for a in ("--set", s)],
           "--set", f"run.steps={steps}", "--set", "run.log_every=1000", "--set", f'run.blas_kernel="{kernel}"',
           "--set", f'run.output_dir="{out}"']
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1:] or ["?"]
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return statistics.median(s["step_time_s"][skip:]), s["blas"]


def main():
    ap = step_parser(__doc__)
    a = ap.parse_args()
    times = {k: [] for k in KERNELS}
    failed = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = KERNELS[r % len(KERNELS):] + KERNELS[:r % len(KERNELS)]
            for k in order:
                if k in failed:
                    continue
                t, blas = step_time(a.ddp, a.config, a.sets, k, a.steps, a.skip, f"{tmp}/{k}{r}")
                if t is None:
                    failed[k] = blas[0]
                    continue
                times[k].append(t)
                if k == "auto":
                    print(f"round {r + 1}: auto = {blas['choice']['kernel']} ({blas['choice']['source']}), "
                          f"loaded {blas['kernel']}", flush=True)
            print(f"round {r + 1}: " + "  ".join(f"{k} {times[k][-1] * 1e3:.1f}" for k in order if k not in failed),
                  flush=True)
    print("\n| kernel | step ms (median) | / auto, per round: median (min–max) |\n|---|---|---|")
    for k in KERNELS:
        if k in failed or not times[k]:
            continue
        ratios = [t / u for t, u in zip(times[k], times["auto"])]
        print(f"| {k} | {statistics.median(times[k]) * 1e3:.1f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |")
    forced = {k: statistics.median(v) for k, v in times.items() if k != "auto" and v and k not in failed}
    best = min(forced, key=forced.get)
    print(f"\nauto / fastest forced ({best}): {statistics.median(times['auto']) / forced[best]:.3f}")
    for k, why in failed.items():
        print(f"{k}: cannot run here ({why})", file=sys.stderr)


if __name__ == "__main__":
    main()
