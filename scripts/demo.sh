#!/usr/bin/env bash
# The demo: preprocesses a bundled corpus (GSM8K's 1,319 test problems in Alpaca format,
# tests/data/corpora, MIT) with the GPT-2 tokenizer into Megatron's .bin/.idx, then trains a
# small GPT on it with Megatron's flags; the training and validation losses fall.
# Extra arguments go to `tessera train`.
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=build/src/tessera/cli/tessera
out=build/demo
mkdir -p "$out"
gpt2=(--tokenizer-type GPT2BPETokenizer --vocab-file tests/data/gpt2/vocab.json --merge-file tests/data/gpt2/merges.txt)
$tessera preprocess --input tests/data/corpora/alpaca_gsm8k_test.json --text-template $'{instruction}\n{output}' \
  --output-prefix "$out/gsm8k" --append-eod --workers 2 "${gpt2[@]}"
$tessera train "${gpt2[@]}" --data-path "$out/gsm8k_text_document" --split 949,50,1 \
  --data-cache-path "$out/cache" \
  --num-layers 4 --hidden-size 128 --num-attention-heads 4 \
  --seq-length 128 --max-position-embeddings 128 \
  --micro-batch-size 8 --global-batch-size 16 \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.1 \
  --train-iters 200 --log-interval 20 --eval-interval 50 --eval-iters 10 \
  --transformer-impl local "$@"
