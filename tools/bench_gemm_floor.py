#!/usr/bin/env python3
"""tools/bench_gemm_floor.py — a step's distance to its GEMM-only floor, in one invocation. The
floor is `ddp gemm-floor` with the same BLAS kernel as the run (the one its rank 0 loaded, from its
summary.json): the model's forward and backward GEMMs recorded from a real forward and backward on
the CPU (same shapes, transposes and order), run again alone on the model's own buffers, median of
--repeats. The floor is measured before the first run and after every run, and each run is set
against the mean of the floors on either side of it, so that the machine's drift over a round (a
shared host's speed moves by several % over minutes) falls on both sides of the ratio. (Neighbouring
rounds share a floor, so their ratios are not independent.) A first run, untimed, finds which kernel
the runs load. The run's
forward, backward and optimizer are medians of its steps after the first --skip; the table gives
each against its floor (the optimizer runs no GEMM: its floor is 0, its time all overhead),
medians over the rounds with min–max.

usage: tools/bench_gemm_floor.py [--config configs/lm-cpu.toml] [--set KEY=VALUE]... [--rounds 3]
                                 [--steps 12] [--skip 3] [--repeats 5] [--ddp build/bin/ddp]
(default sets: run.world_size=1, data.batch_size=8: one rank, 8 sequences)
"""
import json
import os
import statistics
import subprocess
import tempfile

from step_bench_args import ROOT, step_parser


def ddp(binary, args, env=None):
    p = subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"bench_gemm_floor: ddp {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def spread(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main():
    ap = step_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    sets = [x for s in a.sets for x in ("--set", s)]
    parts = ("step", "forward", "backward", "optimizer")
    run_s = {p: [] for p in parts}
    floor_s = {p: [] for p in parts}
    with tempfile.TemporaryDirectory() as tmp:
        def run(r):
            out = f"{tmp}/run{r}"
            ddp(a.ddp, ["run", a.config, *sets, "--set", f"run.steps={a.steps}", "--set", "run.log_every=1000",
                        "--set", f'run.output_dir="{out}"'])
            with open(f"{out}/summary.json") as f:
                return json.load(f)

        def floor(kernel):
            env = dict(os.environ, OPENBLAS_CORETYPE=kernel)
            return json.loads(ddp(a.ddp, ["gemm-floor", a.config, *sets, "--repeats", str(a.repeats)], env))

        first = run("-kernel")  # which kernel the runs load (measured and cached on first use)
        kernel = first["blas"]["kernel"]
        before = floor(kernel)
        for r in range(a.rounds):
            s = run(r)
            if s["blas"]["kernel"] != kernel:
                raise SystemExit(f"bench_gemm_floor: run {r} loaded {s['blas']['kernel']}, not {kernel}")
            after = floor(kernel)
            for p, key in zip(parts, ("step_time_s", "forward_s", "backward_s", "optimizer_s")):
                run_s[p].append(statistics.median(s[key][a.skip:]))
            fwd = (before["forward_s"] + after["forward_s"]) / 2
            bwd = (before["backward_s"] + after["backward_s"]) / 2
            floor_s["forward"].append(fwd)
            floor_s["backward"].append(bwd)
            floor_s["optimizer"].append(0.0)
            floor_s["step"].append(fwd + bwd)
            print(f"round {r + 1} ({kernel}, {after['gemms']['forward']} + {after['gemms']['backward']} GEMMs, "
                  f"{after['gflop']['forward'] + after['gflop']['backward']:.1f} GFLOP): step "
                  f"{run_s['step'][-1] * 1e3:.1f} ms, floor {(before['forward_s'] + before['backward_s']) * 1e3:.1f} "
                  f"before and {(after['forward_s'] + after['backward_s']) * 1e3:.1f} ms after, "
                  f"ratio {run_s['step'][-1] / floor_s['step'][-1]:.3f}", flush=True)
            before = after
    print("\n| part | run ms | GEMM-only floor ms | run / floor (min–max) |\n|---|---|---|---|")
    for p in parts:
        ratio = "—" if p == "optimizer" else spread([x / y for x, y in zip(run_s[p], floor_s[p])])
        print(f"| {p} | {statistics.median(run_s[p]) * 1e3:.1f} | {statistics.median(floor_s[p]) * 1e3:.1f} | {ratio} |")
    print(f"\n{a.config} {' '.join(sets)}")


if __name__ == "__main__":
    main()
