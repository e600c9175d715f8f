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
# [eval], and counts past what a machine holds.
put("config", "eval", toy + '\n[eval]\nevery = 1\nbatches = 3\nholdout_rows = 4\n'
    '\n%%\neval.batches=100000000\nrun.steps=99999999999999999999\n')
put("config", "eval-path", toy + '\n[eval]\nevery = 0\npath = "missing.tokens"\n')
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

# The plugin-file check: ELF64 headers whose program and section headers
# describe what the file holds, or more.
def elf(size, phdrs, shoff=0, shnum=0):
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, shoff, 0, 64, 56, len(phdrs), 64, shnum, 0)
    body = header + b"".join(struct.pack("<IIQQQQQQ", 1, 5, off, 0, 0, filesz, filesz, 4096) for off, filesz in phdrs)
    return body + bytes(max(0, size - len(body)))


put("plugin_file", "whole", elf(512, [(0, 512)]))
put("plugin_file", "segment-beyond", elf(512, [(0, 512), (256, 4096)]))
put("plugin_file", "sections-beyond", elf(512, [(0, 512)], shoff=4096, shnum=3))
put("plugin_file", "not-elf", b"#!/bin/sh\necho not a library\n")
put("plugin_file", "header-only", elf(64, [])[:40])

# The rendezvous endpoints: environments as NAME=value lines.
for name, env in [("redis", "DDP_RENDEZVOUS=redis:127.0.0.1:6379"), ("file", "DDP_RENDEZVOUS=file:/tmp/x"),
                  ("master", "MASTER_ADDR=10.0.0.1\nMASTER_PORT=29500"), ("bad-port", "MASTER_ADDR=h\nMASTER_PORT=0x10"),
                  ("pmix", "PMIX_NAMESPACE=ns\nOMPI_COMM_WORLD_LOCAL_SIZE=2\nOMPI_COMM_WORLD_SIZE=2"),
                  ("redis-no-port", "DDP_RENDEZVOUS=redis:host:")]:
    put("endpoints", name, env)

# checkpoint.json: first byte odd = seal the rest first (checkpoint_fuzz.cpp).
meta = {"format": "ddp-checkpoint 2", "step": 2, "world_size": 2, "strategy": "sharded", "transport": "gloo",
        "optimizer": "adamw", "trainable": ["fc1.weight"], "losses": [0.7, 0.6],
        "state": {"fc1.weight": {"steps": 2, "pieces": [{"file": "optimizer-0.safetensors", "offset": 0, "count": 4},
                                                         {"file": "optimizer-1.safetensors", "offset": 4, "count": 4}]}},
        "config": {"optimizer.name": "adamw"},
        "files": {"weights.safetensors": {"bytes": 10, "xxh3": "0123456789abcdef"},
                  "optimizer-0.safetensors": {"bytes": 10, "xxh3": "0123456789abcdef"},
                  "optimizer-1.safetensors": {"bytes": 10, "xxh3": "0123456789abcdef"}}}
put("checkpoint", "sealed", b"\x01" + json.dumps(meta, indent=1).encode())
put("checkpoint", "raw", b"\x00" + json.dumps(meta, indent=1).encode() + b',\n "checksum": "0000000000000000"\n}\n')
meta["step"] = 1.5
put("checkpoint", "fraction", b"\x01" + json.dumps(meta, indent=1).encode())
# checkpoint.dir's entries (first byte & 2; keep = first byte >> 2 % 8), the first also as `latest`.
put("checkpoint", "entries", b"\x06step-00000006\nstep-00000002\nstep-00000004\nstep-00000003.partial\n"
    b"step-00000005.replaced\nnotes.txt\nstep-99999999999999999999\n")
put("checkpoint", "latest-out", b"\x02../elsewhere/step-00000004\nstep-00000004\n")


# A built plugin with bytes changed in place: patches of (offset, le16; byte).
def patches(*at):
    return b"".join(struct.pack("<HB", o, v) for o, v in at)


put("plugin_load", "none", b"")
put("plugin_load", "elf-class", patches((4, 1)))
put("plugin_load", "program-headers", patches((0x20, 0xff), (0x38, 0x40), (0x40, 0x07)))
put("plugin_load", "scattered", patches(*[(o, 0xcc) for o in range(0x1000, 0x1100, 7)]))

# bench-comm's arguments, a line each: sizes, collectives, --load.
put("bench_args", "sizes", "4KB\n1MB\n1536KiB\n1GB\n0\n18446744073709551615\n16EB\n1e9\n")
put("bench_args", "names", "all_reduce\nall_gather\nreduce_scatter\nbroadcast\nbarrier\nnone\ngemm\n")

# A plan entry's calls (plan_entry_fuzz.cpp): 0 buffer, 1 collective, 2 steps,
# 3 claims, 4 every, 5 group collective; then their arguments, little-endian.
def buffer(category, size, when):
    return struct.pack("<BBQB", 0, category, size, when)


def collective(op, count, dtype, beside, group=None):
    head = struct.pack("<BBQBB", 1 if group is None else 5, op, count, dtype, beside)
    return head + (b"" if group is None else struct.pack("<i", group))


put("plan_entry", "ddp", collective(0, 1000, 0, 1) + buffer(3, 4000, 0))
put("plan_entry", "huge", buffer(2, 2**64 - 1, 1) + buffer(2, 2**63, 1) + collective(0, 2**62, 0, 0))
put("plan_entry", "groups", struct.pack("<Bq", 4, 4) + collective(2, 4096, 1, 0, group=2) +
    struct.pack("<BHQQ", 2, 1, 0, 2**63) + struct.pack("<BBH", 3, 1, 0))
