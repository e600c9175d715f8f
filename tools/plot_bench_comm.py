#!/usr/bin/python3
"""Plots `ddp bench-comm` results: bus bandwidth against size, one line per (transport, op, world).

usage: /usr/bin/python3 tools/plot_bench_comm.py RESULTS.json [MORE.json ...] [--out FILE.png]
  RESULTS.json   bench_comm.json from `ddp bench-comm`, or any file of the same shape
                 ({"rows": [{"transport", "op", "world", "bytes", "busbw_GBps"}, ...]}), e.g.
                 tools/pytorch_allreduce_bench.py --out; rows of all files go on one plot
                 (a point measured in several files is their median)
  --out FILE     the PNG (default: bench_comm.png beside the first file)
Needs matplotlib (Debian: python3-matplotlib). Log-scale size axis; one colour per world size,
one marker per op, one line style per transport.
"""
import argparse
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARKERS = {"all_reduce": "o", "all_gather": "s", "reduce_scatter": "^", "broadcast": "D"}
STYLES = ["-", "--", ":", "-."]


def size_label(n):
    for name, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{name}"
    return f"{n}B"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--out")
    a = p.parse_args(argv)
    rows = []
    for path in a.results:
        try:
            with open(path) as f:
                rows += json.load(f)["rows"]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"plot_bench_comm: {path}: not a bench-comm results file ({e})")
    if not rows:
        sys.exit(f"plot_bench_comm: {a.results[0]}: no rows")
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(a.results[0])), "bench_comm.png")

    transports = sorted({r["transport"] for r in rows})
    worlds = sorted({r["world"] for r in rows})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(8, 5))
    lines = sorted({(r["transport"], r["op"], r["world"]) for r in rows})
    for transport, op, world in lines:
        by_size = {}  # several files (rounds) may measure the same point: their median
        for r in rows:
            if (r["transport"], r["op"], r["world"]) == (transport, op, world):
                by_size.setdefault(r["bytes"], []).append(r["busbw_GBps"])
        pts = sorted((b, statistics.median(v)) for b, v in by_size.items())
        ax.plot([b for b, _ in pts], [bw for _, bw in pts], marker=MARKERS.get(op, "x"),
                linestyle=STYLES[transports.index(transport) % len(STYLES)],
                color=colours[worlds.index(world) % len(colours)], label=f"{transport} {op} n={world}")
    sizes = sorted({r["bytes"] for r in rows})
    # Ticks at the round sizes (all_gather and reduce_scatter on 6 ranks move
    # S rounded down to whole floats per rank: 1048560 bytes for 1MB).
    ticks = [s for s in sizes if size_label(s)[-2:] in ("KB", "MB", "GB")] or sizes
    ax.set_xscale("log")
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(s) for s in ticks])
    ax.minorticks_off()
    ax.set_xlabel("size S (nccl-tests convention)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Collective bus bandwidth (nccl-tests' busbw), float32")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, out)
    print(f"plot_bench_comm: wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
