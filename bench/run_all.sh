#!/usr/bin/env bash
# Runs the training benchmarks side by side in one go and prints the figures
# (docs/benchmarks.md records them): oneDNN's fp32 GEMM peak and the step's GEMM shapes,
# the linear layers on F32, BF16 and FP16 tensors at GPT-2 small's shapes,
# then tessera's and PyTorch's training step for GPT-2 124M (micro-batch 4, seq 64) and a
# small model, same thread count, the machine's environment unchanged.
# Needs a build in build/. PyTorch on this machine is slow: its 124M step takes about a
# minute, so it runs one timed step after one warm-up.
set -euo pipefail
cd "$(dirname "$0")/.."
b=build/bench
echo "== GEMM (oneDNN fp32) =="
$b/gemm_bench 5
echo "== linear on F32 / BF16 / FP16 tensors =="
$b/linear_precision_bench 5
for shape in gpt2-124m small; do
  echo "== training step: $shape =="
  $b/train_step_bench $shape 5 2>/dev/null | grep '^tessera'
  /usr/bin/python3 bench/torch_train_step.py $shape "$([ $shape = small ] && echo 3 || echo 1)"
done
