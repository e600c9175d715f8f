#!/usr/bin/env python3
"""tools/bench_step_ab.py — one step against another, in one invocation: the same run started as A and
as B, alternating for --rounds rounds (A first in even rounds, B first in odd ones), B differing from A
by its environment (--env-b KEY=VALUE, repeatable; --env-a likewise for A), its binary (--ddp-b) or its
config (--set-b KEY=VALUE, repeatable, after the common --set; --set-a likewise for A).
Each run's step, forward, backward and optimizer are medians of its steps after the first --skip; the
table gives each variant's median over the rounds and the per-round ratio B / A of the step, median
(min–max). For a change to the step itself, where start-up is beside the point (farm-bench times
whole processes).

usage: tools/bench_step_ab.py [--config configs/lm-cpu.toml] [--set KEY=VALUE]... [--rounds 3]
                              [--steps 12] [--skip 3] [--ddp build/bin/ddp] [--ddp-b PATH]
                              [--env-a KEY=VALUE]... [--env-b KEY=VALUE]...
                              [--set-a KEY=VALUE]... [--set-b KEY=VALUE]...
(default sets: run.world_size=1, data.batch_size=8: one rank, 8 sequences)
e.g. tools/bench_step_ab.py --rounds 8 --steps 14 --env-b DDP_HUGE_PAGES=1
     ZeRO stage 2 against stage 1 (allgather: the same bytes on the wire), lm-cpu on 2 ranks:
     tools/bench_step_ab.py --rounds 7 --set run.world_size=2 --set data.batch_size=16 \
       --set 'strategy.plugin="sharded"' --set-a 'strategy.sharded.variant="allgather"' \
       --set-b strategy.sharded.stage=2 --set-b strategy.sharded.bucket_mb=8
"""
import json
import os
import statistics
import subprocess
import tempfile

from step_bench_args import ROOT, step_parser

PARTS = (("step", "step_time_s"), ("forward", "forward_s"), ("backward", "backward_s"),
         ("optimizer", "optimizer_s"))


def environment(pairs):
    env = dict(os.environ)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"bench_step_ab: '{pair}' is not KEY=VALUE")
        env[key] = value
    return env


def run(binary, env, own_sets, a, sets, out):
    cmd = [binary, "run", os.path.join(ROOT, a.config), *sets, *own_sets, "--set", f"run.steps={a.steps}",
           "--set", "run.log_every=1000", "--set", f'run.output_dir="{out}"']
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"bench_step_ab: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return {part: statistics.median(s[key][a.skip:]) for part, key in PARTS}


def main():
    ap = step_parser(__doc__)
    ap.add_argument("--ddp-b", help="B's binary (default: --ddp)")
    ap.add_argument("--env-a", action="append", default=[], help="KEY=VALUE in A's environment")
    ap.add_argument("--env-b", action="append", default=[], help="KEY=VALUE in B's environment")
    ap.add_argument("--set-a", action="append", default=[], help="a key of A's run, after the common --set")
    ap.add_argument("--set-b", action="append", default=[], help="a key of B's run, after the common --set")
    a = ap.parse_args()
    if a.steps <= a.skip:
        raise SystemExit("bench_step_ab: --steps must exceed --skip")
    sets = [x for s in a.sets for x in ("--set", s)]
    own = lambda items: [x for s in items for x in ("--set", s)]
    variants = {"A": (a.ddp, environment(a.env_a), own(a.set_a)),
                "B": (a.ddp_b or a.ddp, environment(a.env_b), own(a.set_b))}
    got = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                got[name].append(run(*variants[name], a, sets, f"{tmp}/{r}{name}"))
            print(f"round {r + 1}: step A {got['A'][-1]['step'] * 1e3:.1f} ms, B {got['B'][-1]['step'] * 1e3:.1f} ms",
                  flush=True)
    ratios = [b["step"] / x["step"] for x, b in zip(got["A"], got["B"])]
    print("\n| part | A ms | B ms |\n|---|---|---|")
    for part, _ in PARTS:
        print(f"| {part} | {statistics.median(x[part] for x in got['A']) * 1e3:.1f} | "
              f"{statistics.median(x[part] for x in got['B']) * 1e3:.1f} |")
    print(f"\nstep B / A: {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) over {a.rounds} rounds")
    print(f"A: {a.ddp} {' '.join(a.env_a)} {' '.join(a.set_a)}\nB: {a.ddp_b or a.ddp} {' '.join(a.env_b)} "
          f"{' '.join(a.set_b)}\n{a.config} {' '.join(sets)}")


if __name__ == "__main__":
    main()
