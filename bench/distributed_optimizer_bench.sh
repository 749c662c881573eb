#!/usr/bin/env bash
# Step time of data parallelism with and without the distributed optimizer and its overlaps,
# at DP=2 and DP=4 under `tessera launch` on this machine, run alternately (round after
# round) so every configuration sees the same load. Model: 4 layers, 256 wide, 8 heads,
# seq 128, vocabulary 8192 (5.3 M parameters), micro-batch 2, global batch 8, fp32, mock
# data; buckets of 10^6 elements where overlap is on (Megatron's 4x10^7 default would make
# one bucket of this model). Per run, the median of the log's elapsed ms per iteration over
# iterations 3..ITERS; printed: each configuration's median over the rounds.
#
# How much communication the overlaps hide: the log's dp_comm_ms_per_iteration is the time
# the step waited for its data-parallel reductions and gathers (DataParallelBuckets::
# exposed_seconds). Without overlap that is all of their time; with it, only what compute did
# not cover. Hidden = 1 - exposed(overlapped) / exposed(not overlapped), per DP size and
# optimizer (the last rank's log; DP ranks are symmetric).
#
#   bench/distributed_optimizer_bench.sh TESSERA_BINARY [ROUNDS=3] [ITERS=8]
set -euo pipefail
tessera=$1 rounds=${2:-3} iters=${3:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--mock-data --tokenizer-type NullTokenizer --vocab-size 8000 --num-layers 4 --hidden-size 256
       --num-attention-heads 8 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 2
       --global-batch-size 8 --train-iters "$iters" --log-interval 1 --eval-iters 0 --lr 1e-4)
declare -A configs=(
  [plain]=""
  [plain+overlap-grad]="--overlap-grad-reduce --ddp-bucket-size 1000000"
  [distopt]="--use-distributed-optimizer"
  [distopt+overlaps]="--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 1000000 --overlap-param-gather"
)
order=(plain plain+overlap-grad distopt distopt+overlaps)
for dp in 2 4; do
  for round in $(seq "$rounds"); do
    for name in "${order[@]}"; do
      log="$work/dp${dp}_${name}_${round}.jsonl"
      # shellcheck disable=SC2086
      "$tessera" launch --standalone --nproc_per_node "$dp" train "${model[@]}" ${configs[$name]} \
        --log-json "$log" > "$work/out.txt" 2>&1 || { tail -20 "$work/out.txt"; exit 1; }
    done
  done
  /usr/bin/python3 - "$dp" "$work" "${order[@]}" <<'PY'
import glob, json, statistics, sys
dp, work, order = sys.argv[1], sys.argv[2], sys.argv[3:]
step, comm = {}, {}
for name in order:
    runs, waited = [], []
    for f in sorted(glob.glob("%s/dp%s_%s_*.jsonl" % (work, dp, name))):
        records = [json.loads(l) for l in open(f)][2:]
        runs.append(statistics.median(r["elapsed_ms_per_iteration"] for r in records))
        waited.append(statistics.median(r["dp_comm_ms_per_iteration"] for r in records))
    step[name], comm[name] = statistics.median(runs), statistics.median(waited)
    print("DP=%s %-20s %8.1f ms/step (runs: %s)  waited for communication %7.1f ms/step (runs: %s)" % (
        dp, name, step[name], ", ".join("%.1f" % r for r in runs), comm[name], ", ".join("%.1f" % c for c in waited)))
for plain, overlapped in [("plain", "plain+overlap-grad"), ("distopt", "distopt+overlaps")]:
    print("DP=%s %-20s hides %5.1f %% of the communication (%.1f of %.1f ms/step), step %+.1f ms" % (
        dp, overlapped, 100 * (1 - comm[overlapped] / comm[plain]), comm[plain] - comm[overlapped], comm[plain],
        step[overlapped] - step[plain]))
PY
done
