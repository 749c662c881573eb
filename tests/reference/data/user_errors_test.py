#!/usr/bin/env python3
"""What a new user meets with data and tokenizer files (each case failed before its fix): a
wrong or damaged GPT-2 merges file is an error in preprocess, train and doctor, not silent
garbage; data tokenized with a larger vocabulary than the model is an error before training (not
an abort) and a doctor FAIL; Alpaca-shaped records get a --text-template hint and an input where
every record is bad writes nothing; `data merge` refuses its own output as an input, however
spelled, and merges a prefix that training made a folder too; `data inspect` prints
document-length statistics and decodes a document."""
import glob
import math
import os
import struct

import harness
from harness import GPT2, MERGES, VOCAB, expect, run_module, tessera

ALPACA = os.path.join(harness.DATA, "corpora", "alpaca_gsm8k_test.json")  # 1319 records
TEMPLATE = ["--text-template", "{instruction}\n{output}"]
# A tiny model; the errors come before the first step, so every run is short.
TRAIN = ["--num-layers", 2, "--hidden-size", 32, "--num-attention-heads", 4, "--seq-length", 64,
         "--max-position-embeddings", 64, "--micro-batch-size", 2, "--global-batch-size", 4, "--lr", "1e-3",
         "--train-iters", 2, "--split", "98,1,1", "--eval-iters", 1, "--eval-interval", 10]


def expect_error(p, code, *needles):
    expect(p.returncode == code, f"exit {p.returncode}, expected {code}\n{p.stdout}\n{p.stderr}")
    for n in needles:
        expect(n in p.stderr, f"'{n}' not in stderr:\n{p.stderr}")


def preprocess(prefix, *tokenizer, check=True):
    return tessera("preprocess", "--input", ALPACA, *TEMPLATE, "--output-prefix", prefix, *tokenizer,
                   "--append-eod", "--workers", 1, "--no-progress-bar", check=check)


def doctor_row(p, check):
    rows = [line for line in p.stdout.splitlines() if line.startswith(check)]
    expect(rows, f"no '{check}' row:\n{p.stdout}\n{p.stderr}")
    return rows[0]


def test_vocab_json_as_merges_file():
    wrong = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", VOCAB, "--merge-file", VOCAB]
    expect_error(preprocess("out", *wrong, check=False), 1, VOCAB + ":1: expected the \"#version\" header",
                 "swapped?")
    expect(not glob.glob("out*"), "preprocess wrote files from a wrong merges file")
    data = preprocess("gsm", *GPT2).returncode == 0 and "gsm_text_document"
    expect_error(tessera("train", *TRAIN, "--data-path", data, *wrong, check=False), 1, VOCAB + ":1:")
    p = tessera("doctor", *TRAIN, "--data-path", data, *wrong, check=False)
    expect(p.returncode == 1, f"doctor exit {p.returncode}\n{p.stdout}")
    row = doctor_row(p, "data: tokenizer")
    expect("FAIL" in row and VOCAB + ":1:" in row, row)


def test_truncated_merges_file():
    with open(MERGES, encoding="utf-8") as f:
        lines = f.read().split("\n")
    with open("merges_cut.txt", "w", encoding="utf-8") as f:  # cut in the middle of line 1001
        f.write("\n".join(lines[:1000]) + "\n" + lines[1000][:2])
    cut = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", VOCAB, "--merge-file", "merges_cut.txt"]
    expect_error(preprocess("out", *cut, check=False), 1, "merges_cut.txt:1001: the last line",
                 "does not end with a newline")
    with open("merges_lines.txt", "w", encoding="utf-8") as f:  # cut after line 1000
        f.write("\n".join(lines[:1000]) + "\n")
    cut[-1] = "merges_lines.txt"
    expect_error(preprocess("out", *cut, check=False), 1, "merges_lines.txt: after its 1000 lines, 49001 tokens",
                 "truncated")
    expect(not glob.glob("out*"), "preprocess wrote files from a damaged merges file")


def test_data_beyond_the_model_vocabulary():
    preprocess("gsm", *GPT2)
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", 1000]
    p = tessera("train", *TRAIN, "--data-path", "gsm_text_document", *null, check=False)
    expect_error(p, 1, "gsm_text_document holds token ids up to 50256",
                 "the model's vocabulary has 1024 ids (NullTokenizer --vocab-size 1000: 1001 tokens, padded to 1024)",
                 "hint: train with the tokenizer flags the data was preprocessed with")
    expect("internal check failed" not in p.stderr, p.stderr)
    p = tessera("doctor", *TRAIN, "--data-path", "gsm_text_document", *null, check=False)
    expect(p.returncode == 1, f"doctor exit {p.returncode}\n{p.stdout}")
    row = doctor_row(p, "data: gsm_text_document")
    expect("FAIL" in row and "holds token ids up to 50256" in row, row)
    p = tessera("doctor", *TRAIN, "--data-path", "gsm_text_document", *GPT2, check=False)
    row = doctor_row(p, "data: gsm_text_document")
    expect("PASS" in row and "fit the padded vocabulary of 50304" in row, row)


def test_alpaca_records_without_a_template():
    base = ["preprocess", "--input", ALPACA, "--output-prefix", "out", *GPT2, "--workers", 1, "--no-progress-bar"]
    expect_error(tessera(*base, check=False), 1, 'record has no key "text"', "these look like Alpaca records",
                 "--text-template '{instruction}\\n{input}\\n{output}'")
    p = tessera(*base, "--skip-bad-records", check=False)
    expect_error(p, 1, "all 1319 records are bad, so there is no dataset to write", "--text-template")
    expect(not glob.glob("out*"), f"an empty dataset was written: {glob.glob('out*')}")


def test_merge_refuses_its_own_output():
    os.mkdir("parts")
    for name in ("a", "b"):
        tessera("preprocess", "--input", ALPACA, *TEMPLATE, "--output-prefix", f"parts/{name}", *GPT2,
                "--workers", 1, "--no-progress-bar")
    tessera("data", "merge", "--input", "parts", "--output-prefix", "parts/all_text_document")
    size = os.path.getsize("parts/all_text_document.bin")
    p = tessera("data", "merge", "--input", "parts", "--output-prefix", "parts/all_text_document", check=False)
    expect_error(p, 2, "--output-prefix parts/all_text_document is also an input")
    os.symlink("parts", "alias")  # the same files under another spelling
    p = tessera("data", "merge", "--input", "parts/a_text_document", "parts/all_text_document",
                "--output-prefix", "./alias/../alias/all_text_document", check=False)
    expect_error(p, 2, "is also an input (parts/all_text_document)")
    expect(os.path.getsize("parts/all_text_document.bin") == size, "the refused merge changed its output")


def test_merge_a_prefix_that_is_also_a_folder():
    """Training keeps its index cache in <prefix>/cache/GPTDataset_indices (Megatron's default
    --data-cache-path), so a prefix trained on is also a folder: its own pair is merged."""
    for name in ("a", "b"):
        tessera("preprocess", "--input", ALPACA, *TEMPLATE, "--output-prefix", name, *GPT2, "--workers", 1,
                "--no-progress-bar")
    os.makedirs("a_text_document/cache/GPTDataset_indices")
    p = tessera("data", "merge", "--input", "a_text_document", "b_text_document", "--output-prefix", "ab")
    expect("2638 documents" in p.stdout, p.stdout)
    os.mkdir("empty")
    p = tessera("data", "merge", "--input", "empty", "--output-prefix", "e", check=False)
    expect_error(p, 1, "there is no empty.bin/.idx pair, and the folder empty holds no .bin/.idx pair")


def document_lengths(prefix):
    """Each document's tokens, read from the .idx as Megatron's format lays it out."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    sequences, documents = struct.unpack_from("<QQ", idx, 18)
    lengths = struct.unpack_from("<%di" % sequences, idx, 34)
    bounds = struct.unpack_from("<%dq" % documents, idx, 34 + 12 * sequences)
    return [sum(lengths[bounds[d]:bounds[d + 1]]) for d in range(documents - 1)]


def test_inspect_lengths_and_decode():
    preprocess("gsm", *GPT2)
    p = tessera("data", "inspect", "gsm_text_document")
    expect("1319 documents" in p.stdout, p.stdout)
    lengths = sorted(document_lengths("gsm_text_document"))
    rank = lambda q: lengths[max(1, math.ceil(q / 100 * len(lengths))) - 1]  # nearest-rank percentile
    want = "document lengths (tokens): min %d, p10 %d, median %d, mean %.1f, p90 %d, p99 %d, max %d" % (
        lengths[0], rank(10), rank(50), sum(lengths) / len(lengths), rank(90), rank(99), lengths[-1])
    expect(want in p.stdout, want + "\n" + p.stdout)
    p = tessera("data", "inspect", "gsm_text_document", "--decode", 3, *GPT2)
    expect("document 3 (69 tokens):\nJames decides to run 3 sprints 3 times a week." in p.stdout, p.stdout)
    expect(p.stdout.rstrip().endswith("#### 540<|endoftext|>"), p.stdout)
    expect_error(tessera("data", "inspect", "gsm_text_document", "--decode", 3, check=False), 2,
                 "--decode needs the tokenizer")
    expect_error(tessera("data", "inspect", "gsm_text_document", "--decode", 1319, *GPT2, check=False), 2,
                 "document 1319 does not exist")


if __name__ == "__main__":
    run_module(globals())
