#!/usr/bin/env python3
"""Benchmark: tokenization speed of tessera's HuggingFaceTokenizer and SentencePiece
tokenizers against the libraries Megatron uses, on one worker, side by side in one run.

  /opt/tessera/test-venv/bin/python bench/tokenizer_bench.py [--tessera build/src/tessera/cli/tessera]
                                                             [--scale 4] [--repeat 3]

The tokenizers are the ones tests/reference/data/model_file_tokenizers_test.py trains
(byte-level BPE with Llama-3's split regex, NFC, ignore_merges and a bos template; SentencePiece
BPE with byte fallback), on tinyshakespeare (one document per paragraph) and the Chinese corpus,
repeated --scale times.

- tessera: `tessera preprocess --workers 1`; its processing time (JSON parsing, tokenizing and
  writing the .bin/.idx, after start-up) from its `Done:` line.
- peers, in this process: tokenizers (Rust) `Tokenizer.encode_batch(docs)` with RAYON_NUM_THREADS=1
  (tokenizing only, documents already in memory); sentencepiece `encode(docs, num_threads=1)`.
MB/s is text bytes (UTF-8) / time; each figure is the best of --repeat runs. tessera's time
includes work the peers are not timed for, so its ratio is a lower bound. Prints figures;
never fails a build.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # one worker for tokenizers' batch encode
os.environ["TOKENIZERS_PARALLELISM"] = "false"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference", "data"))
import model_file_tokenizers_test as models  # noqa: E402


def best(repeat, fn):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def tessera_seconds(binary, jsonl, work, tokenizer_type, model, repeat):
    times = []
    for _ in range(repeat):
        p = subprocess.run([binary, "preprocess", "--input", jsonl, "--output-prefix", os.path.join(work, "o"),
                            "--tokenizer-type", tokenizer_type, "--tokenizer-model", model, "--workers", "1",
                            "--no-progress-bar"], capture_output=True, text=True, check=True)
        times.append(float(re.search(r"in ([0-9.]+) s", p.stdout).group(1)))
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "src", "tessera", "cli", "tessera"))
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import sentencepiece
    import tokenizers

    english, chinese = models.corpus_texts()
    hf_folder, sp_model = models.llama3(), models.train_sp()
    rust = tokenizers.Tokenizer.from_file(os.path.join(hf_folder, "tokenizer.json"))
    sp = sentencepiece.SentencePieceProcessor(model_file=sp_model)
    print(f"tokenizers {tokenizers.__version__}, sentencepiece {sentencepiece.__version__}; best of {args.repeat}")
    print("| corpus | tokenizer | peer | peer MB/s | tessera MB/s | tessera / peer |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    work = tempfile.mkdtemp(prefix="tessera-tokbench-")
    for corpus, docs in [("English (tinyshakespeare)", english * args.scale),
                         ("Chinese (chinese_daodejing)", chinese * 200 * args.scale)]:
        text_mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
        jsonl = os.path.join(work, "in.jsonl")
        models.write_jsonl(jsonl, docs)
        rows = [
            ("HuggingFaceTokenizer (Llama-3 regex)", f"tokenizers {tokenizers.__version__} (Rust)",
             best(args.repeat, lambda: rust.encode_batch(docs, add_special_tokens=True)),
             tessera_seconds(args.tessera, jsonl, work, "HuggingFaceTokenizer", hf_folder, args.repeat)),
            ("GPTSentencePieceTokenizer (BPE)", f"sentencepiece {sentencepiece.__version__} (C++)",
             best(args.repeat, lambda: sp.encode(docs, num_threads=1)),
             tessera_seconds(args.tessera, jsonl, work, "GPTSentencePieceTokenizer", sp_model, args.repeat)),
        ]
        for name, peer, peer_s, mine_s in rows:
            print(f"| {corpus}, {text_mb:.2f} MB | {name} | {peer} | {text_mb / peer_s:.1f} | {text_mb / mine_s:.1f} "
                  f"| {peer_s / mine_s:.2f}x |")


if __name__ == "__main__":
    main()
