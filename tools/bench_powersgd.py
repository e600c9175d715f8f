#!/usr/bin/env python3
"""tools/bench_powersgd.py — `powersgd` against `bucketed` on one config, in one invocation: the same
run started with each strategy, alternating for --rounds rounds (powersgd first in even rounds,
bucketed first in odd ones, so that a drift of the machine's speed weighs on both). From each run's
summary.json: the bytes each rank sent a step (comm_bytes, every step the same), its step time and
the time the training thread waited for communication (comm_blocked_s), medians over its steps after
the first --skip. Prints each strategy's medians over the rounds with their min–max, the per-round
ratio powersgd / bucketed of the step, median (min–max), and the ratio of the bytes; exits 1 where
powersgd's bytes are not under --max-bytes-ratio of bucketed's (default 1/100).

usage: tools/bench_powersgd.py [--config configs/mlp.toml] [--set KEY=VALUE]... [--rounds 7]
                               [--steps 12] [--skip 3] [--rank 2] [--bucket-mb 25] [--ddp build/bin/ddp]
                               [--max-bytes-ratio 0.01]
(default sets: run.world_size=2; the config's own batch, optimizer and model: mlp 1024 x 8)
e.g. tools/bench_powersgd.py --rounds 7 --steps 12 --skip 3
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from step_bench_args import ROOT, step_parser

STRATEGIES = ("powersgd", "bucketed")


def run(a, strategy, out):
    keys = {"powersgd": [f"strategy.powersgd.rank={a.rank}"],
            "bucketed": [f"strategy.bucketed.bucket_mb={a.bucket_mb}"]}[strategy]
    sets = [*a.sets, f'strategy.plugin="{strategy}"', *keys, f"run.steps={a.steps}", "run.log_every=1000",
            f'run.output_dir="{out}"']
    cmd = [a.ddp, "run", os.path.join(ROOT, a.config), *[x for s in sets for x in ("--set", s)]]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_powersgd: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    if len(set(s["comm_bytes"])) != 1:
        raise SystemExit(f"bench_powersgd: {strategy}: the bytes differ from step to step: {s['comm_bytes']}")
    return {"bytes": s["comm_bytes"][0], "step": statistics.median(s["step_time_s"][a.skip:]),
            "blocked": statistics.median(s["comm_blocked_s"][a.skip:])}


def spread(values, scale=1e3):
    return f"{statistics.median(values) * scale:.1f} ({min(values) * scale:.1f}–{max(values) * scale:.1f})"


def main():
    ap = step_parser(__doc__)
    ap.set_defaults(config="configs/mlp.toml", sets=["run.world_size=2"], rounds=7)
    ap.add_argument("--rank", type=int, default=2, help="powersgd's rank (default 2)")
    ap.add_argument("--bucket-mb", type=float, default=25, help="bucketed's bucket_mb (default 25)")
    ap.add_argument("--max-bytes-ratio", type=float, default=0.01, help="powersgd / bucketed bytes must be below")
    a = ap.parse_args()
    if a.steps <= a.skip:
        raise SystemExit("bench_powersgd: --steps must exceed --skip")
    got = {s: [] for s in STRATEGIES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for s in STRATEGIES if r % 2 == 0 else reversed(STRATEGIES):
                got[s].append(run(a, s, f"{tmp}/{r}{s}"))
            print(f"round {r + 1}: step powersgd {got['powersgd'][-1]['step'] * 1e3:.1f} ms, "
                  f"bucketed {got['bucketed'][-1]['step'] * 1e3:.1f} ms", flush=True)
    print("\n| strategy | bytes a step | step ms, median (min–max) | comm blocked ms |\n|---|---|---|---|")
    for s in STRATEGIES:
        print(f"| {s} | {got[s][0]['bytes']} | {spread([x['step'] for x in got[s]])} | "
              f"{spread([x['blocked'] for x in got[s]])} |")
    steps = [p["step"] / b["step"] for p, b in zip(got["powersgd"], got["bucketed"])]
    bytes_ratio = got["powersgd"][0]["bytes"] / got["bucketed"][0]["bytes"]
    print(f"\nstep powersgd / bucketed: {statistics.median(steps):.3f} ({min(steps):.3f}–{max(steps):.3f}) "
          f"over {a.rounds} rounds")
    print(f"bytes powersgd / bucketed: {bytes_ratio:.5f} (1/{1 / bytes_ratio:.1f})")
    print(f"{a.config} {' '.join(a.sets)}; steps {a.steps}, medians after the first {a.skip}; "
          f"powersgd rank {a.rank}, bucketed bucket_mb {a.bucket_mb:g}")
    if bytes_ratio >= a.max_bytes_ratio:
        print(f"bench_powersgd: powersgd sends {bytes_ratio:.4f} of bucketed's bytes, not under "
              f"{a.max_bytes_ratio:g}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
