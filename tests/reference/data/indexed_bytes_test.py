#!/usr/bin/env python3
"""`.bin/.idx` byte for byte: tessera's builder (through `tessera preprocess` with the
NullTokenizer, whose ids are the text) and `tessera data merge` against the numpy writer of
indexed_writer.py, which follows Megatron's megatron/core/datasets/indexed_dataset.py; and that
writer against the worked example of docs/data.md."""
import json
import random

import numpy as np

from harness import expect, read, run_module, same_dataset, tessera
from indexed_writer import Builder, optimal_dtype

EXAMPLE_IDX = bytes.fromhex(
    "4d4d4944494458000001000000000000"
    "00080200000000000000030000000000"
    "00000300000002000000000000000000"
    "00000600000000000000000000000000"
    "00000100000000000000020000000000"
    "0000")
EXAMPLE_BIN = bytes.fromhex("0a00140050c41e0050c4")


def test_numpy_writer_matches_worked_example():
    b = Builder("ex.bin", dtype=np.uint16)
    b.add_document([10, 20, 50256], [3])
    b.add_document([30, 50256], [2])
    b.finalize("ex.idx")
    expect(read("ex.idx") == EXAMPLE_IDX, "numpy writer .idx differs from the worked example")
    expect(read("ex.bin") == EXAMPLE_BIN, "numpy writer .bin differs from the worked example")


def test_worked_example_through_tessera():
    # Null tokenizer: text is the ids; vocab 50256 makes EOD 50256 and the dtype uint16.
    with open("in.jsonl", "w") as f:
        f.write(json.dumps({"text": "10 20"}) + "\n")
        f.write(json.dumps({"text": "30"}) + "\n")
    tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "out", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", 50256, "--append-eod", "--workers", 1)
    expect(read("out_text_document.idx") == EXAMPLE_IDX, "tessera .idx differs from the worked example")
    expect(read("out_text_document.bin") == EXAMPLE_BIN, "tessera .bin differs from the worked example")


def random_docs(rng, n, vocab, keys):
    """Records with, per key, a string of ids, '' (an empty document) or a list of sentences."""
    records = []
    for _ in range(n):
        rec = {}
        for k in keys:
            r = rng.random()
            if r < 0.1:
                rec[k] = ""
            elif r < 0.25:
                rec[k] = [" ".join(str(rng.randrange(vocab)) for _ in range(rng.randrange(0, 6)))
                          for _ in range(rng.randrange(0, 4))]
            else:
                rec[k] = " ".join(str(rng.randrange(vocab)) for _ in range(rng.randrange(1, 40)))
        rec["other"] = rng.random()
        records.append(rec)
    return records


def numpy_expected(records, key, vocab, append_eod, partitions, prefix):
    """Megatron's encode + builder, with the numpy writer."""
    docs = []
    for rec in records:
        text = rec[key]
        sentences = text if isinstance(text, list) else [text]
        ids, lens = [], []
        for s in sentences:
            t = [int(x) for x in s.split(" ")] if s else []
            if t:
                ids.extend(t)
                lens.append(len(t))
        if ids and append_eod:
            ids.append(vocab)
            lens[-1] += 1
        docs.append((ids, lens))
    order = [j for p in range(partitions) for j in range(p, len(docs), partitions)]
    b = Builder(prefix + ".bin", dtype=optimal_dtype(vocab + 1))
    for j in order:
        b.add_document(*docs[j])
    b.finalize(prefix + ".idx")


def check_case(seed, n, vocab, keys, append_eod, partitions, workers, chunk):
    rng = random.Random(seed)
    records = random_docs(rng, n, vocab, keys)
    with open("in.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    args = ["preprocess", "--input", "in.jsonl", "--output-prefix", f"t{seed}", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", vocab, "--workers", workers, "--partitions", partitions, "--chunk-bytes", chunk,
            "--json-keys", *keys]
    if append_eod:
        args.append("--append-eod")
    tessera(*args)
    for k in keys:
        numpy_expected(records, k, vocab, append_eod, partitions, f"np{seed}_{k}")
        same_dataset(f"t{seed}_{k}_document", f"np{seed}_{k}")


def test_random_documents_uint16():
    check_case(seed=1, n=300, vocab=50256, keys=["text"], append_eod=True, partitions=1, workers=2, chunk=512)


def test_random_documents_int32_no_eod():
    check_case(seed=2, n=200, vocab=70000, keys=["text"], append_eod=False, partitions=1, workers=1, chunk=65536)


def test_several_keys_each_complete():
    check_case(seed=3, n=250, vocab=1000, keys=["text", "title", "body"], append_eod=True, partitions=1,
               workers=3, chunk=300)


def test_partitions_order():
    check_case(seed=4, n=301, vocab=50256, keys=["text", "title"], append_eod=True, partitions=3, workers=2,
               chunk=700)


def test_empty_input():
    open("in.jsonl", "w").close()
    tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "e", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", 10, "--workers", 1)
    b = Builder("np.bin", dtype=np.uint16)
    b.finalize("np.idx")
    same_dataset("e_text_document", "np")


def test_merge_matches_numpy_add_index():
    rng = random.Random(9)
    prefixes = []
    for i in range(3):
        b = Builder(f"part{i}.bin", dtype=np.uint16)
        for _ in range(rng.randrange(0, 50)):
            lens = [rng.randrange(0, 9) for _ in range(rng.randrange(0, 3))]
            b.add_document([rng.randrange(50000) for _ in range(sum(lens))], lens)
        b.finalize(f"part{i}.idx")
        prefixes.append(f"part{i}")
    m = Builder("np_merged.bin", dtype=np.uint16)
    for p in prefixes:
        m.add_index(p)
    m.finalize("np_merged.idx")
    tessera("data", "merge", "--input", *prefixes, "--output-prefix", "merged")
    same_dataset("merged", "np_merged")
    # A folder stands for its datasets sorted by name (tools/merge_datasets.py).
    import os
    import shutil
    os.makedirs("dir")
    for i, p in enumerate(reversed(prefixes)):
        for ext in (".bin", ".idx"):
            shutil.copy(p + ext, f"dir/{chr(ord('c') - i)}{ext}")  # part2 -> a, part1 -> b, part0 -> c
    m2 = Builder("np_dir.bin", dtype=np.uint16)
    for p in ("dir/a", "dir/b", "dir/c"):
        m2.add_index(p)
    m2.finalize("np_dir.idx")
    tessera("data", "merge", "--input", "dir", "--output-prefix", "merged_dir")
    same_dataset("merged_dir", "np_dir")


if __name__ == "__main__":
    run_module(globals())
