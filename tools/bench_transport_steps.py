#!/usr/bin/env python3
"""tools/bench_transport_steps.py — training steps with the mpi transport
against the same training without it, in one invocation: the two runs of a
comparison alternate for --rounds rounds (so drift hits both alike); each
run's step time is the median of its steps after the first --skip; the
result is each side's median over the rounds and the ratio B / A, with the
min–max of the per-round ratios.

Comparisons (the acceptance points of the mpi transport, docs/benchmarks.md):
  lm   A: lm-cpu (bucketed, AdamW, 8 sequences) at world 1
       B: lm-cpu, world 2 with mpi (8 sequences per rank)       target B/A <= 1.04
  mlp  A: mlp 1024x8 (overlap, SGD, 32 rows per rank), world 2 with gloo
       B: the same with mpi                                     target B/A <= 0.6

usage: tools/bench_transport_steps.py lm|mlp [--rounds 3] [--steps 20] [--skip 3] [--ddp build/bin/ddp]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMPARISONS = {
    "lm": ("configs/lm-cpu.toml",
           ["run.world_size=1", "data.batch_size=8"],
           ["run.world_size=2", "data.batch_size=16", 'transport.plugin="mpi"']),
    "mlp": ("configs/mlp.toml",
            ['transport.plugin="gloo"'],
            ['transport.plugin="mpi"']),
}


def step_time(ddp, config, sets, steps, skip, out):
    cmd = [ddp, "run", os.path.join(ROOT, config), "--set", f"run.steps={steps}", "--set", "run.log_every=1000",
           "--set", f'run.output_dir="{out}"']
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        times = json.load(f)["step_time_s"]
    return statistics.median(times[skip:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", choices=sorted(COMPARISONS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--ddp", default=os.path.join(ROOT, "build/bin/ddp"))
    args = p.parse_args()
    config, a_sets, b_sets = COMPARISONS[args.which]
    a, b = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            a.append(step_time(args.ddp, config, a_sets, args.steps, args.skip, f"{tmp}/a{r}"))
            b.append(step_time(args.ddp, config, b_sets, args.steps, args.skip, f"{tmp}/b{r}"))
            print(f"round {r + 1}: A {a[-1] * 1e3:.1f} ms  B {b[-1] * 1e3:.1f} ms  B/A {b[-1] / a[-1]:.3f}", flush=True)
    ratios = [y / x for x, y in zip(a, b)]
    print(f"\n| comparison | A step ms | B step ms | B / A (min–max) |\n|---|---|---|---|\n"
          f"| {args.which} | {statistics.median(a) * 1e3:.1f} | {statistics.median(b) * 1e3:.1f} | "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |")
    print(f"A: {config} --set {' --set '.join(a_sets)}\nB: {config} --set {' --set '.join(b_sets)}")


if __name__ == "__main__":
    main()
