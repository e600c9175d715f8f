#!/usr/bin/env python3
"""tools/bench_plan.py — `ddp plan`'s predicted communication time per step against the one a run
measures, in one invocation: each round runs `ddp bench-comm` (all_reduce at the sizes of the
run's buckets) for o and w, `ddp plan --bench` on it, then the run itself; the prediction is
sum(o + bytes / w) over the step's collectives, the measurement the run's comm_busy_s (time its
collectives were in flight on rank 0) per step, median over the steps after the first --skip.
The run is traced (--trace), and a second measurement comes from the trace: each collective's time
from when the LAST rank started it to when the last rank saw it done, summed per step (median as
above).
comm_busy_s also counts the time rank 0 waited in a collective for a slower rank to join it, which
is compute skew, not communication; the trace's figure leaves that wait out.
With --busy, each round also runs `ddp bench-comm --load gemm` (a core of each rank busy with GEMMs
while it times, as a rank's backward keeps it) and gives it to `ddp plan --bench-busy`: the
collectives the strategy issues beside the rank's compute (`ddp plan`'s "beside_compute": during
backward, or beside bucketed's bucket-by-bucket updates) are priced with that fit, the others idle.
Prints each round and the median ratios predicted / measured with their min-max.

usage: tools/bench_plan.py [--config configs/lm-cpu.toml] [--set KEY=VALUE]... [--rounds 3]
                           [--steps 12] [--skip 3] [--sizes 1MB,...] [--busy]
                           [--ddp build/bin/ddp]
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


def joined_seconds(trace_path, skip):
    """From a run's trace: per step (after the first `skip`), the sum over its collectives of the
    time from the latest start over the ranks to the latest end (the ranks share the machine's
    steady clock): each collective's time once every rank had joined it. Returns the median over
    the steps of that sum, and per collective of a step the medians over the steps of that time
    and of rank 0's own time in flight. The k-th collective of a step is the same one on every
    rank (plugin.h's ordering invariant); a trace whose ranks disagree on a step's collectives
    (count, op or bytes) is refused."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    by_rank = {}
    for e in events:
        if e.get("ph") == "X" and "op" in e.get("args", {}) and e["args"]["step"] >= skip:
            by_rank.setdefault(e["pid"], {}).setdefault(e["args"]["step"], []).append(e)
    if 0 not in by_rank:
        raise SystemExit(f"bench_plan: {trace_path} has no collectives of rank 0 after step {skip}")
    per_step, per_collective = [], {}
    for step in sorted(by_rank[0]):
        lanes = [sorted(by_rank[r].get(step, []), key=lambda e: e["ts"]) for r in sorted(by_rank)]
        shape = [(e["args"]["op"], e["args"]["bytes"]) for e in lanes[0]]
        if any([(e["args"]["op"], e["args"]["bytes"]) for e in lane] != shape for lane in lanes):
            raise SystemExit(f"bench_plan: step {step}: the ranks' traces hold different collectives")
        total = 0.0
        for k in range(len(shape)):
            ends = [lane[k]["ts"] + lane[k]["dur"] for lane in lanes]
            joined = max(0.0, max(ends) - max(lane[k]["ts"] for lane in lanes)) * 1e-6  # µs
            total += joined
            per_collective.setdefault(k, ([], []))
            per_collective[k][0].append(joined)
            per_collective[k][1].append(lanes[0][k]["dur"] * 1e-6)
        per_step.append(total)
    return statistics.median(per_step), [(statistics.median(j), statistics.median(b))
                                         for _, (j, b) in sorted(per_collective.items())]


def step_sizes(collectives):
    """bench-comm's sizes for a plan's collectives: their distinct sizes in bytes, and a quarter of
    the size where there is only one (a fit needs two)."""
    sizes = sorted({c["bytes"] for c in collectives})
    if len(sizes) == 1:
        sizes.insert(0, max(4, sizes[0] // 16 * 4))
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/lm-cpu.toml")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--sizes", help="bench-comm's sizes (default: those of the step's collectives)")
    ap.add_argument("--busy", action="store_true", help="price collectives beside compute under load")
    ap.add_argument("--ddp", default=os.path.join(ROOT, "build/bin/ddp"))
    a = ap.parse_args()
    sets = [x for s in a.sets for x in ("--set", s)]
    run = json.loads(ddp(a.ddp, "plan", a.config, *sets, "--json"))["run"]
    if not a.sizes:
        a.sizes = ",".join(str(b) for b in step_sizes(run["collectives"]))
    ratios, joined_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            bench_dir, run_dir = f"{tmp}/bench{r}", f"{tmp}/run{r}"
            bench = ["bench-comm", "--transport", run["transport"], "--world", str(run["world_size"]),
                     "--sizes", a.sizes, "--ops", "all_reduce"]
            ddp(a.ddp, *bench, "--out", bench_dir)
            busy_args = []
            if a.busy:
                ddp(a.ddp, *bench, "--load", "gemm", "--out", f"{bench_dir}-busy")
                busy_args = ["--bench-busy", f"{bench_dir}-busy/bench_comm.json"]
            plan = json.loads(ddp(a.ddp, "plan", a.config, *sets, "--json", "--bench",
                                  f"{bench_dir}/bench_comm.json", *busy_args))["run"]
            ddp(a.ddp, "run", a.config, *sets, "--set", f"run.steps={a.steps}", "--set", "run.log_every=1000",
                "--set", f'run.output_dir="{run_dir}"', "--trace")
            with open(f"{run_dir}/summary.json") as f:
                busy = statistics.median(json.load(f)["comm_busy_s"][a.skip:])
            joined, collectives = joined_seconds(f"{run_dir}/trace.json", a.skip)
            predicted = plan["comm_seconds_per_step"]
            ratios.append(predicted / busy)
            joined_ratios.append(predicted / joined)
            fit = plan["overhead_fit"]
            loaded = plan.get("overhead_fit_busy")
            under = (f" (beside compute: o {loaded['o_s'] * 1e6:.0f} µs, w {loaded['w_bytes_per_s'] / 1e9:.3f} GB/s "
                     f"under load)" if loaded else "")
            print(f"round {r + 1}: o {fit['o_s'] * 1e6:.0f} µs, w {fit['w_bytes_per_s'] / 1e9:.3f} GB/s{under}; "
                  f"{plan['collectives_per_step']} collectives, {plan['comm_bytes_per_step'] / 1e6:.1f} MB: "
                  f"predicted {predicted * 1e3:.1f} ms, measured comm_busy {busy * 1e3:.1f} ms (ratio {predicted / busy:.3f}), "
                  f"after all joined {joined * 1e3:.1f} ms (ratio {predicted / joined:.3f})", flush=True)
            if len(collectives) != len(plan["collectives"]):
                raise SystemExit(f"bench_plan: the run issued {len(collectives)} collectives a step, "
                                 f"the plan {len(plan['collectives'])}")
            for k, ((j, b), c) in enumerate(zip(collectives, plan["collectives"])):
                when = "beside compute" if c["beside_compute"] else "alone"
                print(f"  collective {k + 1}: {c['op']} {c['bytes'] / 1e6:.1f} MB ({when}), "
                      f"predicted {c['seconds'] * 1e3:.1f} ms, "
                      f"in flight on rank 0 {b * 1e3:.1f} ms, after all joined {j * 1e3:.1f} ms", flush=True)
    def spread(v):
        return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"
    print(f"\npredicted / comm_busy: {spread(ratios)}; predicted / after all joined: {spread(joined_ratios)}; "
          f"{a.rounds} rounds{', --busy' if a.busy else ''}; {a.config} {' '.join(sets)}")


if __name__ == "__main__":
    main()
