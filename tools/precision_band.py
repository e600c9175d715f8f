#!/usr/bin/python3
"""The loss under 16-bit compute against float32's: lm-cpu on learnable data.

Runs configs/lm-cpu.toml (2 ranks, `bucketed`, AdamW lr 1e-3) for --steps
steps on the shipped text (tests/fixtures/text.txt as byte tokens: a uint16
token file, random windows of 129 tokens) once per [precision] compute
(fp32, bf16, fp16), the same seed and data, and compares each 16-bit run's
per-step loss (summary.json's `loss`, the global batch's mean) with fp32's:

  band      the largest |mean - fp32's mean| / fp32's mean over windows of
            10 steps (1-10, 11-20, ...): one batch's loss jumps by more
            than that late in training, when it is small
  worst     the largest |loss - fp32 loss| of a single step
  last 20   the mean loss over the last 20 steps, and its ratio to fp32's
  step      the mean step time (the CPU emulates 16 bits: stated, not tuned)
  skipped   the steps fp16's loss scaling skipped (summary.json's
            precision.loss_scale; "-" where the loss is not scaled)

Writes, under --out (default tools/results/precision): results.md (the
table), results.json, and loss.png (the curves; Debian's python3-matplotlib).

usage: tools/precision_band.py [--ddp build/bin/ddp] [--steps 200] [--out DIR]
       tools/precision_band.py --from DIR/results.json   (the table and plot again)
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPUTES = ["fp32", "bf16", "fp16"]


def token_file(path):
    """The shipped text as uint16 byte tokens (< 256, inside lm-cpu's vocabulary)."""
    with open(os.path.join(ROOT, "tests", "fixtures", "text.txt"), "rb") as f:
        text = f.read()
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(text)}H", *text))


def run(ddp, compute, steps, tokens, out_dir):
    out = os.path.join(out_dir, compute)
    cmd = [ddp, "run", os.path.join(ROOT, "configs", "lm-cpu.toml"),
           "--set", f"run.steps={steps}", "--set", "run.log_every=50",
           "--set", f'run.output_dir="{out}"', "--set", 'data.kind="tokens"',
           "--set", f'data.path="{tokens}"', "--set", f'precision.compute="{compute}"']
    print(f"precision_band: {compute}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["precision"]["compute"] == compute, summary["precision"]
    return summary


def mean(values):
    return sum(values) / len(values)


def skipped_of(summary):
    scaling = summary["precision"].get("loss_scale")
    return None if scaling is None else scaling["skipped_steps"]


def compare(losses, step_s, skipped):
    base = losses["fp32"]
    rows = []
    for compute, loss in losses.items():
        windows = range(0, len(loss) - len(loss) % 10, 10)
        band = max(abs(mean(loss[w:w + 10]) - mean(base[w:w + 10])) / mean(base[w:w + 10]) for w in windows)
        rows.append({"compute": compute, "first_loss": loss[0], "last20_loss": mean(loss[-20:]),
                     "last20_ratio": mean(loss[-20:]) / mean(base[-20:]), "band": band,
                     "worst_step_abs": max(abs(a - b) for a, b in zip(loss, base)),
                     "mean_step_s": step_s[compute], "skipped": skipped.get(compute)})
    return rows


def table(rows, steps):
    lines = [f"lm-cpu, 2 ranks, bucketed, AdamW lr 1e-3, {steps} steps on the shipped text "
             "(byte tokens), one seed:", "",
             "| compute | first loss | mean of the last 20 | against fp32 | band: worst 10-step mean "
             "against fp32's | worst step \\|loss − fp32\\| | mean step | skipped steps |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        skipped = "-" if r.get("skipped") is None else str(r["skipped"])
        lines.append(f"| {r['compute']} | {r['first_loss']:.4f} | {r['last20_loss']:.4f} | "
                     f"{r['last20_ratio']:.4f} | {r['band']:.2%} | {r['worst_step_abs']:.3f} | "
                     f"{r['mean_step_s'] * 1e3:.0f} ms | {skipped} |")
    return "\n".join(lines) + "\n"


def plot(losses, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for compute, loss in losses.items():
        ax.plot(range(1, len(loss) + 1), loss, label=compute, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_yscale("log")
    ax.set_title("lm-cpu on the shipped text: [precision] compute")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddp", default=os.path.join(ROOT, "build", "bin", "ddp"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default=os.path.join(ROOT, "tools", "results", "precision"))
    p.add_argument("--from", dest="source", help="a results.json of an earlier run: no runs, its table and plot")
    a = p.parse_args()
    if a.steps < 20:
        p.error("--steps must be at least 20 (the last 20 steps are averaged)")
    if a.source:
        with open(a.source) as f:
            earlier = json.load(f)
        steps, losses = earlier["steps"], earlier["loss"]
        step_s = {r["compute"]: r["mean_step_s"] for r in earlier["rows"]}
        skipped = {r["compute"]: r.get("skipped") for r in earlier["rows"]}
    else:
        with tempfile.TemporaryDirectory(prefix="ddp-precision-") as tmp:
            tokens = os.path.join(tmp, "text.bin")
            token_file(tokens)
            summaries = {c: run(a.ddp, c, a.steps, tokens, tmp) for c in COMPUTES}
        steps, losses = a.steps, {c: s["loss"] for c, s in summaries.items()}
        step_s = {c: s["mean_step_time_s"] for c, s in summaries.items()}
        skipped = {c: skipped_of(s) for c, s in summaries.items()}
    rows = compare(losses, step_s, skipped)
    text = table(rows, steps)
    print(text, end="")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"steps": steps, "rows": rows, "loss": losses}, f, indent=1)
    plot(losses, os.path.join(a.out, "loss.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
