"""A small numpy writer of Megatron's indexed dataset, following
megatron/core/datasets/indexed_dataset.py only.

It is the independent side of the byte-for-byte tests: tessera's C++ builder must write the
same .bin/.idx bytes. Kept deliberately plain (Megatron's IndexedDatasetBuilder semantics).
"""
import struct

import numpy as np

DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
               np.float64: 6, np.float32: 7, np.uint16: 8}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
MAGIC = b"MMIDIDX\x00\x00"


def optimal_dtype(vocab_size):
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


class Builder:
    def __init__(self, bin_path, dtype=np.int32):
        self.data = open(bin_path, "wb")
        self.dtype = dtype
        self.sequence_lengths = []
        self.document_indices = [0]

    def add_item(self, tokens):
        arr = np.array(tokens, dtype=self.dtype)
        self.data.write(arr.tobytes(order="C"))
        self.sequence_lengths.append(arr.size)

    def end_document(self):
        self.document_indices.append(len(self.sequence_lengths))

    def add_document(self, tokens, lengths):
        arr = np.array(tokens, dtype=self.dtype)
        self.data.write(arr.tobytes(order="C"))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def add_index(self, prefix):
        dtype, lengths, _, documents = read_index(prefix + ".idx")
        assert dtype == self.dtype
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(lengths.tolist())
        self.document_indices.extend((offset + documents)[1:].tolist())
        with open(prefix + ".bin", "rb") as f:
            self.data.write(f.read())

    def finalize(self, idx_path):
        self.data.close()
        itemsize = np.dtype(self.dtype).itemsize
        pointers, p = [], 0
        for n in self.sequence_lengths:
            pointers.append(p)
            p += n * itemsize
        with open(idx_path, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", DTYPE_CODES[self.dtype]))
            f.write(struct.pack("<Q", len(self.sequence_lengths)))
            f.write(struct.pack("<Q", len(self.document_indices)))
            f.write(np.array(self.sequence_lengths, dtype=np.int32).tobytes(order="C"))
            f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
            f.write(np.array(self.document_indices, dtype=np.int64).tobytes(order="C"))


def read_index(idx_path):
    with open(idx_path, "rb") as f:
        buf = f.read()
    assert buf[:9] == MAGIC
    assert struct.unpack("<Q", buf[9:17])[0] == 1
    dtype = CODE_DTYPES[buf[17]]
    s, d = struct.unpack("<QQ", buf[18:34])
    off = 34
    lengths = np.frombuffer(buf, dtype=np.int32, count=s, offset=off)
    off += 4 * s
    pointers = np.frombuffer(buf, dtype=np.int64, count=s, offset=off)
    off += 8 * s
    documents = np.frombuffer(buf, dtype=np.int64, count=d, offset=off)
    return dtype, lengths, pointers, documents
