#!/usr/bin/env python3
"""tools/bench_gemm_floor.py — a step's distance to its GEMM-only floor, in one invocation. Each
round runs the config (`ddp run`) and then `ddp gemm-floor` on it with the same BLAS kernel (the
one the run's rank 0 loaded, from its summary.json): the model's forward and backward GEMMs
recorded from a real forward and backward on the CPU (same shapes, transposes and order), run
again alone, best of --repeats. The run's forward, backward and optimizer are medians of its
steps after the first --skip; the table gives each against its floor (the optimizer runs no
GEMM: its floor is 0, its time all overhead), medians over the rounds with min–max.

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
        for r in range(a.rounds):
            out = f"{tmp}/run{r}"
            ddp(a.ddp, ["run", a.config, *sets, "--set", f"run.steps={a.steps}", "--set", "run.log_every=1000",
                        "--set", f'run.output_dir="{out}"'])
            with open(f"{out}/summary.json") as f:
                s = json.load(f)
            for p, key in zip(parts, ("step_time_s", "forward_s", "backward_s", "optimizer_s")):
                run_s[p].append(statistics.median(s[key][a.skip:]))
            env = dict(os.environ, OPENBLAS_CORETYPE=s["blas"]["kernel"])
            fl = json.loads(ddp(a.ddp, ["gemm-floor", a.config, *sets, "--repeats", str(a.repeats)], env))
            floor_s["forward"].append(fl["forward_s"])
            floor_s["backward"].append(fl["backward_s"])
            floor_s["optimizer"].append(0.0)
            floor_s["step"].append(fl["forward_s"] + fl["backward_s"])
            print(f"round {r + 1} ({fl['kernel']}, {fl['gemms']['forward']} + {fl['gemms']['backward']} GEMMs, "
                  f"{fl['gflop']['forward'] + fl['gflop']['backward']:.1f} GFLOP): step "
                  f"{run_s['step'][-1] * 1e3:.1f} ms, floor {floor_s['step'][-1] * 1e3:.1f} ms, "
                  f"ratio {run_s['step'][-1] / floor_s['step'][-1]:.3f}", flush=True)
    print("\n| part | run ms | GEMM-only floor ms | run / floor (min–max) |\n|---|---|---|---|")
    for p in parts:
        ratio = "—" if p == "optimizer" else spread([x / y for x, y in zip(run_s[p], floor_s[p])])
        print(f"| {p} | {statistics.median(run_s[p]) * 1e3:.1f} | {statistics.median(floor_s[p]) * 1e3:.1f} | {ratio} |")
    print(f"\n{a.config} {' '.join(sets)}")


if __name__ == "__main__":
    main()
