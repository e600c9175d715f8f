#!/usr/bin/env python3
"""make_corpus.py - writes the seed corpora of the fuzz targets (corpus/*).

Seeds are small valid inputs and near misses, so that the fuzzer starts
from the formats' structure: the shipped configs and their overrides, the
toy fixtures and hand-made safetensors headers, token files of a few
lengths. Run from anywhere; it rewrites corpus/ next to it.
"""
import json
import pathlib
import shutil
import struct

here = pathlib.Path(__file__).resolve().parent
repo = here.parent.parent
corpus = here / "corpus"


def put(kind, name, data):
    d = corpus / kind
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None):
    header, blobs, at = {}, b"", 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        blobs += raw
        at += len(raw)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blobs


shutil.rmtree(corpus, ignore_errors=True)

# The config reader: every shipped config, with and without overrides.
for path in sorted((repo / "configs").glob("*.toml")):
    put("config", path.name, path.read_text())
toy = (repo / "configs" / "toy.toml").read_text()
put("config", "toy-overrides", toy + "\n%%\nrun.steps=3\noptimizer.lr=0.5\nstrategy.bucket_mb=\"auto\"\n")
put("config", "groups", toy + '\n[[optimizer.groups]]\nparams = "fc1.*"\nlr = 0.01\n'
    '\n[[schedule.unfreeze]]\nstep = 2\nparams = ["fc2.*"]\n')
put("config", "minimal", '[run]\nsteps = 1\n[model]\nname = "toy"\n[data]\nbatch_size = 2\n'
    '[optimizer]\nname = "sgd"\nlr = 0.1\n[transport]\nplugin = "gloo"\n[strategy]\nplugin = "naive"\n')

# The safetensors reader: the small fixtures and hand-made files.
for name in ["toy_data.safetensors", "toy_init.safetensors"]:
    put("safetensors", name, (repo / "tests" / "fixtures" / name).read_bytes())
f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
put("safetensors", "f32", safetensors({"w": ("F32", [2, 2], f32)}, {"format": "pt"}))
put("safetensors", "mixed", safetensors({
    "a": ("F64", [1], struct.pack("<d", 1.5)),
    "b": ("I64", [2], struct.pack("<2q", 7, -1)),
    "c": ("BF16", [2], b"\x80\x3f\x00\x40"),
    "d": ("I32", [0, 3], b""),
}))
put("safetensors", "empty-header", struct.pack("<Q", 2) + b"{}")
put("safetensors", "short", struct.pack("<Q", 64) + b'{"w":')

# The token-file reader: first byte the context length, then uint16 ids.
for context, count in [(4, 5), (8, 64), (16, 17), (31, 200)]:
    ids = [(i * 37) % 300 for i in range(count)]
    put("tokens", f"ctx{context}-n{count}", bytes([context - 1]) + struct.pack(f"<{count}H", *ids))
put("tokens", "over-vocab", bytes([3]) + struct.pack("<8H", 1, 2, 3, 299, 300, 65535, 0, 4))
put("tokens", "odd", bytes([1]) + b"\x01\x00\x02")
