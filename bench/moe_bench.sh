#!/usr/bin/env bash
# The model FLOP/s of an MoE training step against the dense model with the same active
# parameters, on this machine, one process, run alternately (round after round) so both see
# the same load. Dense: 4 layers, 256 wide, 8 heads, seq 128, vocabulary 8000, SwiGLU MLP of
# 1024; MoE: the same with 8 SwiGLU experts of 512, top-2 (1024 active), aux loss 0.01. Both
# have the same FLOPs per iteration by Megatron's num_floating_point_operations (the log's
# TFLOP/s), so the ratio of their model FLOP/s is the inverse ratio of their step times. Per
# run, the median of the log's ms per iteration over iterations 3..ITERS; printed: each
# model's median over the rounds, its TFLOP/s, and MoE / dense (the issue asks >= 0.8).
#
#   bench/moe_bench.sh TESSERA_BINARY [ROUNDS=3] [ITERS=10] [extra train flags, e.g. --bf16]
set -euo pipefail
tessera=$1 rounds=${2:-3} iters=${3:-10}
shift $(( $# < 3 ? $# : 3 ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--mock-data --tokenizer-type NullTokenizer --vocab-size 8000 --num-layers 4 --hidden-size 256
       --num-attention-heads 8 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4
       --global-batch-size 4 --train-iters "$iters" --log-interval 1 --eval-iters 0 --lr 1e-4 --swiglu
       --disable-bias-linear --position-embedding-type rope --normalization RMSNorm --log-throughput
       --peak-tflops-per-device 1 "$@")
declare -A configs=(
  [dense]="--ffn-hidden-size 1024"
  [moe]="--ffn-hidden-size 512 --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.01"
)
for round in $(seq "$rounds"); do
  for name in dense moe; do
    # shellcheck disable=SC2086
    "$tessera" train "${model[@]}" ${configs[$name]} --log-json "$work/${name}_${round}.jsonl" > "$work/out.txt" 2>&1 ||
      { tail -20 "$work/out.txt"; exit 1; }
    grep -o "throughput per GPU (TFLOP/s/GPU): [0-9.]*" "$work/out.txt" | tail -1 | sed "s/^/$name round $round: /"
  done
done
/usr/bin/python3 - "$work" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" "$(nproc --all)" \
  "${OMP_NUM_THREADS:-all}" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import glob, json, statistics, sys
work, cpu, cores, threads, load = sys.argv[1], sys.argv[2].strip(), sys.argv[3], sys.argv[4], sys.argv[5]
ms = {}
for name in ("dense", "moe"):
    runs = [statistics.median(r["elapsed_ms_per_iteration"] for r in [json.loads(l) for l in open(f)][2:])
            for f in sorted(glob.glob("%s/%s_*.jsonl" % (work, name)))]
    ms[name] = statistics.median(runs)
    print("%-5s %8.1f ms/step (runs: %s)" % (name, ms[name], ", ".join("%.1f" % r for r in runs)))
print("MoE model FLOP/s / dense model FLOP/s (same Megatron FLOPs per step): %.2f  [%s, %s cores, "
      "OMP_NUM_THREADS %s, load average %s at the end]" % (ms["dense"] / ms["moe"], cpu, cores, threads, load))
PY
