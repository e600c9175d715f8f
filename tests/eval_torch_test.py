#!/usr/bin/python3
"""eval_torch_test.py — [eval]'s held-out loss equals PyTorch's computation
of the same loss, on lm-tiny (tools/torch_models.py: the same model).

ddp trains lm-tiny on 2 ranks for 3 steps (random data with a teacher)
and evaluates after steps 2 and 3 on a held-out file of token rows
(eval.path, safetensors, 2 global batches of 8 rows). The final weights
(weights.safetensors), loaded into PyTorch's lm, give on those rows — each
rank's 4 rows of each batch, its mean over batches, the mean over ranks —
the val_loss of step 3 in summary.json within 1e-6; the progress line
prints it. A configuration without held-out rows is refused by name.

usage: eval_torch_test.py --ddp build/bin/ddp
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402
from torch_models import LM, LM_PRESETS  # noqa: E402

WORLD, BATCH, BATCHES = 2, 8, 2

CONFIG = """[run]
world_size = 2
steps = 3
seed = 11
timeout_s = 60
threads = 1
[model]
name = "lm"
preset = "lm-tiny"
[data]
kind = "random"
teacher = true
batch_size = 8
[optimizer]
name = "adamw"
lr = 0.01
[eval]
every = 2
batches = 2
path = "heldout.safetensors"
[strategy]
plugin = "bucketed"
"""


def torch_val_loss(weights, rows):
    cfg = LM_PRESETS["lm-tiny"]
    model = LM(**cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(weights[n])
    per_rank = []
    local = BATCH // WORLD
    with torch.no_grad():
        for r in range(WORLD):
            losses = []
            for b in range(BATCHES):
                tokens = rows[b * BATCH + r * local:b * BATCH + (r + 1) * local]
                logits = model(tokens[:, :-1])
                losses.append(float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))))
            per_rank.append(sum(losses) / BATCHES)
    return sum(per_rank) / WORLD


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddp", required=True)
    args = ap.parse_args()
    cfg = LM_PRESETS["lm-tiny"]
    with tempfile.TemporaryDirectory() as d:
        gen = torch.Generator().manual_seed(5)
        rows = torch.randint(0, cfg["vocab_size"], (BATCH * BATCHES, cfg["context_length"] + 1), generator=gen)
        write_safetensors(os.path.join(d, "heldout.safetensors"), [("tokens", rows)])
        with open(os.path.join(d, "eval.toml"), "w") as f:
            f.write(CONFIG)
        out = os.path.join(d, "out")
        run = subprocess.run([args.ddp, "run", os.path.join(d, "eval.toml"), "--set", f'run.output_dir="{out}"'],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        ev = summary["eval"]
        assert ev["after_steps"] == [2, 3], ev
        assert summary["val_loss"][0] is None and len(ev["val_loss"]) == 2, summary["val_loss"]
        weights, _ = read_safetensors(os.path.join(out, "weights.safetensors"))
        want = torch_val_loss(weights, rows)
        got = ev["val_loss"][1]
        print(f"val loss after step 3: ddp {got:.9f}, PyTorch {want:.9f}, difference {abs(got - want):.2e}")
        assert abs(got - want) <= 1e-6, (got, want)
        assert f"val loss {got:.6f}" in run.stdout, run.stdout
        # Held-out rows are required: a token model on random data has its own stream; a file must be named.
        bad = CONFIG.replace('kind = "random"\nteacher = true', 'path = "heldout.safetensors"').replace(
            'path = "heldout.safetensors"\n[strategy]', "[strategy]")
        with open(os.path.join(d, "bad.toml"), "w") as f:
            f.write(bad)
        run = subprocess.run([args.ddp, "run", os.path.join(d, "bad.toml"), "--set", f'run.output_dir="{out}2"'],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode != 0
        assert ("[eval] needs held-out rows: eval.path (a file of them) or eval.holdout_rows (the last rows of "
                "data.path)") in run.stderr, run.stderr
    print("eval_torch_test: ok")


if __name__ == "__main__":
    main()
