#!/usr/bin/env python3
"""tools/bench_plan.py — `ddp plan`'s predicted communication time per step against the one a run
measures, in one invocation: each round runs `ddp bench-comm` (all_reduce at the sizes of the
run's buckets) for o and w, `ddp plan --bench` on it, then the run itself; the prediction is
sum(o + bytes / w) over the step's collectives, the measurement the run's comm_busy_s (time its
collectives were in flight) per step, median over the steps after the first --skip.
Prints each round and the median ratio predicted / measured with its min-max.

usage: tools/bench_plan.py [--config configs/lm-cpu.toml] [--set KEY=VALUE]... [--rounds 3]
                           [--steps 12] [--skip 3] [--sizes 1MB,4MB,8MB,16MB] [--ddp build/bin/ddp]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ddp(binary, *args):
    p = subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_plan: ddp {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/lm-cpu.toml")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--sizes", default="1MB,4MB,8MB,16MB")
    ap.add_argument("--ddp", default=os.path.join(ROOT, "build/bin/ddp"))
    a = ap.parse_args()
    sets = [x for s in a.sets for x in ("--set", s)]
    run = json.loads(ddp(a.ddp, "plan", a.config, *sets, "--json"))["run"]
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            bench_dir, run_dir = f"{tmp}/bench{r}", f"{tmp}/run{r}"
            ddp(a.ddp, "bench-comm", "--transport", run["transport"], "--world", str(run["world_size"]),
                "--sizes", a.sizes, "--ops", "all_reduce", "--out", bench_dir)
            plan = json.loads(ddp(a.ddp, "plan", a.config, *sets, "--json", "--bench",
                                  f"{bench_dir}/bench_comm.json"))["run"]
            ddp(a.ddp, "run", a.config, *sets, "--set", f"run.steps={a.steps}", "--set", "run.log_every=1000",
                "--set", f'run.output_dir="{run_dir}"')
            with open(f"{run_dir}/summary.json") as f:
                busy = statistics.median(json.load(f)["comm_busy_s"][a.skip:])
            predicted = plan["comm_seconds_per_step"]
            ratios.append(predicted / busy)
            fit = plan["overhead_fit"]
            print(f"round {r + 1}: o {fit['o_s'] * 1e6:.0f} µs, w {fit['w_bytes_per_s'] / 1e9:.3f} GB/s; "
                  f"{plan['collectives_per_step']} collectives, {plan['comm_bytes_per_step'] / 1e6:.1f} MB: "
                  f"predicted {predicted * 1e3:.1f} ms, measured comm_busy {busy * 1e3:.1f} ms, "
                  f"ratio {predicted / busy:.3f}", flush=True)
    print(f"\npredicted / measured: {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}), "
          f"{a.rounds} rounds; {a.config} {' '.join(sets)}")


if __name__ == "__main__":
    main()
