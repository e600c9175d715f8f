"""safetensors_io.py — a minimal safetensors writer and checking reader for
the fixture scripts (Debian has no `safetensors` Python package).

Format: an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded with
spaces to a multiple of 8, then the tensors' little-endian bytes in order.
Written to a temporary name and renamed.
"""
import json
import os
import struct

import torch

_DTYPES = {
    # safetensors name: (torch dtype, numpy little-endian format, struct code, bytes)
    "F32": (torch.float32, "<f4", "f", 4),
    "I64": (torch.int64, "<i8", "q", 8),
}


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, tensor), laid out in this order. int64 -> I64, else F32."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors:
        dtype = "I64" if t.dtype == torch.int64 else "F32"
        tdt, npfmt, _, _ = _DTYPES[dtype]
        t = t.detach().to(tdt).contiguous().cpu()
        data = t.numpy().astype(npfmt).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    pad = (-len(hjson)) % 8
    hjson += b" " * pad
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """Reparse a file written above; returns (dict name -> tensor, metadata). Checks layout."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, f"{path}: header length {n} not a multiple of 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    expect = 0
    for name, info in header.items():
        assert info["dtype"] in _DTYPES, (path, name, info["dtype"])
        tdt, _, code, size = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        assert b == expect, f"{path}: {name} not contiguous ({b} != {expect})"
        numel = 1
        for d in info["shape"]:
            numel *= d
        assert e - b == size * numel, (path, name)
        vals = struct.unpack("<%d%s" % (numel, code), data[b:e])
        out[name] = torch.tensor(vals, dtype=tdt).reshape(info["shape"])
        expect = e
    assert expect == len(data), f"{path}: trailing bytes ({len(data)} vs {expect})"
    return out, meta
