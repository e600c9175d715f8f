#!/usr/bin/env python3
"""tools/bench_large.py — the proof that ZeRO stage 3 trains a model this host cannot train with DDP:
configs/lm-large.toml (lm preset large, 969 M parameters, world 2, sharded stage 3, 3 steps).

It runs, in order:
  1. `ddp plan` of the config: each rank's planned peak (the largest of its three moments) and the fit;
  2. `ddp run` of the same config under `bucketed` and under stage 1: each must be refused by the fit
     check (non-zero, "does not fit this host's memory") within a second;
  3. `ddp run` of the config itself on a learnable token file (written here: token i is i mod 500,
     uint16, as nanoGPT writes them): it must exit 0, its loss must fall from step 1 to the last, and
     each rank's measured peak resident memory (summary.json's ranks[].peak_resident_bytes, VmHWM)
     must be within --tolerance (5 %) of that rank's planned peak.
It writes result.json and README.md into --out (default tools/results/large) and exits non-zero if
any check fails.

usage: tools/bench_large.py [--ddp build/bin/ddp] [--config configs/lm-large.toml] [--out DIR]
                            [--tolerance 0.05] [--set KEY=VALUE]...
"""
import argparse
import array
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFUSED = {"bucketed": ['strategy.plugin="bucketed"'], "sharded stage 1": ["strategy.sharded.stage=1"]}


def plan(args, sets):
    out = subprocess.run([args.ddp, "plan", args.config, "--json", *sum((["--set", s] for s in sets), [])],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    run = json.loads(out)["run"]
    peaks = [max(m[k]["total"] for k in ("after_setup", "before_optimizer_step", "after_optimizer_step"))
             for m in run["peak_bytes"]]
    return peaks, run["fit"]


def refusal(args, name, sets):
    start = time.monotonic()
    p = subprocess.run([args.ddp, "run", args.config, *sum((["--set", s] for s in sets), [])],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    seconds = time.monotonic() - start
    message = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    ok = p.returncode != 0 and "does not fit this host's memory" in message and seconds < 1.0
    return {"strategy": name, "exit_code": p.returncode, "seconds": round(seconds, 3), "message": message,
            "ok": ok}


def token_file(path, count=1 << 16, period=500):
    with open(path, "wb") as f:
        array.array("H", (i % period for i in range(count))).tofile(f)
    return path


def train(args, sets, tmp):
    out_dir = os.path.join(tmp, "run")
    sets = ['data.kind="tokens"', f'data.path="{token_file(os.path.join(tmp, "tokens.bin"))}"', *sets]
    start = time.monotonic()
    p = subprocess.run([args.ddp, "run", args.config, "--set", f'run.output_dir="{out_dir}"',
                        *sum((["--set", s] for s in sets), [])], capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"bench_large: the stage 3 run failed (exit {p.returncode})")
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    return summary, seconds, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddp", default=os.path.join(ROOT, "build/bin/ddp"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/lm-large.toml"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tools/results/large"))
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    args.config = os.path.relpath(os.path.abspath(args.config), ROOT)  # as the messages name it, from the root

    peaks, fit = plan(args, args.sets)
    print(f"plan: peak per rank {[round(p / 1e9, 3) for p in peaks]} GB; {fit['verdict']}", flush=True)
    refusals = [refusal(args, name, args.sets + extra) for name, extra in REFUSED.items()]
    for r in refusals:
        print(f"{r['strategy']}: exit {r['exit_code']} in {r['seconds']} s: {r['message']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_large.") as tmp:
        summary, seconds, log = train(args, args.sets, tmp)
    losses = summary["loss"]
    measured = [r["peak_resident_bytes"] for r in summary["ranks"]]
    ratios = [m / p for m, p in zip(measured, peaks)]
    checks = {
        "refused_within_a_second": all(r["ok"] for r in refusals),
        "loss_falls": losses[-1] < losses[0],
        "peak_resident_within_tolerance": all(abs(r - 1) <= args.tolerance for r in ratios),
    }
    result = {
        "command": "tools/bench_large.py" + "".join(f" --set '{s}'" for s in args.sets),
        "config": args.config,
        "plan_peak_bytes_per_rank": peaks, "fit": fit, "refusals": refusals,
        "losses": losses, "run_seconds": round(seconds, 1), "mean_step_time_s": summary["mean_step_time_s"],
        "peak_resident_bytes_per_rank": measured, "measured_over_plan": [round(r, 4) for r in ratios],
        "checks": checks, "log": log.splitlines(),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(readme(result))
    print(json.dumps({k: result[k] for k in ("losses", "measured_over_plan", "checks")}))
    return 0 if all(checks.values()) else 1


def readme(r):
    gb = lambda b: f"{b / 1e9:.2f} GB"
    lines = ["# lm preset large at world 2: ZeRO stage 3 fits where DDP and stage 1 do not", "",
             f"Command: `{r['command']}` (config `{r['config']}`); written by it.", "",
             "| rank | planned peak | measured peak resident (VmHWM) | measured / plan |", "|---|---|---|---|"]
    for k, (p, m, q) in enumerate(zip(r["plan_peak_bytes_per_rank"], r["peak_resident_bytes_per_rank"],
                                      r["measured_over_plan"])):
        lines.append(f"| {k} | {gb(p)} | {gb(m)} | {q:.3f} |")
    lines += ["", f"Data: a token file of 65536 uint16 tokens, token i = i mod 500 (learnable). Loss over the steps: {', '.join(f'{x:.4f}' for x in r['losses'])}; "
              f"the run took {r['run_seconds']} s (mean step {r['mean_step_time_s']:.1f} s).", "",
              "The same config under other strategies, refused by the fit check before any rank starts:", ""]
    for x in r["refusals"]:
        lines.append(f"- {x['strategy']}: exit {x['exit_code']} in {x['seconds']} s: `{x['message']}`")
    lines += ["", "Checks: " + ", ".join(f"{k} {'passed' if v else 'FAILED'}" for k, v in r["checks"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
