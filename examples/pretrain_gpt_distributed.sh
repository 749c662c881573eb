#!/usr/bin/env bash
# The two-server guide's Megatron-LM launch script (its steps 6, 8 and 10) for tessera, with
# only the program names changed: torchrun -> `tessera launch`, pretrain_gpt.py -> `tessera
# train`. Same variables, same flag blocks, same values.
#
# One node, 8 processes (step 6):
#   examples/pretrain_gpt_distributed.sh
# Two nodes x 8 processes (steps 8 and 10: global batch 64, TP 2 x PP 2 x DP 4). Start node 0
# first (it waits for node 1), then node 1; MASTER_ADDR is node 0's address on both:
#   node0$ NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 GLOO_SOCKET_IFNAME=eth0 examples/pretrain_gpt_distributed.sh
#   node1$ NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 GLOO_SOCKET_IFNAME=eth0 examples/pretrain_gpt_distributed.sh
# GLOO_SOCKET_IFNAME is optional: without it tessera takes the interface of the route to
# MASTER_ADDR (docs/distributed.md). The guide's HCCL_IF_IP has no use here.
#
# Data (the guide's steps 3-5): the GPT-2 files as gpt-tokenizer/gpt2-vocab.json and
# gpt2-merges.txt (tessera's copies: tests/data/gpt2/vocab.json and merges.txt), then the
# guide's alpaca_json.json, one {"text": ...} object per line:
#   tessera preprocess --input ./alpaca_json.json --output-prefix ./gpt_pretrain_data/alpaca \
#     --tokenizer-type GPT2BPETokenizer --vocab-file ./gpt-tokenizer/gpt2-vocab.json \
#     --merge-file ./gpt-tokenizer/gpt2-merges.txt --append-eod --log-interval 1000 --workers 8
# Records in Alpaca's own shape (instruction/input/output and no "text", like the bundled
# tests/data/corpora/alpaca_gsm8k_test.json) need their text built: add
#     --text-template '{instruction}\n{input}\n{output}'
#
# Every variable below can be set from the environment; the guide's values are the defaults.
# TESSERA names the binary (default: `tessera` on PATH). PRECISION_ARGS is the guide's --fp16;
# set it to --bf16, or to nothing for fp32. Arguments to this script go to `tessera train`
# after the guide's flags (e.g. --dry-run to check flags, layout and memory without training).
# docs/megatron-flags.md gives the status in tessera of every flag used here.
set -euo pipefail

TESSERA=${TESSERA:-tessera}

export CUDA_DEVICE_MAX_CONNECTIONS=1  # kept from the guide; tessera does not read it

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))

CHECKPOINT_PATH=${CHECKPOINT_PATH:-./ckpt}
VOCAB_FILE=${VOCAB_FILE:-./gpt-tokenizer/gpt2-vocab.json}
MERGE_FILE=${MERGE_FILE:-./gpt-tokenizer/gpt2-merges.txt}
DATA_PATH=${DATA_PATH:-./gpt_pretrain_data/alpaca_text_document}

# Sizes (step 6). On two nodes the guide doubles the global batch (step 8) and splits the 16
# processes as TP 2 x PP 2 x DP 4 (step 10); one node keeps Megatron's defaults (TP 1, PP 1).
NUM_LAYERS=${NUM_LAYERS:-24}
HIDDEN_SIZE=${HIDDEN_SIZE:-1024}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-16}
SEQ_LENGTH=${SEQ_LENGTH:-1024}
MAX_POSITION_EMBEDDINGS=${MAX_POSITION_EMBEDDINGS:-1024}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-4}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-$((32*$NNODES))}
LR=${LR:-0.00015}
TRAIN_ITERS=${TRAIN_ITERS:-500000}
LR_DECAY_ITERS=${LR_DECAY_ITERS:-320000}
MIN_LR=${MIN_LR:-1.0e-5}
PRECISION_ARGS=${PRECISION_ARGS---fp16}
if [ "$NNODES" -gt 1 ]; then
  TENSOR_MODEL_PARALLEL_SIZE=${TENSOR_MODEL_PARALLEL_SIZE:-2}
  PIPELINE_MODEL_PARALLEL_SIZE=${PIPELINE_MODEL_PARALLEL_SIZE:-2}
else
  TENSOR_MODEL_PARALLEL_SIZE=${TENSOR_MODEL_PARALLEL_SIZE:-1}
  PIPELINE_MODEL_PARALLEL_SIZE=${PIPELINE_MODEL_PARALLEL_SIZE:-1}
fi
LOG_INTERVAL=${LOG_INTERVAL:-1}
SAVE_INTERVAL=${SAVE_INTERVAL:-10000}
EVAL_INTERVAL=${EVAL_INTERVAL:-1000}
EVAL_ITERS=${EVAL_ITERS:-10}

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK \
  --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

GPT_ARGS="--num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE --num-attention-heads $NUM_ATTENTION_HEADS \
  --seq-length $SEQ_LENGTH --max-position-embeddings $MAX_POSITION_EMBEDDINGS \
  --micro-batch-size $MICRO_BATCH_SIZE --global-batch-size $GLOBAL_BATCH_SIZE --lr $LR \
  --train-iters $TRAIN_ITERS --lr-decay-iters $LR_DECAY_ITERS --lr-decay-style cosine --min-lr $MIN_LR \
  --weight-decay 1e-2 --lr-warmup-fraction .01 --clip-grad 1.0 $PRECISION_ARGS \
  --transformer-impl local --no-masked-softmax-fusion \
  --tensor-model-parallel-size $TENSOR_MODEL_PARALLEL_SIZE --pipeline-model-parallel-size $PIPELINE_MODEL_PARALLEL_SIZE"

DATA_ARGS="--data-path $DATA_PATH --vocab-file $VOCAB_FILE --merge-file $MERGE_FILE --split 949,50,1"

OUTPUT_ARGS="--log-interval $LOG_INTERVAL --save-interval $SAVE_INTERVAL --eval-interval $EVAL_INTERVAL \
  --eval-iters $EVAL_ITERS"

# The guide's pre-flight habit: say on every node what this node was given.
echo "node $NODE_RANK of $NNODES: $GPUS_PER_NODE processes, world size $WORLD_SIZE," \
  "master $MASTER_ADDR:$MASTER_PORT, GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-<route to master>}"

# --distributed-backend nccl stays, as in the guide: it means the device's collective library
# (Gloo on the CPU). --ckpt-format torch writes Megatron-LM's own checkpoint files, which
# Megatron loads (with --no-load-rng: see docs/checkpoints.md) and tessera resumes.
"$TESSERA" launch $DISTRIBUTED_ARGS "$TESSERA" train $GPT_ARGS $DATA_ARGS $OUTPUT_ARGS \
  --distributed-backend nccl --save "$CHECKPOINT_PATH" --ckpt-format torch "$@"
