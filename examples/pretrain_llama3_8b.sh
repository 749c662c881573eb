#!/usr/bin/env bash
# A Llama-3-8B-shaped pre-training run with Megatron-LM's flags: 32 layers, hidden 4096, 32
# query heads in 8 key/value groups (head dim 128), SwiGLU with ffn 14336, RoPE base 500000,
# RMSNorm (eps 1e-5), untied output layer, no biases, the 128,256-token Llama-3 tokenizer
# (HuggingFaceTokenizer on its tokenizer.json), bf16, sequences of 8192.
#
# One node, 8 processes as TP 2 x PP 2 x DP 2:
#   TOKENIZER_MODEL=./Meta-Llama-3-8B DATA_PATH=./llama3_data/web_text_document examples/pretrain_llama3_8b.sh
# Several nodes as in examples/pretrain_gpt_distributed.sh (NNODES, NODE_RANK, MASTER_ADDR).
# To continue from Hugging Face weights (config.json + model.safetensors, whole or sharded),
# add --init-from-hf DIR: the flags below must match its config.json (tessera names any field
# that differs).
#
# Data: tokenize with the same tokenizer, one {"text": ...} object per line:
#   tessera preprocess --input web_text.jsonl --output-prefix ./llama3_data/web_text \
#     --tokenizer-type HuggingFaceTokenizer --tokenizer-model ./Meta-Llama-3-8B --append-eod --workers 8
#
# Every variable below can be set from the environment (the tests run this script tiny: a few
# layers of width 64, --mock-data and a NullTokenizer). TESSERA names the binary (default:
# `tessera` on PATH). Arguments to this script go to `tessera train` after the script's flags
# (e.g. --dry-run to check flags, layout and memory without training).
set -euo pipefail

TESSERA=${TESSERA:-tessera}

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}

CHECKPOINT_PATH=${CHECKPOINT_PATH:-./ckpt-llama3-8b}
TOKENIZER_MODEL=${TOKENIZER_MODEL:-./Meta-Llama-3-8B}
DATA_PATH=${DATA_PATH:-./llama3_data/web_text_document}
TOKENIZER_ARGS=${TOKENIZER_ARGS:-"--tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOKENIZER_MODEL"}
DATA_ARGS=${DATA_ARGS:-"--data-path $DATA_PATH --split 99990,8,2"}

# Llama-3-8B's shape (its config.json: num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, intermediate_size, rope_theta, rms_norm_eps, max_position_embeddings).
NUM_LAYERS=${NUM_LAYERS:-32}
HIDDEN_SIZE=${HIDDEN_SIZE:-4096}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-32}
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-14336}
ROTARY_BASE=${ROTARY_BASE:-500000}
NORM_EPSILON=${NORM_EPSILON:-1e-5}
SEQ_LENGTH=${SEQ_LENGTH:-8192}
MAX_POSITION_EMBEDDINGS=${MAX_POSITION_EMBEDDINGS:-8192}

# The optimizer of the Llama 2 paper's 7B run (Meta published no recipe for Llama-3-8B):
# AdamW (0.9, 0.95), peak LR 3e-4 after 2000 warm-up steps, cosine decay to a tenth, weight
# decay 0.1, clipping at 1.0, batches of 4M tokens (512 sequences of 8192).
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-512}
LR=${LR:-3e-4}
MIN_LR=${MIN_LR:-3e-5}
LR_WARMUP_ITERS=${LR_WARMUP_ITERS:-2000}
TRAIN_ITERS=${TRAIN_ITERS:-250000}
LR_DECAY_ITERS=${LR_DECAY_ITERS:-$TRAIN_ITERS}
PRECISION_ARGS=${PRECISION_ARGS---bf16}
TENSOR_MODEL_PARALLEL_SIZE=${TENSOR_MODEL_PARALLEL_SIZE:-2}
PIPELINE_MODEL_PARALLEL_SIZE=${PIPELINE_MODEL_PARALLEL_SIZE:-2}
RECOMPUTE_ARGS=${RECOMPUTE_ARGS---recompute-activations}
LOG_INTERVAL=${LOG_INTERVAL:-1}
SAVE_INTERVAL=${SAVE_INTERVAL:-1000}
EVAL_INTERVAL=${EVAL_INTERVAL:-1000}
EVAL_ITERS=${EVAL_ITERS:-10}

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK \
  --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

MODEL_ARGS="--num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE --num-attention-heads $NUM_ATTENTION_HEADS \
  --group-query-attention --num-query-groups $NUM_QUERY_GROUPS --ffn-hidden-size $FFN_HIDDEN_SIZE \
  --seq-length $SEQ_LENGTH --max-position-embeddings $MAX_POSITION_EMBEDDINGS \
  --position-embedding-type rope --rotary-base $ROTARY_BASE --normalization RMSNorm --norm-epsilon $NORM_EPSILON \
  --swiglu --untie-embeddings-and-output-weights --disable-bias-linear \
  --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.02 --transformer-impl local"

TRAINING_ARGS="--micro-batch-size $MICRO_BATCH_SIZE --global-batch-size $GLOBAL_BATCH_SIZE \
  --lr $LR --min-lr $MIN_LR --lr-decay-style cosine --lr-warmup-iters $LR_WARMUP_ITERS \
  --train-iters $TRAIN_ITERS --lr-decay-iters $LR_DECAY_ITERS \
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 $PRECISION_ARGS $RECOMPUTE_ARGS \
  --tensor-model-parallel-size $TENSOR_MODEL_PARALLEL_SIZE --pipeline-model-parallel-size $PIPELINE_MODEL_PARALLEL_SIZE"

OUTPUT_ARGS="--log-interval $LOG_INTERVAL --save-interval $SAVE_INTERVAL --eval-interval $EVAL_INTERVAL \
  --eval-iters $EVAL_ITERS --save $CHECKPOINT_PATH"

"$TESSERA" launch $DISTRIBUTED_ARGS "$TESSERA" train $MODEL_ARGS $TRAINING_ARGS $TOKENIZER_ARGS $DATA_ARGS \
  $OUTPUT_ARGS "$@"
