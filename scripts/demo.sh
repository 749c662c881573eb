#!/usr/bin/env bash
# The demo: trains a small GPT on Megatron-style mock data and shows the loss falling.
set -euo pipefail
cd "$(dirname "$0")/.."
./build/src/tessera/cli/tessera train \
  --num-layers 4 --hidden-size 128 --num-attention-heads 4 \
  --seq-length 64 --max-position-embeddings 64 \
  --micro-batch-size 8 --global-batch-size 16 \
  --tokenizer-type NullTokenizer --vocab-size 512 --mock-data \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 10 \
  --train-iters 200 --log-interval 20 --hidden-dropout 0.0 --attention-dropout 0.0 \
  --transformer-impl local "$@"
