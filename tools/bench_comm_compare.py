#!/usr/bin/python3
"""All-reduce through our `gloo` transport plugin (`ddp bench-comm`) against PyTorch 1.13's
torch.distributed over gloo (tools/pytorch_allreduce_bench.py), in one invocation on this machine,
with the ratio table of issue 5's target.

usage: /usr/bin/python3 tools/bench_comm_compare.py [--world 2,4,6] [--sizes 1MB,10MB,100MB,1GB]
          [--rounds R] [--warmup 5] [--iters N] [--ddp BIN] [--out DIR] [--set transport.key=value]...
  --rounds R   rounds of alternation (default 1): each round runs, per world size, ours then
               PyTorch, so that both share the machine's noise; busbw is the median over rounds
  --ddp BIN    our launcher (default build/bin/ddp, in the repository)
  --out DIR    where everything goes (default runs/bench_comm_compare, in the repository):
               ddp-w<N>-r<R>/bench_comm.json, pytorch-w<N>-r<R>.json, compare.json (the table)
               and bench_comm.png (busbw against size, both implementations)
  --set        passed to ddp bench-comm (e.g. --set transport.algorithm=bcube)
Both use the same conventions (engine/bench/bench_comm.h): float32, 5 warm-up iterations, a barrier
before each timed one, mean over ranks per iteration, busbw = S / mean time * 2(n-1)/n.
Target (issue 5): ours / PyTorch >= 1.5 at 1MB and >= 1.0 at every other size and world size.
Prints the Markdown table on stdout; exit status 1 if a run failed, else 0 (a missed target is
reported in the table, not in the exit status: this is a benchmark).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Issue 5's PyTorch 1.13 measurements on this machine kind (busbw GB/s), for reference.
ISSUE_PYTORCH = {2: {"1MB": 0.38, "10MB": 1.20, "100MB": 1.30, "1GB": 1.38},
                 4: {"1MB": 0.20, "10MB": 0.82, "100MB": 0.76, "1GB": 0.92},
                 6: {"1MB": 0.12, "10MB": 0.56, "100MB": 0.65, "1GB": 0.68}}


def say(*args):
    print("bench_comm_compare:", *args, file=sys.stderr, flush=True)


def run(cmd):
    say(" ".join(cmd))
    return subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode == 0


def target(size):
    return 1.5 if size == "1MB" else 1.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default="2,4,6")
    p.add_argument("--sizes", default="1MB,10MB,100MB,1GB")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--ddp", default=os.path.join(ROOT, "build", "bin", "ddp"))
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_comm_compare"))
    p.add_argument("--set", action="append", default=[], dest="sets")
    a = p.parse_args(argv)
    if not os.access(a.ddp, os.X_OK):
        p.error(f"--ddp: '{a.ddp}' not found (build it: tools/setup.sh)")
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    worlds = [int(w) for w in a.world.split(",")]
    os.makedirs(a.out, exist_ok=True)

    ours, theirs, failed = {}, {}, False  # (world, size) -> [busbw per round]
    files = []
    common = ["--sizes", a.sizes, "--warmup", str(a.warmup), "--iters", str(a.iters)]
    for r in range(a.rounds):
        for w in worlds:
            d = os.path.join(a.out, f"ddp-w{w}-r{r}")
            cmd = [a.ddp, "bench-comm", "--ops", "all_reduce", "--world", str(w), "--out", d] + common
            for s in a.sets:
                cmd += ["--set", s]
            if run(cmd):
                files.append(os.path.join(d, "bench_comm.json"))
                with open(files[-1]) as f:
                    for row in json.load(f)["rows"]:
                        ours.setdefault((w, row["size"]), []).append(row["busbw_GBps"])
            else:
                failed = True
            j = os.path.join(a.out, f"pytorch-w{w}-r{r}.json")
            if run([sys.executable, os.path.join(ROOT, "tools", "pytorch_allreduce_bench.py"), "--world", str(w),
                    "--out", j] + common):
                files.append(j)
                with open(j) as f:
                    for row in json.load(f)["rows"]:
                        theirs.setdefault((w, row["size"]), []).append(row["busbw_GBps"])
            else:
                failed = True

    table = []
    print("| world | size | PyTorch busbw GB/s | ours busbw GB/s | ours / PyTorch | target | met | "
          "issue's PyTorch GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for w in worlds:
        for size in a.sizes.split(","):
            o, t = ours.get((w, size)), theirs.get((w, size))
            mo = statistics.median(o) if o else None
            mt = statistics.median(t) if t else None
            ratio = mo / mt if mo and mt else None
            met = ratio is not None and ratio >= target(size)
            ref = ISSUE_PYTORCH.get(w, {}).get(size)
            table.append({"world": w, "size": size, "pytorch_busbw_GBps": mt, "ours_busbw_GBps": mo, "ratio": ratio,
                          "target": target(size), "met": met, "issue_pytorch_busbw_GBps": ref})
            f3 = (lambda x: "—" if x is None else f"{x:.3f}")
            print(f"| {w} | {size} | {f3(mt)} | {f3(mo)} | {'—' if ratio is None else f'{ratio:.2f}x'} | "
                  f">= {target(size)}x | {'yes' if met else 'NO'} | {'—' if ref is None else ref} |")
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump({"rounds": a.rounds, "table": table}, f, indent=2)
        f.write("\n")
    if files:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_bench_comm.py"), *files,
                        "--out", os.path.join(a.out, "bench_comm.png")])
    say(f"wrote {os.path.join(a.out, 'compare.json')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
