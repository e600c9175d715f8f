#!/usr/bin/env python3
"""tools/bench_mpi.py — the mpi transport against Open MPI's own
MPI_Allreduce, in one invocation: for each round and world size, raw
MPI_Allreduce (tools/mpi_allreduce_bench.c, built here with mpicc) and
`ddp bench-comm --transport mpi` (started by mpirun) alternate, with the
same conventions (engine/bench/bench_comm.h) and the same Open MPI
settings (mpirun below). Prints, per world size and
size, each one's median busbw over the rounds and the ratio plugin / raw:
median and min–max of the per-round ratios.

usage: tools/bench_mpi.py [--worlds 2,4] [--sizes 1MB,10MB,100MB] [--rounds 3] [--ddp build/bin/ddp]
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def size_bytes(text):
    return int(text[:-2]) * UNITS[text[-2:].upper()]


def mpirun(world):
    """mpirun for both sides, with the same Open MPI settings: those the mpi
    plugin would choose by itself (it yields while idle where the ranks have
    fewer than two cores each), so that the ratio is the plugin's overhead,
    not a difference of settings."""
    yield_when_idle = "1" if 2 * world > (os.cpu_count() or 1) else "0"
    cmd = ["mpirun", "--oversubscribe", "-np", str(world), "--mca", "mpi_yield_when_idle", yield_when_idle]
    return cmd + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def raw(binary, world, sizes):
    out = subprocess.run(mpirun(world) + [binary] + [str(size_bytes(s)) for s in sizes], check=True,
                         capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| MPI_Allreduce")]
    return {int(r[3]): float(r[7]) for r in rows}  # bytes -> busbw


def plugin(args, world, sizes, tmp):
    rdzv, out = tempfile.mkdtemp(dir=tmp), tempfile.mkdtemp(dir=tmp)
    subprocess.run(mpirun(world) + ["-x", f"DDP_RENDEZVOUS=file:{rdzv}", args.ddp, "bench-comm", "--transport",
                                    "mpi", "--world", str(world), "--sizes", ",".join(sizes), "--ops",
                                    "all_reduce", "--out", out], check=True, capture_output=True)
    with open(os.path.join(out, "bench_comm.csv")) as f:
        return {int(r["bytes"]): float(r["busbw_GBps"]) for r in csv.DictReader(f)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--sizes", default="1MB,10MB,100MB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ddp", default=os.path.join(ROOT, "build", "bin", "ddp"))
    args = p.parse_args()
    sizes = args.sizes.split(",")
    tmp = tempfile.mkdtemp(prefix="ddp-bench-mpi-")
    try:
        binary = os.path.join(tmp, "mpi_allreduce_bench")
        subprocess.run(["mpicc", "-O2", "-o", binary, os.path.join(ROOT, "tools", "mpi_allreduce_bench.c")], check=True)
        print("| world | size | raw busbw GB/s | mpi busbw GB/s | mpi / raw (min–max) |")
        print("|---|---|---|---|---|")
        for world in [int(w) for w in args.worlds.split(",")]:
            got = {"raw": [], "mpi": []}
            for r in range(args.rounds):  # alternate, the order swapped each round
                order = [("raw", lambda: raw(binary, world, sizes)), ("mpi", lambda: plugin(args, world, sizes, tmp))]
                for name, run in order if r % 2 == 0 else order[::-1]:
                    got[name].append(run())
            for s in sizes:
                b = size_bytes(s)
                raws, mpis = [g[b] for g in got["raw"]], [g[b] for g in got["mpi"]]
                ratios = [m / r for m, r in zip(mpis, raws)]
                print(f"| {world} | {s} | {statistics.median(raws):.2f} | {statistics.median(mpis):.2f} | "
                      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
