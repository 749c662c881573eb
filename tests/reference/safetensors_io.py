#!/usr/bin/python3
"""A hand-written safetensors reader and writer (struct + json + numpy), independent of
tessera's C++ implementation and of the `safetensors` package (not installed here).

Format: u64 little-endian header length N, N bytes of JSON header (padded with spaces to a
multiple of 8), then the data section. Header: {name: {"dtype", "shape", "data_offsets":
[begin, end]}, optional "__metadata__": {str: str}}; offsets are relative to the data section.

CLI (used by tests/unit/ckpt/safetensors_test.cpp):
    safetensors_io.py dump FILE OUT.json
reads FILE strictly (contiguous data, spaces-only padding, header length a multiple of 8) and
writes {"metadata": {...}, "header_len": N, "tensors": [{"name", "dtype", "shape",
"data_offsets", "hex"}, ...]} in data order.
"""
import json
import struct
import sys

import numpy as np

NUMPY_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bf16 bit patterns
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U16": 2, "U8": 1}


def write(path, tensors, metadata=None):
    """tensors: list of (name, dtype_name, numpy array); data laid out in list order."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, dtype, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=NUMPY_DTYPES[dtype])
        data = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read(path, strict=True):
    """Returns (tensors, metadata, header_len); tensors maps name -> dict(dtype, shape,
    data_offsets, raw bytes). strict also checks the conventions tessera's writer follows."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    text = blob[8:8 + n]
    assert len(text) == n, "truncated header"
    header = json.loads(text.decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        assert 0 <= b <= e <= len(data), (name, b, e, len(data))
        assert e - b == count * SIZES[info["dtype"]], (name, info)
        tensors[name] = {"dtype": info["dtype"], "shape": list(info["shape"]),
                         "data_offsets": [b, e], "raw": data[b:e]}
    if strict:
        assert n % 8 == 0, "header length %d is not a multiple of 8" % n
        stripped = text.rstrip(b" ")
        assert stripped.endswith(b"}") and len(text) - len(stripped) < 8, "bad padding"
        pos = 0
        for t in sorted(tensors.values(), key=lambda t: t["data_offsets"][0]):
            assert t["data_offsets"][0] == pos, "data is not contiguous"
            pos = t["data_offsets"][1]
        assert pos == len(data), "trailing bytes after the last tensor"
    return tensors, metadata, n


def array(t):
    """A tensor from read() as a numpy array (BF16 widened to float32)."""
    a = np.frombuffer(t["raw"], dtype=NUMPY_DTYPES[t["dtype"]]).reshape(t["shape"])
    if t["dtype"] == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


def main(argv):
    if len(argv) != 4 or argv[1] != "dump":
        sys.stderr.write("usage: safetensors_io.py dump FILE OUT.json\n")
        return 2
    tensors, metadata, n = read(argv[2], strict=True)
    order = sorted(tensors, key=lambda k: tensors[k]["data_offsets"][0])
    out = {"metadata": metadata, "header_len": n, "tensors": [
        {"name": k, "dtype": tensors[k]["dtype"], "shape": tensors[k]["shape"],
         "data_offsets": tensors[k]["data_offsets"], "hex": tensors[k]["raw"].hex()}
        for k in order]}
    with open(argv[3], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
