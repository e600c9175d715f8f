#!/usr/bin/python3
"""tools/plot_trace.py — one training step of `ddp run --trace` output as a PNG timeline.

Draws, for each trace file given (one panel each, stacked, sharing the time
axis so strategies compare at a glance), every rank's two lanes for one step:
  compute        forward, backward (one shade per layer, in the order backward
                 ran), finish (a strategy waiting for its communication),
                 optimizer;
  communication  each collective, from when the comm stream started it to when
                 it was done, labelled with its bytes when there is room.
Time is in milliseconds from the start of the step on rank 0.

usage: tools/plot_trace.py TRACE.json [TRACE.json ...] [--step N] [--labels A,B,...]
                           [--out FILE.png] [--title TEXT]
  --step N     the step to draw (default: the last one in each file)
  --labels     one label per file (default: the file's parent directory name)
  --out        the PNG (default trace.png)

e.g. (docs/traces.md):
  tools/plot_trace.py runs/toy/trace.json runs/overlap/trace.json \\
      --labels naive,overlap --out tools/results/trace-naive-vs-overlap.png
Needs matplotlib (Debian python3-matplotlib; tools/setup.sh installs it).
"""
import argparse
import json
import os
import sys

COMPUTE_COLOURS = {"forward": "#4C72B0", "finish": "#C44E52", "optimizer": "#8172B3"}
BACKWARD_SHADES = ("#55A868", "#8CC99A")  # alternate per layer
COMM_COLOUR = "#DD8452"


def fail(message):
    sys.exit(f"plot_trace: error: {message}")


def load_events(path):
    """The complete ('X') events of a merged trace, grouped by rank:
    {rank: {"compute": [...], "communication": [...]}}."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{path}: {e}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents list (is it a ddp --trace file?)")
    lanes = {}  # (pid, tid) -> lane name, from the metadata events
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lanes[(e["pid"], e["tid"])] = e["args"]["name"]
    ranks = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        lane = lanes.get((e["pid"], e["tid"]))
        if lane in ("compute", "communication"):
            ranks.setdefault(e["pid"], {"compute": [], "communication": []})[lane].append(e)
    if not ranks:
        fail(f"{path}: no compute or communication events")
    return ranks


def step_window(ranks, step):
    """(start, end) in µs of `step` on rank 0 (the last step when None), and the step."""
    steps = [e for e in ranks[min(ranks)]["compute"] if e["name"] == "step"]
    if not steps:
        fail("no 'step' range on rank 0's compute lane")
    if step is None:
        chosen = max(steps, key=lambda e: e["args"]["step"])
    else:
        matching = [e for e in steps if e["args"]["step"] == step]
        if not matching:
            fail(f"no step {step} (steps {steps[0]['args']['step']}..{steps[-1]['args']['step']})")
        chosen = matching[0]
    return chosen["ts"], chosen["ts"] + chosen["dur"], chosen["args"]["step"]


def bars(ranks, start, end):
    """[(rank, lane, x0_ms, width_ms, colour, label)] for everything inside [start, end]."""
    out = []
    for rank in sorted(ranks):
        layer = 0
        for e in sorted(ranks[rank]["compute"], key=lambda e: e["ts"]):
            if e["ts"] + e["dur"] < start or e["ts"] > end:
                continue
            name = e["name"]
            x0, w = (e["ts"] - start) / 1e3, e["dur"] / 1e3
            if name.startswith("backward "):
                out.append((rank, "compute", x0, w, BACKWARD_SHADES[layer % 2], name[len("backward "):]))
                layer += 1
            elif name in COMPUTE_COLOURS:
                out.append((rank, "compute", x0, w, COMPUTE_COLOURS[name], name))
        for e in ranks[rank]["communication"]:
            if e["ts"] + e["dur"] < start or e["ts"] > end:
                continue
            size = e.get("args", {}).get("bytes", 0)
            label = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
            out.append((rank, "communication", (e["ts"] - start) / 1e3, e["dur"] / 1e3, COMM_COLOUR, label))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--step", type=int)
    ap.add_argument("--labels")
    ap.add_argument("--out", default="trace.png")
    ap.add_argument("--title")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else [
        os.path.basename(os.path.dirname(os.path.abspath(p))) for p in args.traces]
    if len(labels) != len(args.traces):
        fail(f"--labels has {len(labels)} names for {len(args.traces)} files")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = []
    for path, label in zip(args.traces, labels):
        ranks = load_events(path)
        start, end, step = step_window(ranks, args.step)
        panels.append((label, step, sorted(ranks), bars(ranks, start, end), (end - start) / 1e3))
    span = max(p[4] for p in panels)
    rows = sum(2 * len(p[2]) for p in panels)
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(12, 0.9 + 0.45 * rows + 0.5 * len(panels)))
    for ax, (label, step, rank_ids, items, length) in zip(axes[:, 0], panels):
        lane_y = {}
        for i, rank in enumerate(rank_ids):
            lane_y[(rank, "compute")] = 2 * i
            lane_y[(rank, "communication")] = 2 * i + 1
        for rank, lane, x0, w, colour, text in items:
            y = lane_y[(rank, lane)]
            ax.broken_barh([(x0, w)], (y - 0.4, 0.8), facecolors=colour, edgecolors="white", linewidth=0.5)
            if w > span / 25:
                ax.text(x0 + w / 2, y, text, ha="center", va="center", fontsize=7, clip_on=True)
        ax.set_yticks([lane_y[k] for k in sorted(lane_y, key=lane_y.get)])
        ax.set_yticklabels([f"rank {r} {'comm' if lane == 'communication' else 'compute'}"
                            for r, lane in sorted(lane_y, key=lane_y.get)], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{label} — step {step}, {length:.0f} ms", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlim(0, span * 1.01)
    axes[-1, 0].set_xlabel("ms from the start of the step (rank 0)")
    fig.legend(handles=[Patch(color=COMPUTE_COLOURS["forward"], label="forward"),
                        Patch(color=BACKWARD_SHADES[0], label="backward (per layer)"),
                        Patch(color=COMPUTE_COLOURS["finish"], label="finish (waiting for comm)"),
                        Patch(color=COMPUTE_COLOURS["optimizer"], label="optimizer"),
                        Patch(color=COMM_COLOUR, label="collective")],
               loc="lower center", ncol=5, fontsize=8, frameon=False)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    tmp = args.out + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, args.out)
    print(f"plot_trace: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
