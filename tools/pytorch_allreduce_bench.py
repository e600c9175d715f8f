#!/usr/bin/python3
"""PyTorch baseline for `ddp bench-comm`: all-reduce with torch.distributed over gloo (CPU), timed
with the same conventions, so that the two are compared on the same machine.

usage (Debian's python3 with torch 1.13, not the pyenv python):
  /usr/bin/python3 tools/pytorch_allreduce_bench.py [--world 2,4,6] [--sizes 1MB,10MB,100MB,1GB]
      [--warmup 5] [--iters N] [--threads 1] [--out FILE]

Conventions, as `ddp bench-comm` (engine/bench/bench_comm.h) and nccl-tests:
  - a float32 tensor of S bytes (binary units: 1MB = 2^20 bytes), dist.all_reduce (SUM, in place);
  - one untimed run on known values (rank r holds r + 1) checked everywhere, then the tensor is zeroed;
  - `warmup` untimed iterations, then `iters` timed ones (default: about 2 GiB per size, between 5
    and 50, as default_iters), each after a dist.barrier(), timed from the call until it returns
    (gloo on CPU returns when the all-reduce is complete);
  - iteration i's time is the mean over ranks (dist.all_gather_object); mean and median over
    iterations; algbw = S / mean time; busbw = algbw * 2(n-1)/n (GB/s = 1e9 bytes/s).
Each rank is a process (torch.multiprocessing spawn) with torch.set_num_threads(--threads), gloo
over 127.0.0.1 on a free port.

Prints one JSON row per (size, world) on stdout (the fields of bench_comm.json's rows, transport
"pytorch-gloo"), progress on stderr, and with --out writes {"rows": [...]} to FILE.
"""

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
         "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text):
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", text)
    if not m or m.group(2).upper() not in UNITS or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size in bytes > 0 (e.g. 4096, 4KB, 1MB, 1GB)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def format_size(n):
    for name, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{name}"
    return f"{n}B"


def default_iters(nbytes):
    return int(min(50, max(5, round((2 << 30) / nbytes))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, sizes, warmup, iters, threads, queue):
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    for nbytes in sizes:
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t)
        expected = world * (world + 1) / 2
        if not bool((t == expected).all()):
            raise RuntimeError(f"all_reduce of {format_size(nbytes)} on {world} ranks: wrong result on rank {rank}")
        t.zero_()
        for _ in range(warmup):
            dist.all_reduce(t)
        n = iters or default_iters(nbytes)
        mine = []
        for _ in range(n):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            mine.append(time.perf_counter() - start)
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        del t
        if rank == 0:
            per_iteration = [sum(r[i] for r in everyone) / world for i in range(n)]
            mean = sum(per_iteration) / n
            algbw = (nbytes // 4 * 4) / mean / 1e9
            row = {"transport": "pytorch-gloo", "op": "all_reduce", "world": world, "bytes": nbytes // 4 * 4,
                   "size": format_size(nbytes // 4 * 4), "iters": n, "warmup": warmup, "mean_s": mean,
                   "median_s": statistics.median(per_iteration), "algbw_GBps": algbw,
                   "busbw_GBps": algbw * 2 * (world - 1) / world, "torch": torch.__version__}
            print(f"pytorch_allreduce_bench: world {world}: all_reduce {row['size']}: {n} iterations, "
                  f"mean {mean * 1e3:.3f} ms, busbw {row['busbw_GBps']:.3f} GB/s", file=sys.stderr, flush=True)
            queue.put(row)
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default="2,4,6", help="world sizes, comma-separated (default 2,4,6)")
    p.add_argument("--sizes", default="1MB,10MB,100MB,1GB", help="sizes, comma-separated (default 1MB,10MB,100MB,1GB)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=0, help="timed iterations (default: 50 down to 5 at 1GB)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--out", help="also write {\"rows\": [...]} to this JSON file")
    a = p.parse_args(argv)
    try:
        worlds = [int(w) for w in a.world.split(",")]
        if any(w < 1 for w in worlds):
            raise ValueError
    except ValueError:
        p.error(f"--world: '{a.world}' is not a comma-separated list of positive integers")
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(f"--sizes: {e}")
    if a.warmup < 0 or a.iters < 0 or a.threads < 1:
        p.error("--warmup and --iters must be >= 0, --threads >= 1")

    rows = []
    ctx = mp.get_context("spawn")
    for world in worlds:
        queue = ctx.SimpleQueue()
        mp.start_processes(rank_main, args=(world, free_port(), sizes, a.warmup, a.iters, a.threads, queue),
                           nprocs=world, join=True, start_method="spawn")
        while not queue.empty():
            rows.append(queue.get())
    for row in rows:
        print(json.dumps(row))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"rows": rows}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
