#!/usr/bin/python3
"""tools/checkpoint_torch.py — a ddp checkpoint to PyTorch and back.

  checkpoint_torch.py export CHECKPOINT OUT.pt
      OUT.pt (torch.save) holds {"model": the model's state_dict, "optimizer":
      torch.optim.SGD's or AdamW's state_dict over the trainable parameters in
      model order, "step": optimizer steps done, "trainable": their names,
      "losses": the mean loss of every step so far}.
      Load it with model.load_state_dict(d["model"]) and, for an optimizer
      made as torch.optim.AdamW([p for p in model.parameters() if
      p.requires_grad], ...), optimizer.load_state_dict(d["optimizer"]).

  checkpoint_torch.py import IN.pt CHECKPOINT_OUT --like CHECKPOINT
      A ddp checkpoint from IN.pt (as export writes it, after PyTorch trained
      on: put the new step in "step" and append each step's loss to
      "losses"), with the run's metadata (config, plugins) of CHECKPOINT.
      Continue with: ddp run CONFIG --resume CHECKPOINT_OUT.
      A CHECKPOINT may also be a checkpoint.dir holding `latest`.

The layout is docs/checkpoints.md's. One optimizer group (no
[[optimizer.groups]]); the learning rate in the state_dict is optimizer.lr
(a schedule is the trainer's to apply). Checksums as the engine's
(engine/train/checkpoint_files.h): export checks them, import writes them.
Needs Debian's python3-torch and python3-xxhash.
"""
import argparse
import json
import re
import os
import sys

import torch
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

SUFFIXES = {"adamw": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}


def number(config, key, fallback):
    return float(config[key]) if key in config else fallback


def param_group(meta, count):
    """The optimizer's one group, with every key this PyTorch's optimizer has."""
    config, name = meta["config"], meta["optimizer"]
    if any(k.startswith("optimizer.groups") for k in config):
        sys.exit("checkpoint_torch: [[optimizer.groups]] is not supported: one group only")
    lr = number(config, "optimizer.lr", 0.0)
    if name == "adamw":
        betas = tuple(json.loads(config.get("optimizer.betas", "[0.9, 0.999]")))
        made = torch.optim.AdamW([torch.zeros(1)], lr=lr, betas=betas, eps=number(config, "optimizer.eps", 1e-8),
                                 weight_decay=number(config, "optimizer.weight_decay", 0.01))
    else:
        made = torch.optim.SGD([torch.zeros(1)], lr=lr, momentum=number(config, "optimizer.momentum", 0.0),
                               weight_decay=number(config, "optimizer.weight_decay", 0.0))
    group = made.state_dict()["param_groups"][0]
    group["params"] = list(range(count))
    return group


def fail(message):
    sys.exit(f"checkpoint_torch: {message}")


def checkpoint_path(path):
    """`path`, or the checkpoint its `latest` names."""
    if os.path.isfile(os.path.join(path, "checkpoint.json")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return checkpoint_path(os.path.join(path, f.read().strip()))
    fail(f"{path}: not a checkpoint (no checkpoint.json in it, and no 'latest')")


SEAL = ',\n "checksum": "'


def seal(text):
    """checkpoint.json's text with its own digest as its last member (seal_meta)."""
    prefix = text.rstrip(" \n")[:-1].rstrip(" \n") + SEAL
    return prefix + xxhash.xxh3_64_hexdigest(prefix.encode()) + '"\n}\n'


def file_digest(path):
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return {"bytes": os.path.getsize(path), "xxh3": h.hexdigest()}


def read_meta(path):
    """checkpoint.json at `path`, its checksum and every file's digest checked."""
    name = os.path.join(path, "checkpoint.json")
    with open(name, "rb") as f:
        text = f.read()
    at = text.rfind(SEAL.encode())
    digits = at + len(SEAL)
    if at < 0 or text[digits + 16:] != b'"\n}\n' or \
            xxhash.xxh3_64_hexdigest(text[:digits]) != text[digits:digits + 16].decode("ascii", "replace"):
        fail(f"{name}: its checksum does not hold: changed after it was written")
    meta = json.loads(text)
    for file, want in meta["files"].items():
        if not re.fullmatch(r"weights\.safetensors|optimizer-[0-9]{1,9}\.safetensors", file) or \
                not os.path.isfile(os.path.join(path, file)) or file_digest(os.path.join(path, file)) != want:
            fail(f"{os.path.join(path, file)}: not the file checkpoint.json records (size or xxh3)")
    return meta


def read_checkpoint(path):
    meta = read_meta(path)
    weights, _ = read_safetensors(os.path.join(path, "weights.safetensors"))
    files = {}
    if any("pieces" in s for s in meta["state"].values()):
        fail(f"{path}: optimizer state in pieces (sharded stage 2) is not exported: resume it with ddp under another "
             "strategy or stage, checkpoint, and export that")
    for s in meta["state"].values():
        if s["file"] not in files:
            files[s["file"]], _ = read_safetensors(os.path.join(path, s["file"]))
    return meta, weights, files


def export(args):
    meta, weights, files = read_checkpoint(checkpoint_path(args.checkpoint))
    state = {}
    for index, name in enumerate(meta["trainable"]):
        s = meta["state"].get(name)
        if s is None:
            continue  # never stepped (a parameter the model does not use)
        entry = {k: files[s["file"]][f"{name}.{k}"] for k in SUFFIXES[meta["optimizer"]]
                 if f"{name}.{k}" in files[s["file"]]}
        if meta["optimizer"] == "adamw":
            entry["step"] = torch.tensor(float(s["steps"]))
        state[index] = entry
    out = {"model": weights, "step": meta["step"], "trainable": meta["trainable"], "losses": meta["losses"],
           "optimizer": {"state": state, "param_groups": [param_group(meta, len(meta["trainable"]))]}}
    torch.save(out, args.out)
    print(f"{args.out}: {len(weights)} parameters, optimizer state of {len(state)}, after step {meta['step']}")


def import_(args):
    like = checkpoint_path(args.like)
    meta = read_meta(like)
    d = torch.load(args.pt)
    names = list(d["model"].keys())
    like_weights, _ = read_safetensors(os.path.join(like, "weights.safetensors"))
    if names != list(like_weights.keys()):
        fail(f"{args.pt}'s parameters are not {like}'s: {names}")
    losses = list(d.get("losses", meta["losses"]))[:int(d["step"])]
    if len(losses) != int(d["step"]):
        fail(f"{args.pt} has {len(losses)} losses for {int(d['step'])} steps: append each step's loss to its "
             "\"losses\"")
    if os.path.exists(args.out):
        fail(f"{args.out} exists: give a new directory")
    os.makedirs(args.out)
    write_safetensors(os.path.join(args.out, "weights.safetensors"), [(n, d["model"][n]) for n in names],
                      {"format": "pt"})
    tensors, state = [], {}
    for index, entry in d["optimizer"]["state"].items():
        name = meta["trainable"][index]
        tensors += [(f"{name}.{k}", entry[k]) for k in SUFFIXES[meta["optimizer"]] if k in entry]
        state[name] = {"file": "optimizer-0.safetensors", "steps": int(entry.get("step", torch.tensor(0.0)))}
    write_safetensors(os.path.join(args.out, "optimizer-0.safetensors"), tensors, {"format": "pt"})
    meta.pop("checksum")
    files = {f: file_digest(os.path.join(args.out, f)) for f in ("optimizer-0.safetensors", "weights.safetensors")}
    meta.update(step=int(d["step"]), state=state, losses=losses, files=files)
    with open(os.path.join(args.out, "checkpoint.json"), "w") as f:  # last: the checkpoint is whole
        f.write(seal(json.dumps(meta, indent=1)))
    print(f"{args.out}: a ddp checkpoint after step {meta['step']}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="a ddp checkpoint to a PyTorch file")
    e.add_argument("checkpoint")
    e.add_argument("out")
    i = sub.add_parser("import", help="a PyTorch file to a ddp checkpoint")
    i.add_argument("pt")
    i.add_argument("out")
    i.add_argument("--like", required=True, help="the checkpoint whose metadata the new one takes")
    args = p.parse_args()
    export(args) if args.command == "export" else import_(args)


if __name__ == "__main__":
    main()
