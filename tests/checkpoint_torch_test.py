#!/usr/bin/python3
"""checkpoint_torch_test.py — a ddp checkpoint continued in PyTorch equals
ddp continuing it, and back (tools/checkpoint_torch.py).

For AdamW (weight decay 0.1) and SGD with momentum, on `toy` from the
fixture's weights and data (tests/fixtures/make_toy_fixtures.py: the same
model in PyTorch), 2 ranks:
  1. ddp trains 6 steps with a checkpoint after step 3;
  2. the step-3 checkpoint, exported, is loaded into PyTorch's model and
     optimizer, which train steps 4-6 on the same batches: its weights equal
     ddp's after step 6 within 1e-5, and its losses ddp's within 1e-6;
  3. PyTorch's state after step 3, imported back, resumes in ddp to weights
     bitwise equal to ddp's own resume; after PyTorch's steps 4-6, imported,
     ddp goes on to step 8 as from its own step 6 (1e-5), all 8 losses said.

usage: checkpoint_torch_test.py --ddp build/bin/ddp
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from make_toy_fixtures import load_into, make_model  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OPTIMIZERS = {
    "adamw": 'name = "adamw"\nlr = 0.1\nweight_decay = 0.1\n',
    "sgd": 'name = "sgd"\nlr = 0.1\nmomentum = 0.9\n',
}


def config(tmp, optimizer):
    path = os.path.join(tmp, f"{optimizer}.toml")
    with open(path, "w") as f:
        f.write(f"""[run]
world_size = 2
steps = 6
timeout_s = 30
[model]
name = "toy"
init_from = "{FIXTURES}/toy_init.safetensors"
[data]
path = "{FIXTURES}/toy_data.safetensors"
batch_size = 20
[optimizer]
{OPTIMIZERS[optimizer]}
[checkpoint]
every = 3
""")
    return path


def ddp(args, cfg, out, *more):
    cmd = [args.ddp, "run", cfg, "--set", f'run.output_dir="{out}"', *more]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}\n{r.stderr}")
    with open(os.path.join(out, "summary.json")) as f:
        return read_safetensors(os.path.join(out, "weights.safetensors"))[0], json.load(f)


def tool(*argv):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "checkpoint_torch.py"), *argv], check=True,
                   stdout=subprocess.DEVNULL)


def continue_in_pytorch(pt, optimizer):
    d = torch.load(pt)
    model = make_model("toy")
    load_into(model, d["model"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names == d["trainable"], (names, d["trainable"])
    opt = (torch.optim.AdamW(trainable, lr=0.1, weight_decay=0.1) if optimizer == "adamw"
           else torch.optim.SGD(trainable, lr=0.1, momentum=0.9))
    opt.load_state_dict(d["optimizer"])
    data, _ = read_safetensors(os.path.join(FIXTURES, "toy_data.safetensors"))
    losses = []
    for _ in range(d["step"], 6):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(data["x"]), data["y"])
        loss.backward()
        losses.append(loss.item())
        opt.step()
    d["model"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    d["optimizer"] = opt.state_dict()
    d["step"] = 6
    d["losses"] = d["losses"] + losses
    return d, losses


def check(args, tmp, optimizer):
    cfg = config(tmp, optimizer)
    whole, summary = ddp(args, cfg, os.path.join(tmp, f"{optimizer}-whole"))
    checkpoint = os.path.join(tmp, f"{optimizer}-whole", "checkpoints", "step-00000003")
    pt = os.path.join(tmp, f"{optimizer}.pt")
    tool("export", checkpoint, pt)
    continued, losses = continue_in_pytorch(pt, optimizer)
    worst = max((continued["model"][n] - whole[n]).abs().max().item() for n in whole)
    assert worst <= 1e-5, f"{optimizer}: PyTorch from the checkpoint differs from ddp by {worst}"
    for step, (mine, theirs) in enumerate(zip(losses, summary["loss"][3:]), start=4):
        assert abs(mine - theirs) <= 1e-6, f"{optimizer}: loss of step {step}: PyTorch {mine}, ddp {theirs}"

    # Back: PyTorch's untouched state after step 3 resumes in ddp as ddp's own checkpoint does.
    back = os.path.join(tmp, f"{optimizer}-back")
    tool("import", pt, back, "--like", checkpoint)
    resumed, _ = ddp(args, cfg, os.path.join(tmp, f"{optimizer}-resumed"), "--resume", checkpoint)
    via_torch, _ = ddp(args, cfg, os.path.join(tmp, f"{optimizer}-via-torch"), "--resume", back)
    for n in resumed:
        assert torch.equal(resumed[n], via_torch[n]), f"{optimizer}: {n} differs after the round trip"
    # PyTorch's own steps 4-6, imported, go on in ddp as ddp's own step 6 does.
    pt6, back6 = os.path.join(tmp, f"{optimizer}-6.pt"), os.path.join(tmp, f"{optimizer}-back6")
    torch.save(continued, pt6)
    tool("import", pt6, back6, "--like", checkpoint)
    own6 = os.path.join(tmp, f"{optimizer}-whole", "checkpoints", "step-00000006")
    mine, s_mine = ddp(args, cfg, os.path.join(tmp, f"{optimizer}-8a"), "--set", "run.steps=8", "--resume", own6)
    theirs, s_theirs = ddp(args, cfg, os.path.join(tmp, f"{optimizer}-8b"), "--set", "run.steps=8", "--resume", back6)
    worst8 = max((mine[n] - theirs[n]).abs().max().item() for n in mine)
    assert worst8 <= 1e-5, f"{optimizer}: ddp on from PyTorch's step 6 differs from ddp's own by {worst8}"
    assert len(s_theirs["loss"]) == 8 and s_theirs["first_step"] == 6, s_theirs["loss"]
    print(f"ok {optimizer}: PyTorch within {worst:.2e} of ddp; the round trip resumes bit for bit; "
          f"ddp on from PyTorch's steps within {worst8:.2e}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ddp", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="ddp-checkpoint-torch-")
    try:
        for optimizer in OPTIMIZERS:
            check(args, tmp, optimizer)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
