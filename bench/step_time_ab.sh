#!/usr/bin/env bash
# Step time of two tessera binaries, run alternately in one go so both see the same
# machine: GPT-2 124M (12 layers, 768 wide, 12 heads, GPT-2's vocabulary), micro-batch 4,
# seq 64, fp32, mock data. Each run logs every iteration; the first (warm-up) is dropped.
# Prints each run's mean step time and, at the end, the median of each binary and the ratio
# after / before.
#
#   bench/step_time_ab.sh BEFORE_BINARY AFTER_BINARY [ROUNDS=3] [ITERS=6]
set -euo pipefail
before=$1 after=$2 rounds=${3:-3} iters=${4:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(train --mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --num-layers 12 --hidden-size 768
       --num-attention-heads 12 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
       --global-batch-size 4 --train-iters "$iters" --log-interval 1 --eval-iters 0 --lr 1e-4)

# Mean ms/iteration of iterations 2..ITERS of one run.
step_ms() {
  (cd "$work" && "$1" "${flags[@]}" 2>&1) |
    sed -n 's/.*iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1 \2/p' |
    awk '$1 > 1 { s += $2; n++ } END { if (n == 0) exit 1; printf "%.1f\n", s / n }'
}

declare -a times_before times_after
for ((r = 1; r <= rounds; ++r)); do
  b=$(step_ms "$before"); a=$(step_ms "$after")
  times_before+=("$b"); times_after+=("$a")
  echo "round $r: before $b ms, after $a ms"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mb=$(median "${times_before[@]}") ma=$(median "${times_after[@]}")
echo "median: before $mb ms/step, after $ma ms/step, after/before $(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", a / b }')"
