#!/usr/bin/env python3
"""tools/preprocess_data.py of Megatron-LM core_r0.10.0, reduced to what tessera implements.

The test oracle and the benchmark peer of `tessera preprocess`: the same flags, the same
processing model (a multiprocessing pool per partition, `imap` over lines in chunks of 32,
one tokenizer per worker, documents written in input order, Megatron's progress lines) and
the numpy writer of indexed_writer.py. Additions that mirror tessera's: JSON-array input with
--text-template, and --partitions ordering computed in memory (line j to partition j mod P,
partitions concatenated) instead of through partition files. The last line it prints is a
machine-readable summary for the benchmark.
"""
import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_bpe import GPT2BPE  # noqa: E402
from indexed_writer import Builder, optimal_dtype  # noqa: E402


class NullTokenizer:
    def __init__(self, vocab_size):
        self.vocab_size = vocab_size + 1
        self.eod = vocab_size

    def tokenize(self, text):
        return [int(x) for x in text.split(" ")] if text else []


def build_tokenizer(args):
    if args.tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPE(args.vocab_file, args.merge_file)
    if args.tokenizer_type == "NullTokenizer":
        return NullTokenizer(args.vocab_size)
    if args.tokenizer_model:  # needs the test venv's transformers / sentencepiece
        import megatron_tokenizers
        return megatron_tokenizers.build(args.tokenizer_type, args.tokenizer_model)
    raise SystemExit(f"unsupported tokenizer {args.tokenizer_type}")


def unescape(template):
    out, i = [], 0
    while i < len(template):
        c = template[i]
        if c == "\\" and i + 1 < len(template) and template[i + 1] in "ntr\\":
            out.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[template[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


class Encoder:
    def __init__(self, args):
        self.args = args
        self.template = unescape(args.text_template) if args.text_template else None

    def initializer(self):
        Encoder.tokenizer = build_tokenizer(self.args)

    def encode(self, json_line):
        data = json.loads(json_line)
        if self.template is not None:
            data = {self.args.json_keys[0]: self.template.format_map(data)}
        ids, lens = {}, {}
        for key in self.args.json_keys:
            text = data[key]
            sentences = text if isinstance(text, list) else [text]
            doc_ids, sentence_lens = [], []
            for sentence in sentences:
                sentence_ids = Encoder.tokenizer.tokenize(sentence)
                if len(sentence_ids) > 0:
                    doc_ids.extend(sentence_ids)
                    sentence_lens.append(len(sentence_ids))
            if len(doc_ids) > 0 and self.args.append_eod:
                doc_ids.append(Encoder.tokenizer.eod)
                sentence_lens[-1] += 1
            ids[key], lens[key] = doc_ids, sentence_lens
        return ids, lens, len(json_line)


def read_records(path):
    """Lines of a JSONL file, or each element of a JSON array re-serialised as one line."""
    with open(path, "r", encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):
        with open(path, "r", encoding="utf-8") as f:
            for rec in json.load(f):
                yield json.dumps(rec, ensure_ascii=False)
        return
    with open(path, "r", encoding="utf-8") as f:
        yield from f


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--input", required=True)
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--tokenizer-type", required=True)
    p.add_argument("--vocab-file")
    p.add_argument("--merge-file")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--tokenizer-model")
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--log-interval", type=int, default=1000)
    p.add_argument("--text-template")
    args = p.parse_args()

    print("Opening", args.input)
    startup_start = time.time()
    encoder = Encoder(args)
    tokenizer = build_tokenizer(args)
    pool = multiprocessing.Pool(args.workers, initializer=encoder.initializer)
    encoded_docs = pool.imap(encoder.encode, read_records(args.input), 32)
    dtype = optimal_dtype(tokenizer.vocab_size)
    parts = [[] for _ in range(args.partitions)]  # documents per partition (P > 1 only)
    builders = {}
    for key in args.json_keys:
        builders[key] = Builder(f"{args.output_prefix}_{key}_document.bin", dtype=dtype)
    startup_end = time.time()
    proc_start = time.time()
    total_bytes_processed = 0
    tokens = 0
    print("Time to startup:", startup_end - startup_start)
    count = 0
    for i, (doc, sentence_lens, bytes_processed) in enumerate(encoded_docs, start=1):
        count = i
        total_bytes_processed += bytes_processed
        for key in doc.keys():
            tokens += len(doc[key])
            if args.partitions > 1:
                parts[(i - 1) % args.partitions].append((key, doc[key], sentence_lens[key]))
            else:
                builders[key].add_document(doc[key], sentence_lens[key])
        if i % args.log_interval == 0:
            elapsed = time.time() - proc_start
            mbs = total_bytes_processed / elapsed / 1024 / 1024
            print(f"Processed {i} documents", f"({i / elapsed} docs/s, {mbs} MB/s).", file=sys.stderr)
    loop_end = time.time()
    for part in parts:
        for key, ids, lens in part:
            builders[key].add_document(ids, lens)
    for key in args.json_keys:
        builders[key].finalize(f"{args.output_prefix}_{key}_document.idx")
    pool.close()
    pool.join()
    elapsed = loop_end - proc_start
    print(f"summary documents={count} tokens={tokens} seconds={elapsed:.6f} "
          f"startup={startup_end - startup_start:.6f}")


if __name__ == "__main__":
    main()
