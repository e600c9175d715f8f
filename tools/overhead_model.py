#!/usr/bin/python3
"""The communication-overhead model against measurement (CS336 assignment 2,
ddp_bucketed_benchmarking (b)): predicted vs measured DDP overhead after backward for bucket sizes
1, 10, 100 and 1000 MB (and "auto"), on lm-cpu, in one invocation.

usage: /usr/bin/python3 tools/overhead_model.py [--config configs/lm-cpu.toml] [--buckets 1,10,100,1000,auto]
          [--steps 10] [--warmup 3] [--bench FILE] [--sizes 1MB,4MB,16MB,64MB] [--ddp BIN] [--out DIR]
          [--overlap-optimizer]
  --bench FILE   o and w from this bench_comm.json (its overhead_fit for the config's world size);
                 without it, `ddp bench-comm --ops all_reduce --world N --sizes SIZES` runs first
                 (SIZES: 1MB,4MB,16MB,64MB by default, the range of lm-cpu's buckets)
  --steps S      steps per run (default 10); the first --warmup W (default 3) are left out
  --out DIR      where the runs go (default runs/overhead_model, in the repository)
  --overlap-optimizer  keep bucketed's default overlap_optimizer = true (the update of early
                 buckets then hides part of the last all-reduce, which the model does not know);
                 by default it is false: finish waits for every bucket, as PyTorch DDP

The model (plugins/include/ddp/overhead_model.hpp, docs/benchmarks.md "Communication overhead model"): an
all-reduce of b bytes takes o + b/w; with n_b buckets of a model of s bytes, and computing a
bucket's gradients as long as moving its bytes, the time after backward is
    overhead = n_b * o + s / (n_b * w),   smallest at buckets of sqrt(s * w * o).
Predicted: that formula with the run's actual bucket count n_b and gradient bytes s (from
summary.json's strategy_stats). Measured: the mean over the timed steps of comm_blocked_s, the
time the training thread waited for communication (after backward: in finish).
Prints a Markdown table on stdout and writes DIR/overhead_model.json. Exit status 1 if a run failed.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def say(*args):
    print("overhead_model:", *args, file=sys.stderr, flush=True)


def predicted_overhead_s(o, w, model_bytes, buckets):
    """overhead_model.hpp's predicted_overhead_s: n_b * o + s / (n_b * w)."""
    return buckets * o + model_bytes / (buckets * w)


def fit_from_bench(a):
    """o and w of the all-reduce fit for --world, from --bench or a fresh `ddp bench-comm` -> (bench, o, w)."""
    bench = a.bench
    if not bench:
        d = os.path.join(a.out, "bench-comm")
        cmd = [a.ddp, "bench-comm", "--ops", "all_reduce", "--world", str(a.world), "--sizes", a.sizes, "--out", d]
        say(" ".join(cmd))
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit("overhead_model: ddp bench-comm failed")
        bench = os.path.join(d, "bench_comm.json")
    with open(bench) as f:
        doc = json.load(f)
    if doc.get("load", "none") != "none":
        sys.exit(f"overhead_model: {bench} was measured with --load {doc['load']}: the model prices "
                 "collectives on idle cores; give a bench-comm run without --load")
    fits = [x for x in doc.get("overhead_fit", []) if x["world"] == a.world]
    if not fits:
        sys.exit(f"overhead_model: {bench}: no all_reduce fit for world {a.world} (needs two sizes or more)")
    o = fits[0]["o_s"]
    w = fits[0]["w_bytes_per_s"] or math.inf
    say(f"fit from {bench}: o = {o * 1e6:.1f} us, w = {w / 1e9:.3f} GB/s")
    return bench, o, w


def measure_bucket(a, b, o, w):
    """One `ddp run` with bucket_mb = b -> its row (predicted and measured overhead, step time)."""
    d = os.path.join(a.out, f"bucket_mb-{b}")
    value = '"auto"' if b == "auto" else b
    cmd = [a.ddp, "run", a.config, "--set", "strategy.plugin=bucketed", "--set", f"strategy.bucket_mb={value}",
           "--set", f"strategy.overlap_optimizer={'true' if a.overlap_optimizer else 'false'}",
           "--set", f"run.world_size={a.world}", "--set", f"run.steps={a.steps}",
           "--set", f"run.log_every={a.steps}", "--set", f'run.output_dir="{d}"']
    say(" ".join(cmd))
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        return {"bucket_mb": b, "status": "failed"}
    with open(os.path.join(d, "summary.json")) as f:
        s = json.load(f)
    stats = s["strategy_stats"]
    n_b = len(stats["buckets"])
    model_bytes = sum(x["bytes"] for x in stats["buckets"])
    row = {"bucket_mb": b, "status": "ok", "buckets": n_b, "gradient_bytes": model_bytes,
           "predicted_s": predicted_overhead_s(o, w, model_bytes, n_b),
           "measured_s": statistics.mean(s["comm_blocked_s"][a.warmup:]),
           "step_s": statistics.mean(s["step_time_s"][a.warmup:])}
    if b == "auto":
        row["auto"] = stats["auto"]
    return row


def print_table(rows, o, w, world):
    ok = [r for r in rows if r["status"] == "ok"]
    s_bytes = ok[0]["gradient_bytes"] if ok else 0
    best = math.sqrt(s_bytes * w * o) if o > 0 and s_bytes else 0
    print(f"all_reduce fit (world {world}): o = {o * 1e6:.1f} us, w = {w / 1e9:.3f} GB/s; "
          f"model of {s_bytes / 2**20:.1f} MiB: optimal bucket sqrt(s*w*o) = {best / 2**20:.2f} MiB, "
          f"overhead there 2*sqrt(s*o/w) = {2 * math.sqrt(s_bytes * o / w) * 1e3 if o > 0 else 0:.2f} ms\n")
    print("| bucket_mb | buckets | predicted overhead ms | measured comm blocked ms | step ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['bucket_mb']} | failed | | | |")
            continue
        label = r["bucket_mb"]
        if label == "auto":
            label = f"auto ({r['auto']['chosen_bucket_mb']:.2f})"
        print(f"| {label} | {r['buckets']} | {r['predicted_s'] * 1e3:.2f} | {r['measured_s'] * 1e3:.2f} | "
              f"{r['step_s'] * 1e3:.1f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "lm-cpu.toml"))
    p.add_argument("--buckets", default="1,10,100,1000,auto")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bench")
    p.add_argument("--sizes", default="1MB,4MB,16MB,64MB")
    p.add_argument("--world", type=int, default=2, help="run.world_size of the runs (default 2)")
    p.add_argument("--ddp", default=os.path.join(ROOT, "build", "bin", "ddp"))
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "overhead_model"))
    p.add_argument("--overlap-optimizer", action="store_true")
    a = p.parse_args(argv)
    if not os.access(a.ddp, os.X_OK):
        p.error(f"--ddp: '{a.ddp}' not found (build it: tools/setup.sh)")
    if a.steps <= a.warmup or a.warmup < 0:
        p.error("--steps must exceed --warmup >= 0")
    os.makedirs(a.out, exist_ok=True)
    bench, o, w = fit_from_bench(a)
    rows = [measure_bucket(a, b, o, w) for b in a.buckets.split(",")]
    print_table(rows, o, w, a.world)
    with open(os.path.join(a.out, "overhead_model.json"), "w") as f:
        json.dump({"bench": bench, "world": a.world, "o_s": o, "w_bytes_per_s": None if math.isinf(w) else w,
                   "rows": rows}, f, indent=2)
        f.write("\n")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
