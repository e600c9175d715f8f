#!/usr/bin/env python3
"""tools/bench_transport_steps.py — training steps with the mpi transport
against the same training without it, in one invocation: the runs of a
comparison alternate for --rounds rounds (so drift hits them alike); each
run's step time is the median of its steps after the first --skip; the
result is each run's median over the rounds and the ratios to A, each with
the min–max of its per-round ratios.

Comparisons (the acceptance points of the mpi transport, docs/benchmarks.md):
  lm   A: lm-cpu (bucketed, AdamW, 8 sequences) at world 1
       F: two of A at once, independent (the floor: what sharing the
          machine's cores, caches and memory costs with no communication)
       B: lm-cpu, world 2 with mpi (8 sequences per rank)       target B/A <= 1.04
  mlp  A: mlp 1024x8 (overlap, SGD, 32 rows per rank), world 2 with gloo
       B: the same with mpi                                     target B/A <= 0.6

usage: tools/bench_transport_steps.py lm|mlp [--rounds 3] [--steps 20] [--skip 3]
                                     [--set KEY=VALUE]... [--ddp build/bin/ddp]
(--set applies to B only: e.g. --set strategy.bucket_mb=25)
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (config, --set overrides, how many independent copies run at once)
COMPARISONS = {
    "lm": ("configs/lm-cpu.toml", [
        ("A", ["run.world_size=1", "data.batch_size=8"], 1),
        ("F", ["run.world_size=1", "data.batch_size=8"], 2),
        ("B", ["run.world_size=2", "data.batch_size=16", 'transport.plugin="mpi"'], 1),
    ]),
    "mlp": ("configs/mlp.toml", [
        ("A", ['transport.plugin="gloo"'], 1),
        ("B", ['transport.plugin="mpi"'], 1),
    ]),
}


def step_time(ddp, config, sets, copies, steps, skip, out):
    """The median step of the run (the slowest copy's, when copies run at once)."""
    procs = []
    for c in range(copies):
        cmd = [ddp, "run", os.path.join(ROOT, config), "--set", f"run.steps={steps}", "--set", "run.log_every=1000",
               "--set", f'run.output_dir="{out}/{c}"']
        for s in sets:
            cmd += ["--set", s]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.DEVNULL)))
    medians = []
    for c, (cmd, p) in enumerate(procs):
        if p.wait() != 0:
            raise SystemExit(f"bench_transport_steps: exit code {p.returncode}: {' '.join(cmd)}")
        with open(os.path.join(out, str(c), "summary.json")) as f:
            medians.append(statistics.median(json.load(f)["step_time_s"][skip:]))
    return max(medians)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", choices=sorted(COMPARISONS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--set", action="append", default=[], dest="sets", help="more overrides for B")
    p.add_argument("--ddp", default=os.path.join(ROOT, "build/bin/ddp"))
    args = p.parse_args()
    config, runs = COMPARISONS[args.which]
    runs = [(n, s + args.sets if n == "B" else s, c) for n, s, c in runs]
    times = {n: [] for n, _, _ in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, sets, copies in runs:
                times[name].append(step_time(args.ddp, config, sets, copies, args.steps, args.skip, f"{tmp}/{name}{r}"))
            print(f"round {r + 1}: " + "  ".join(f"{n} {times[n][-1] * 1e3:.1f} ms" for n in times) + "  " +
                  "  ".join(f"{n}/A {times[n][-1] / times['A'][-1]:.3f}" for n in times if n != "A"), flush=True)
    print("\n| comparison | run | step ms (median) | / A (min–max) |\n|---|---|---|---|")
    for name, sets, copies in runs:
        ratios = [t / a for t, a in zip(times[name], times["A"])]
        ratio = "—" if name == "A" else f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"
        print(f"| {args.which} | {name} | {statistics.median(times[name]) * 1e3:.1f} | {ratio} |")
    if "F" in times:
        ratios = [b / f for b, f in zip(times["B"], times["F"])]
        print(f"\nB / F (communication over the floor): {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}–{max(ratios):.3f})")
    for name, sets, copies in runs:
        print(f"{name}: {config} --set {' --set '.join(sets)}" + (f"  ({copies} at once)" if copies > 1 else ""))


if __name__ == "__main__":
    main()
