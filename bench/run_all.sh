#!/usr/bin/env bash
# Runs every benchmark side by side in one go and prints the figures
# (docs/benchmarks.md records them). Needs a build in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
b=build/bench
echo "== GEMM (oneDNN fp32) =="
$b/gemm_bench
for shape in gpt2-124m small; do
  echo "== training step: $shape =="
  $b/train_step_bench $shape 5
  /usr/bin/python3 bench/torch_train_step.py $shape 5
done
