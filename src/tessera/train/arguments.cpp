#include "tessera/train/arguments.h"

#include <algorithm>
#include <filesystem>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/device/registry.h"
#include "tessera/train/megatron_flags.h"

namespace tessera {
namespace {

using K = OptKind;
constexpr OptUse kSpeed = OptUse::SpeedOnly;

// The table: Megatron's flags (names, defaults, choices as in core_r0.10.0's arguments.py)
// that tessera implements or accepts, then tessera's own.
std::vector<OptionDef> train_option_defs() {
  return {
      // Model shape.
      {"--num-layers", K::Int, nullptr, "Number of transformer layers"},
      {"--hidden-size", K::Int, nullptr, "Transformer hidden size"},
      {"--num-attention-heads", K::Int, nullptr, "Number of attention heads"},
      {"--kv-channels", K::Int, nullptr, "Head dimension; default hidden-size / num-attention-heads"},
      {"--ffn-hidden-size", K::Int, nullptr, "MLP hidden size; default 4 * hidden-size"},
      {"--seq-length", K::Int, nullptr, "Sequence length to train on"},
      {"--max-position-embeddings", K::Int, nullptr, "Rows of the position embedding"},
      {"--make-vocab-size-divisible-by", K::Int, "128", "Pad the vocabulary to a multiple of this (times TP)"},
      {"--normalization", K::Choice, "LayerNorm", "Normalisation layer", "LayerNorm|RMSNorm"},
      {"--norm-epsilon", K::Float, "1e-05", "LayerNorm / RMSNorm epsilon"},
      {"--position-embedding-type", K::Choice, "learned_absolute", "Position embedding",
       "learned_absolute|rope|none"},
      {"--use-rotary-position-embeddings", K::StoreTrue, nullptr,
       "Deprecated spelling of --position-embedding-type rope"},
      {"--no-position-embedding", K::StoreFalse, nullptr,
       "Deprecated: no learned absolute position embedding (--position-embedding-type none)"},
      {"--rotary-base", K::Int, "10000", "RoPE base period"},
      {"--rotary-percent", K::Float, "1.0", "Fraction of each head's channels that RoPE rotates"},
      {"--use-rope-scaling", K::StoreTrue, nullptr,
       "Llama 3.1's RoPE frequency scaling: --rope-scaling-factor, frequency factors 1 and 4, original context 8192"},
      {"--rope-scaling-factor", K::Float, "8.0",
       "Factor of --use-rope-scaling (later Megatron's flag): Llama 3.1 8, Llama 3.2 32"},
      {"--no-rope-fusion", K::StoreFalse, nullptr, "Unfused RoPE", nullptr, kSpeed},
      {"--swiglu", K::StoreTrue, nullptr, "SwiGLU MLP: fc1 gives gate and up, silu(gate) * up feeds fc2"},
      {"--group-query-attention", K::StoreTrue, nullptr, "Grouped-query attention (--num-query-groups)"},
      {"--num-query-groups", K::Int, "1", "Key/value heads with --group-query-attention"},
      {"--add-qkv-bias", K::StoreTrue, nullptr, "A bias in linear_qkv even with --disable-bias-linear"},
      {"--init-method-std", K::Float, "0.02", "Standard deviation of the normal initialisation"},
      {"--hidden-dropout", K::Float, "0.1", "Dropout after the embedding, attention and MLP"},
      {"--attention-dropout", K::Float, "0.1", "Dropout on the attention probabilities"},
      {"--openai-gelu", K::StoreTrue, nullptr, "Use OpenAI's tanh GELU (same as the fused bias-GELU)"},
      {"--no-bias-gelu-fusion", K::StoreFalse, nullptr, "Unfused GELU: exact erf instead of the tanh approximation"},
      {"--untie-embeddings-and-output-weights", K::StoreTrue, nullptr, "Separate output layer weights"},
      {"--disable-bias-linear", K::StoreFalse, nullptr, "No biases in the linear layers"},
      {"--seed", K::Int, "1234", "Seed of initialisation, dropout and data"},
      // Tokenizer and data.
      {"--tokenizer-type", K::Choice, nullptr, "Tokenizer (pretrain_gpt's default: GPT2BPETokenizer)",
       "GPT2BPETokenizer|HuggingFaceTokenizer|Llama2Tokenizer|GPTSentencePieceTokenizer|NullTokenizer",
       OptUse::Implemented, nullptr,
       "BertWordPieceLowerCase|BertWordPieceCase|SentencePieceTokenizer|TikTokenizer|MultimodalTokenizer"},
      {"--tokenizer-model", K::String, nullptr,
       "HuggingFaceTokenizer: the folder of tokenizer.json; Llama2Tokenizer, GPTSentencePieceTokenizer: the .model file"},
      {"--vocab-size", K::Int, nullptr, "Vocabulary size of the NullTokenizer (EOD = this value)"},
      {"--vocab-file", K::String, nullptr, "GPT-2 vocab.json"},
      {"--merge-file", K::String, nullptr, "GPT-2 merges.txt"},
      {"--mock-data", K::StoreTrue, nullptr, "Train on Megatron's synthetic documents instead of --data-path"},
      {"--data-path", K::List, nullptr, "Dataset prefix, or weight prefix pairs for a blend"},
      {"--data-args-path", K::String, nullptr, "File holding the --data-path list"},
      {"--split", K::String, nullptr, "Train/valid/test proportions, e.g. 969,30,1 (the default with --data-path)"},
      {"--train-data-path", K::List, nullptr, "Training split's prefixes (with optional weights)"},
      {"--valid-data-path", K::List, nullptr, "Validation split's prefixes (with optional weights)"},
      {"--test-data-path", K::List, nullptr, "Test split's prefixes (with optional weights)"},
      {"--per-split-data-args-path", K::String, nullptr, "JSON file with the train/valid/test path lists"},
      {"--renormalize-blend-weights", K::StoreTrue, nullptr, "Re-derive blend weights from the dataset sizes"},
      {"--data-cache-path", K::String, nullptr, "Folder of the index caches (default <prefix>/cache/GPTDataset_indices)"},
      {"--reset-position-ids", K::StoreTrue, nullptr, "Restart position ids after each end-of-document token"},
      {"--reset-attention-mask", K::StoreTrue, nullptr, "Block-diagonal attention per document (not supported yet)"},
      {"--eod-mask-loss", K::StoreTrue, nullptr, "No loss for predictions made from an end-of-document token"},
      // Batch and iterations.
      {"--micro-batch-size", K::Int, nullptr, "Samples per micro-batch per data-parallel rank"},
      {"--global-batch-size", K::Int, nullptr, "Samples per iteration; default micro-batch * data-parallel size"},
      {"--train-iters", K::Int, nullptr, "Iterations to train"},
      {"--train-samples", K::Int, nullptr, "Samples to train (sample-based training)"},
      {"--rampup-batch-size", K::List, nullptr,
       "START INCREMENT SAMPLES: grow the global batch from START by INCREMENT over SAMPLES samples"},
      {"--log-interval", K::Int, "100", "Iterations between log lines"},
      {"--log-throughput", K::StoreTrue, nullptr, "Add TFLOP/s per device (and MFU) to the log line"},
      {"--peak-tflops-per-device", K::Float, nullptr,
       "Dense peak TFLOP/s per device for MFU (tessera; default from a table of known devices)"},
      {"--eval-interval", K::Int, "1000", "Iterations between evaluations on the validation split"},
      {"--tensorboard-dir", K::String, nullptr, "Write TensorBoard event files (Megatron's tags) into this folder"},
      {"--tensorboard-log-interval", K::Int, "1", "Iterations between TensorBoard scalars"},
      {"--no-log-loss-scale-to-tensorboard", K::StoreFalse, nullptr, "Leave the loss scale out of TensorBoard"},
      {"--log-validation-ppl-to-tensorboard", K::StoreTrue, nullptr, "Also log validation perplexity"},
      {"--log-memory-to-tensorboard", K::StoreTrue, nullptr, "Also log memory use"},
      // Activation recomputation.
      {"--recompute-activations", K::StoreTrue, nullptr, "Selective recomputation (the attention core)"},
      {"--recompute-granularity", K::Choice, nullptr, "What to recompute in backward", "full|selective"},
      {"--recompute-method", K::Choice, nullptr, "With full: groups of layers (uniform) or the first layers (block)",
       "uniform|block"},
      {"--recompute-num-layers", K::Int, nullptr, "Layers per recomputed group (uniform) or recomputed layers (block)"},
      // Mixed precision (docs/precision.md).
      {"--fp16", K::StoreTrue, nullptr, "fp16 GEMMs (emulated by rounding on CPU) with a loss scaler; fp32 master weights"},
      {"--bf16", K::StoreTrue, nullptr, "bf16 GEMMs (oneDNN AVX512-BF16 on CPU); fp32 master weights, no scaler"},
      {"--loss-scale", K::Float, nullptr, "Static loss scale (default: dynamic with --fp16)"},
      {"--initial-loss-scale", K::Float, "4294967296", "Initial dynamic loss scale (2**32)"},
      {"--min-loss-scale", K::Float, "1.0", "Minimum dynamic loss scale"},
      {"--loss-scale-window", K::Int, "1000", "Clean iterations before the dynamic scale doubles"},
      {"--hysteresis", K::Int, "2", "Overflows tolerated before the dynamic scale halves"},
      {"--eval-iters", K::Int, "100", "Global batches per evaluation (0 disables evaluation)"},
      // Optimizer and schedule.
      {"--optimizer", K::Choice, "adam", "Optimizer", "adam|sgd"},
      {"--lr", K::Float, nullptr, "Peak learning rate"},
      {"--min-lr", K::Float, "0.0", "Minimum learning rate"},
      {"--lr-decay-style", K::Choice, "linear", "Learning-rate decay", "constant|linear|cosine|inverse-square-root|WSD"},
      {"--lr-decay-iters", K::Int, nullptr, "Iterations to decay over; default --train-iters"},
      {"--lr-decay-samples", K::Int, nullptr, "Samples to decay over; default --train-samples"},
      {"--lr-wsd-decay-style", K::Choice, "exponential", "Anneal of WSD", "exponential|linear|cosine"},
      {"--lr-wsd-decay-iters", K::Int, nullptr, "Iterations of WSD's anneal"},
      {"--lr-wsd-decay-samples", K::Int, nullptr, "Samples of WSD's anneal"},
      {"--lr-warmup-fraction", K::Float, nullptr, "Warm-up as a fraction of the decay span"},
      {"--lr-warmup-iters", K::Int, "0", "Warm-up iterations"},
      {"--lr-warmup-samples", K::Int, "0", "Warm-up samples"},
      {"--lr-warmup-init", K::Float, "0.0", "Learning rate at the start of warm-up"},
      {"--weight-decay", K::Float, "0.01", "Weight decay (not applied to biases and 1-D parameters)"},
      {"--start-weight-decay", K::Float, nullptr, "Initial weight decay for linear/cosine increments"},
      {"--end-weight-decay", K::Float, nullptr, "Final weight decay for linear/cosine increments"},
      {"--weight-decay-incr-style", K::Choice, "constant", "Weight-decay schedule", "constant|linear|cosine"},
      {"--clip-grad", K::Float, "1.0", "Clip gradients to this global L2 norm (0 disables)"},
      {"--adam-beta1", K::Float, "0.9", "Adam beta1"},
      {"--adam-beta2", K::Float, "0.999", "Adam beta2"},
      {"--adam-eps", K::Float, "1e-08", "Adam epsilon"},
      {"--sgd-momentum", K::Float, "0.9", "SGD momentum"},
      // Parallelism and runtime.
      {"--tensor-model-parallel-size", K::Int, "1", "Tensor-parallel size"},
      {"--pipeline-model-parallel-size", K::Int, "1", "Pipeline-parallel size"},
      {"--context-parallel-size", K::Int, "1",
       "Context-parallel size: each sequence split over this many ranks, attention by a ring"},
      {"--cp-comm-type", K::List, "p2p", "Context-parallel communication, one value or one per layer (p2p: the ring)"},
      {"--sequence-parallel", K::StoreTrue, nullptr,
       "Split LayerNorm/dropout activations along the sequence over the tensor-parallel ranks"},
      {"--num-layers-per-virtual-pipeline-stage", K::Int, nullptr,
       "Layers per virtual stage: the interleaved 1F1B schedule"},
      {"--no-overlap-p2p-communication", K::StoreFalse, nullptr,
       "Megatron's unbatched p2p (tessera's p2p never overlaps); the interleaved schedule then needs "
       "--pipeline-model-parallel-size > 2, as in Megatron", nullptr, kSpeed},
      {"--decoder-first-pipeline-num-layers", K::Int, nullptr, "Layers on the first pipeline stage (uneven split)"},
      {"--decoder-last-pipeline-num-layers", K::Int, nullptr, "Layers on the last pipeline stage (uneven split)"},
      {"--distributed-backend", K::Choice, "nccl", "Collectives: nccl = the device's native library (Gloo on CPU)",
       "nccl|gloo"},
      {"--distributed-timeout-minutes", K::Int, "10", "Bound on connecting and on every collective"},
      {"--overlap-grad-reduce", K::StoreTrue, nullptr, "Reduce gradient buckets while backward runs"},
      {"--ddp-bucket-size", K::Int, nullptr, "Elements per gradient bucket (default max(4e7, 1e6 x DP) with overlap)"},
      {"--use-distributed-optimizer", K::StoreTrue, nullptr,
       "Shard Adam's state and the fp32 main parameters over the data-parallel ranks (ZeRO-1)"},
      {"--overlap-param-gather", K::StoreTrue, nullptr,
       "Gather the updated parameters while the next forward runs (distributed optimizer)"},
      {"--local-rank", K::Int, nullptr, "Set by torch.distributed.launch; tessera reads LOCAL_RANK itself"},
      // tessera computes the local spec; the flag picks the layout of Megatron-format saves
      // (megatron_layer_spec.h): Transformer Engine's only when given.
      {"--transformer-impl", K::Choice, "transformer_engine",
       "Layer spec of --ckpt-format torch/torch_dist saves: given, that spec's names and extra state "
       "(transformer_engine: Megatron's default); not given, local",
       "local|transformer_engine"},
      // Accepted: they only tune speed on other hardware.
      {"--use-mcore-models", K::StoreTrue, nullptr, "Megatron-core models (tessera's model is one)", nullptr, kSpeed},
      {"--no-masked-softmax-fusion", K::StoreFalse, nullptr, "Unfused masked softmax", nullptr, kSpeed},
      {"--use-flash-attn", K::StoreTrue, nullptr, "FlashAttention", nullptr, kSpeed},
      {"--no-persist-layer-norm", K::StoreTrue, nullptr, "Apex persistent LayerNorm off", nullptr, kSpeed},
      {"--no-bias-dropout-fusion", K::StoreFalse, nullptr, "Unfused bias-dropout-add", nullptr, kSpeed},
      {"--no-gradient-accumulation-fusion", K::StoreFalse, nullptr, "Unfused weight-gradient accumulation", nullptr,
       kSpeed},
      {"--use-cpu-initialization", K::StoreTrue, "None",
       "Initialise on the CPU (tessera's initialisation is layout-independent anyway)", nullptr, kSpeed},
      {"--attention-softmax-in-fp32", K::StoreTrue, nullptr, "Softmax in fp32 (always, in tessera)", nullptr, kSpeed},
      {"--accumulate-allreduce-grads-in-fp32", K::StoreTrue, nullptr, "fp32 gradient accumulation (always)", nullptr,
       kSpeed},
      {"--num-workers", K::Int, "2", "Data-loader worker processes", nullptr, kSpeed},
      {"--timing-log-level", K::Choice, "0", "Timer detail", "0|1|2", kSpeed},
      // Checkpoints.
      {"--save", K::String, nullptr, "Folder to save checkpoints to"},
      {"--save-interval", K::Int, nullptr, "Iterations between checkpoint saves (required with --save)"},
      {"--load", K::String, nullptr, "Folder to resume from (its latest checkpoint)"},
      {"--exit-interval", K::Int, nullptr, "Exit after the iteration divisible by this (saving first with --save)"},
      {"--exit-duration-in-mins", K::Float, nullptr,
       "Exit (saving first with --save) after this many minutes (tessera also takes fractions)"},
      {"--exit-signal-handler", K::StoreTrue, nullptr, "On SIGTERM/SIGINT, save (with --save) and exit 0"},
      {"--no-save-optim", K::StoreTrue, "None", "Do not save the optimizer state"},
      {"--no-save-rng", K::StoreTrue, "None",
       "Leave out rng_state (--ckpt-format torch and torch_dist; tessera's own RNG is counter-based and needs none)"},
      {"--no-load-optim", K::StoreTrue, "None", "Do not load the optimizer state"},
      {"--no-load-rng", K::StoreTrue, "None",
       "Do not load rng_state (torch_dist: the next save writes freshly seeded states instead of the loaded ones)"},
      {"--finetune", K::StoreTrue, nullptr, "Load only the model; start at iteration 0 with fresh optimizer and data"},
      {"--use-checkpoint-opt_param-scheduler", K::StoreTrue, nullptr, "Take the LR schedule from the checkpoint"},
      {"--override-opt_param-scheduler", K::StoreTrue, nullptr, "Take the LR schedule from the flags"},
      {"--ckpt-format", K::Choice, "torch_dist",
       "What --save writes: torch_dist (Megatron's distributed checkpoint), torch (Megatron's model_optim_rng.pt "
       "files) or tessera (tessera's own); zarr is not written",
       "torch|torch_dist|zarr|tessera"},
      {"--ckpt-convert-format", K::Choice, nullptr,
       "Convert --load's checkpoint: save it in this format into --ckpt-convert-save/<format> and exit without "
       "training (Megatron's converter run)",
       "torch|torch_dist|zarr|tessera"},
      {"--ckpt-convert-save", K::String, nullptr, "Where --ckpt-convert-format saves (DIR/<format>)"},
      {"--auto-detect-ckpt-format", K::StoreTrue, nullptr,
       "Accepted: --load always detects the checkpoint's format (tessera, torch or torch_dist)"},
      {"--use-dist-ckpt", K::StoreTrue, nullptr, "Megatron's deprecated alias of --ckpt-format torch_dist; no effect"},
      {"--use-checkpoint-args", K::StoreTrue, nullptr,
       "Take the model flags (--num-layers, --hidden-size, ...) from --load's checkpoint, as Megatron does"},
      // tessera's own.
      {"--no-check-for-nan-in-loss-and-grad", K::StoreFalse, nullptr,
       "Do not stop on a non-finite loss or gradient (tessera checks by default, effectively)"},
      {"--skip-spikes", K::Float, nullptr,
       "Skip an update whose loss or grad norm is more than Z standard deviations above the last 128 (llm.c)"},
      {"--dry-run", K::StoreTrue, nullptr, "Validate the flags and layout, print the memory estimate, and stop"},
      {"--init-from-hf", K::String, nullptr,
       "Initialise from a Hugging Face GPT-2, Llama, Qwen2, Mixtral or Qwen2-MoE folder (config.json, model.safetensors "
       "or its shards)"},
      {"--log-json", K::String, nullptr, "Append one JSON object per logged iteration to this file"},
      {"--device", K::String, "cpu",
       "Compute device: cpu, opencl[:N], cuda[:N] (the N-th device of a backend this build has; `tessera doctor` "
       "names them); strict is the test device that refuses host access"},
      {"--tf32", K::StoreTrue, nullptr,
       "Let f32 GEMMs round their operands to TF32 on CUDA tensor cores (PyTorch's "
       "torch.backends.cuda.matmul.allow_tf32); off: exact f32. No effect on cpu and opencl"},
      {"--enable-cuda-graph", K::StoreTrue, nullptr,
       "Capture a training step's device work once and replay it as a CUDA graph (later Megatron's flag; off by "
       "default; one rank, no MoE; docs/backends.md)"},
      {"--deterministic-mode", K::StoreTrue, nullptr,
       "Fixed-order, unfused kernels: the same bits in every parallel layout and run (docs/ops.md). Off: fused "
       "kernels, each op within its precision class's bound; still repeatable on one device and layout"},
  };
}

// Mixture of experts (Megatron's "moe" argument group; docs/models.md).
std::vector<OptionDef> moe_option_defs() {
  return {
      {"--num-experts", K::Int, nullptr, "Experts per MoE layer (none: a dense model)"},
      {"--moe-router-topk", K::Int, "2", "Experts each token is routed to"},
      {"--moe-router-pre-softmax", K::StoreTrue, nullptr,
       "Softmax over all experts before the top-k (default: softmax over the top-k logits)"},
      {"--moe-router-load-balancing-type", K::Choice, "aux_loss", "Load balancing: the switch aux loss, or none",
       "aux_loss|none", OptUse::Implemented, nullptr, "sinkhorn"},
      {"--moe-aux-loss-coeff", K::Float, "0.0", "Coefficient of the load-balancing aux loss (1e-2 is usual)"},
      {"--moe-z-loss-coeff", K::Float, nullptr, "Coefficient of the router z-loss (none: no z-loss)"},
      {"--moe-ffn-hidden-size", K::Int, nullptr, "Each expert's ffn hidden size; default --ffn-hidden-size"},
      {"--moe-layer-freq", K::String, "1",
       "MoE layers: every N-th layer from the first (N), or a 0/1 list per layer, e.g. [1,0,1,0]"},
      {"--moe-shared-expert-intermediate-size", K::Int, nullptr, "Ffn size of the shared experts (none: none)"},
      {"--moe-shared-expert-overlap", K::StoreTrue, nullptr, "Overlap the shared experts with the dispatch", nullptr,
       kSpeed},
      {"--moe-shared-expert-gate", K::StoreTrue, nullptr,
       "Qwen2-MoE's sigmoid gate on the shared experts' output (tessera; Megatron's SharedExpertMLP gate=True)"},
      {"--moe-expert-capacity-factor", K::Float, nullptr, "Expert capacity factor: tokens beyond it are dropped"},
      {"--moe-pad-expert-input-to-capacity", K::StoreTrue, nullptr, "Pad every expert's tokens to its capacity"},
      {"--moe-token-drop-policy", K::Choice, "probs", "Which tokens an expert over capacity drops", "probs|position"},
      {"--moe-token-dispatcher-type", K::Choice, "allgather", "How tokens reach the experts",
       "allgather|alltoall", OptUse::Implemented, nullptr, "alltoall_seq"},
      {"--moe-grouped-gemm", K::StoreTrue, nullptr,
       "Megatron's grouped-GEMM experts: --ckpt-format torch saves GroupedMLP's weight1/weight2 (tessera always "
       "groups the experts' GEMMs)"},
      {"--moe-per-layer-logging", K::StoreTrue, nullptr, "Also log each MoE layer's aux losses to TensorBoard"},
      {"--expert-model-parallel-size", K::Int, "1", "Expert-parallel size (carved from context x data parallelism)"},
      {"--expert-tensor-parallel-size", K::Int, nullptr, "Tensor-parallel size of the experts: TP (the default)"},
  };
}

int64_t positive(const ParsedOptions& p, const char* flag) {
  int64_t v = p.get_int(flag);
  if (v <= 0) throw usage_error(std::string(flag) + " must be > 0 (got " + std::to_string(v) + ")");
  return v;
}

float probability(const ParsedOptions& p, const char* flag) {
  double v = p.get_float(flag);
  if (!(v >= 0.0 && v < 1.0)) throw usage_error(std::string(flag) + " must be in [0, 1) (got " + std::to_string(v) + ")");
  return static_cast<float>(v);
}

// Normalisation, position embedding and attention groups (the Llama family's flags), with
// Megatron's rules for the deprecated spellings.
void parse_llama_options(const ParsedOptions& p, GPTConfig& m) {
  m.normalization = p.get_string("--normalization") == "RMSNorm" ? Normalization::RMSNorm : Normalization::LayerNorm;
  std::string position = p.get_string("--position-embedding-type");
  if (p.get_bool("--use-rotary-position-embeddings")) position = "rope";
  if (p.raw("--no-position-embedding").value_or("True") == "False" && position == "learned_absolute")
    position = "none";
  m.position_embedding = position == "rope"   ? PositionEmbedding::Rope
                         : position == "none" ? PositionEmbedding::None
                                              : PositionEmbedding::LearnedAbsolute;
  const int64_t base = positive(p, "--rotary-base");
  m.rotary_base = static_cast<float>(base);
  m.rotary_percent = static_cast<float>(p.get_float("--rotary-percent"));
  if (!(m.rotary_percent > 0 && m.rotary_percent <= 1))
    throw usage_error("--rotary-percent must be in (0, 1], got " + *p.raw("--rotary-percent"));
  if (m.position_embedding == PositionEmbedding::Rope && (m.rotary_dim() < 2 || m.rotary_dim() % 2 != 0))
    throw usage_error("--rotary-percent " + *p.raw("--rotary-percent") + " of --kv-channels " +
                          std::to_string(m.kv_channels) + " rotates " + std::to_string(m.rotary_dim()) +
                          " channels; RoPE needs an even number, at least 2",
                      "choose --rotary-percent so that kv-channels * percent is even");
  m.use_rope_scaling = p.get_bool("--use-rope-scaling");
  m.rope_scaling_factor = static_cast<float>(p.get_float("--rope-scaling-factor"));
  if (!(m.rope_scaling_factor >= 1.0f))
    throw usage_error("--rope-scaling-factor must be >= 1, got " + *p.raw("--rope-scaling-factor"),
                      "Llama 3.1 uses 8, Llama 3.2 32");
  if (p.given("--rope-scaling-factor") && !m.use_rope_scaling)
    log_warn("--rope-scaling-factor has no effect without --use-rope-scaling");
  m.num_query_groups = m.num_attention_heads;
  if (p.get_bool("--group-query-attention")) {
    m.num_query_groups = static_cast<int>(positive(p, "--num-query-groups"));
    if (m.num_attention_heads % m.num_query_groups != 0)
      throw usage_error("--num-attention-heads " + std::to_string(m.num_attention_heads) +
                            " is not divisible by --num-query-groups " + std::to_string(m.num_query_groups),
                        "every query group serves the same number of heads");
  }
}

// The pipeline's layer split, with Megatron's rules for the interleaved schedule
// (validate_args in megatron/training/arguments.py): PP > 1, or PP > 2 without the
// overlapped p2p communication, and whole virtual stages of --num-layers-per-virtual-pipeline-stage.
// --context-parallel-size and --cp-comm-type (Megatron's validate_args: the sequence splits
// into 2 x CP chunks; tessera builds the p2p ring only).
int parse_context_parallel(const ParsedOptions& p, TrainArgs& a, const GPTConfig& m) {
  const int cp = static_cast<int>(positive(p, "--context-parallel-size"));
  for (const std::string& type : p.get_list("--cp-comm-type"))
    if (type != "p2p")
      throw usage_error("--cp-comm-type " + type + " is not built in tessera: it has the p2p ring only",
                        "use --cp-comm-type p2p (Megatron's default)");
  if (cp > 1 && m.seq_length % (2 * cp) != 0)
    throw usage_error("--seq-length " + std::to_string(m.seq_length) + " is not divisible by 2 x "
                      "--context-parallel-size " + std::to_string(cp),
                      "context parallelism splits each sequence into 2 x CP equal chunks");
  a.context_parallel_size = cp;
  return cp;
}

PipelineSplit parse_pipeline_split(const ParsedOptions& p, int num_layers, int pp) {
  PipelineSplit split;
  split.pp_size = pp;
  if (p.raw("--decoder-first-pipeline-num-layers"))
    split.first_stage_layers = static_cast<int>(positive(p, "--decoder-first-pipeline-num-layers"));
  if (p.raw("--decoder-last-pipeline-num-layers"))
    split.last_stage_layers = static_cast<int>(positive(p, "--decoder-last-pipeline-num-layers"));
  if (!p.raw("--num-layers-per-virtual-pipeline-stage")) return split;
  const int per = static_cast<int>(positive(p, "--num-layers-per-virtual-pipeline-stage"));
  const bool overlap_p2p = p.raw("--no-overlap-p2p-communication").value_or("True") == "True";
  if (overlap_p2p && pp < 2)
    throw usage_error("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1 "
                      "(Megatron's rule for the interleaved schedule)",
                      "raise --pipeline-model-parallel-size, or drop --num-layers-per-virtual-pipeline-stage");
  if (!overlap_p2p && pp < 3)
    throw usage_error("--num-layers-per-virtual-pipeline-stage with --no-overlap-p2p-communication needs "
                      "--pipeline-model-parallel-size > 2 (Megatron's rule for the interleaved schedule)",
                      "drop --no-overlap-p2p-communication, or raise --pipeline-model-parallel-size");
  if (num_layers % (per * pp) != 0)
    throw usage_error("--num-layers " + std::to_string(num_layers) + " is not divisible by "
                      "--num-layers-per-virtual-pipeline-stage x --pipeline-model-parallel-size (" +
                      std::to_string(per) + " x " + std::to_string(pp) + ")");
  split.virtual_stages = num_layers / (per * pp);
  return split;
}

// --save, --load and how they save and resume (docs/checkpoints.md).
// Megatron's converter run (megatron/training/initialize.py and training.py
// setup_model_and_optimizer): --load's checkpoint, loaded into this run's layout, is saved in
// --ckpt-convert-format into --ckpt-convert-save/<format> at its iteration, and the run exits.
void parse_checkpoint_conversion(const ParsedOptions& p, TrainArgs& a) {
  a.ckpt_convert_format = p.get_string("--ckpt-convert-format");
  a.ckpt_convert_save = p.get_string("--ckpt-convert-save");
  if (a.ckpt_convert_format.empty()) {
    if (!a.ckpt_convert_save.empty())
      log_warn("--ckpt-convert-save %s has no effect without --ckpt-convert-format (as in Megatron-LM)",
               a.ckpt_convert_save.c_str());
    return;
  }
  if (a.ckpt_convert_format == "zarr")
    throw usage_error("--ckpt-convert-format zarr is not written by tessera (Megatron-LM deprecates it)",
                      "use --ckpt-convert-format torch_dist or torch");
  if (a.ckpt_convert_save.empty())
    throw usage_error("--ckpt-convert-format needs --ckpt-convert-save DIR",
                      "the converted checkpoint goes to DIR/" + a.ckpt_convert_format + ", as in Megatron-LM");
  if (a.load.empty())
    throw usage_error("--ckpt-convert-format converts --load's checkpoint; pass --load DIR");
  a.save = (std::filesystem::path(a.ckpt_convert_save) / a.ckpt_convert_format).string();
  a.save_torch_dist = a.ckpt_convert_format == "torch_dist";
  a.save_megatron_format = a.ckpt_convert_format == "torch";
}

void parse_checkpoint_options(const ParsedOptions& p, TrainArgs& a) {
  a.save = p.get_string("--save");
  a.load = p.get_string("--load");
  if (p.raw("--save-interval")) a.save_interval = positive(p, "--save-interval");
  if (!a.save.empty() && a.save_interval == 0)
    throw usage_error("--save needs --save-interval", "e.g. --save-interval 1000 (a save also happens at the end)");
  a.no_save_optim = p.get_bool("--no-save-optim");
  a.no_save_rng = p.get_bool("--no-save-rng");
  a.no_load_rng = p.get_bool("--no-load-rng");
  a.no_load_optim = p.get_bool("--no-load-optim");
  a.finetune = p.get_bool("--finetune");
  a.use_checkpoint_scheduler = p.get_bool("--use-checkpoint-opt_param-scheduler");
  a.override_scheduler = p.get_bool("--override-opt_param-scheduler");
  if (a.use_checkpoint_scheduler && a.override_scheduler)
    throw usage_error("give only one of --use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler");
  const std::string format = p.get_string("--ckpt-format");
  a.save_torch_dist = format == "torch_dist";
  a.save_megatron_format = format == "torch";
  if (format == "zarr" && !a.save.empty())
    throw usage_error("--ckpt-format zarr is not written by tessera (Megatron-LM deprecates it)",
                      "use --ckpt-format torch_dist, Megatron's default");
  a.use_checkpoint_args = p.get_bool("--use-checkpoint-args");
  parse_checkpoint_conversion(p, a);
  // --moe-grouped-gemm saves megatron-core's GroupedMLP: two tensors per layer for the experts,
  // which Megatron's distributed optimizer lays out in its buffers unlike tessera's per-expert
  // parameters (docs/checkpoints.md).
  if (a.save_megatron_format && !a.save.empty() && p.get_bool("--moe-grouped-gemm") && a.use_distributed_optimizer &&
      !a.no_save_optim)
    throw usage_error("saving --ckpt-format torch with --moe-grouped-gemm and --use-distributed-optimizer is not "
                      "supported (megatron-core's GroupedMLP experts in distrib_optim.pt)",
                      "add --no-save-optim, or save with --ckpt-format torch_dist (the default), whose grouped "
                      "experts megatron-core keys as SequentialMLP's");
}

// The tokenizer, and from it the vocabulary size and the end-of-document and pad ids
// (pretrain_gpt's default tokenizer is GPT-2 BPE).
void parse_tokenizer(const ParsedOptions& p, TrainArgs& a) {
  a.make_vocab_size_divisible_by = static_cast<int>(positive(p, "--make-vocab-size-divisible-by"));
  a.tokenizer.type = p.raw("--tokenizer-type").value_or("GPT2BPETokenizer");
  a.tokenizer.vocab_file = p.get_string("--vocab-file");
  a.tokenizer.merge_file = p.get_string("--merge-file");
  a.tokenizer.tokenizer_model = p.get_string("--tokenizer-model");
  if (p.raw("--vocab-size")) a.tokenizer.vocab_size = positive(p, "--vocab-size");
  if (a.tokenizer.type == "NullTokenizer" && !a.tokenizer.vocab_size)
    throw usage_error("--tokenizer-type NullTokenizer needs --vocab-size");
  if (a.tokenizer.type == "GPT2BPETokenizer" && (a.tokenizer.vocab_file.empty() || a.tokenizer.merge_file.empty()))
    throw usage_error("--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file");
  std::unique_ptr<data::Tokenizer> tokenizer = data::build_tokenizer(a.tokenizer);
  a.model.vocab_size = static_cast<int>(tokenizer->vocab_size());
  a.eod = tokenizer->eod();
  a.pad = tokenizer->pad();
}

// The training data (docs/data.md); the seed and sequence length come from the model.
data::DataArgs parse_data_options(const ParsedOptions& p) {
  data::DataArgs d;
  d.mock_data = p.get_bool("--mock-data");
  auto list = [&](const char* flag) {
    return p.given(flag) ? std::optional<std::vector<std::string>>(p.get_list(flag)) : std::nullopt;
  };
  auto text = [&](const char* flag) { return p.raw(flag); };
  d.data_path = list("--data-path");
  d.data_args_path = text("--data-args-path");
  d.train_data_path = list("--train-data-path");
  d.valid_data_path = list("--valid-data-path");
  d.test_data_path = list("--test-data-path");
  d.per_split_data_args_path = text("--per-split-data-args-path");
  d.split = text("--split");
  d.data_cache_path = text("--data-cache-path");
  d.renormalize_blend_weights = p.get_bool("--renormalize-blend-weights");
  d.reset_position_ids = p.get_bool("--reset-position-ids");
  d.reset_attention_mask = p.get_bool("--reset-attention-mask");
  d.eod_mask_loss = p.get_bool("--eod-mask-loss");
  if (d.reset_attention_mask)
    throw usage_error("--reset-attention-mask is not supported yet",
                      "the model's attention is plain causal; drop the flag (--reset-position-ids works)");
  if (!d.mock_data && !d.data_path && !d.data_args_path && !d.train_data_path && !d.per_split_data_args_path)
    throw usage_error("no training data", "pass --data-path PREFIX (from `tessera preprocess`) or --mock-data");
  return d;
}

// Mixed precision: Megatron's choice of scaler (get_megatron_optimizer in
// megatron/core/optimizer/__init__.py).
void parse_precision(const ParsedOptions& p, TrainArgs& a) {
  a.fp16 = p.get_bool("--fp16");
  a.bf16 = p.get_bool("--bf16");
  if (a.fp16 && a.bf16) throw usage_error("--fp16 and --bf16 cannot both be given");
  a.model.params_dtype = a.fp16 ? DType::F16 : a.bf16 ? DType::BF16 : DType::F32;
  if (auto static_scale = p.get_opt_float("--loss-scale"); static_scale && (a.fp16 || a.bf16)) {
    if (!(*static_scale > 0)) throw usage_error("--loss-scale must be > 0");
    a.loss_scaler = LossScalerConfig{};
    a.loss_scaler->dynamic = false;
    a.loss_scaler->static_scale = *static_scale;
  } else if (a.fp16) {
    a.loss_scaler = LossScalerConfig{};
    a.loss_scaler->initial_scale = p.get_float("--initial-loss-scale");
    a.loss_scaler->min_scale = p.get_float("--min-loss-scale");
    a.loss_scaler->window = static_cast<int>(positive(p, "--loss-scale-window"));
    a.loss_scaler->hysteresis = static_cast<int>(positive(p, "--hysteresis"));
  }
}

// Batch-size ramp-up: every global batch of the ramp must split into micro-batches of
// every data-parallel rank (and, interleaved, into multiples of the pipeline size).
void parse_batch_rampup(const ParsedOptions& p, TrainArgs& a, int dp, int pp) {
  const std::vector<std::string> ramp = p.get_list("--rampup-batch-size");
  if (ramp.empty()) return;
  if (ramp.size() != 3) throw usage_error("--rampup-batch-size takes three values: START INCREMENT SAMPLES");
  TrainArgs::BatchRampup r;
  try {
    r = {std::stoll(ramp[0]), std::stoll(ramp[1]), std::stoll(ramp[2])};
  } catch (const std::exception&) {
    throw usage_error("--rampup-batch-size takes three integers: START INCREMENT SAMPLES");
  }
  const int64_t unit = a.micro_batch_size * dp;
  if (r.start <= 0 || r.increment <= 0 || r.samples <= 0 || r.start > a.global_batch_size ||
      (a.global_batch_size - r.start) % r.increment != 0)
    throw usage_error("--rampup-batch-size " + ramp[0] + " " + ramp[1] + " " + ramp[2] +
                      ": START and INCREMENT must be positive and step from START to --global-batch-size " +
                      std::to_string(a.global_batch_size));
  if (r.start % unit != 0 || r.increment % unit != 0)
    throw usage_error("--rampup-batch-size START and INCREMENT must be multiples of --micro-batch-size x "
                      "data-parallel size (" + std::to_string(unit) + ")");
  if (r.start < a.global_batch_size) a.rampup = r;  // else there is nothing to ramp
  if (a.pipeline_split.virtual_stages > 1)
    for (int64_t b = r.start; b <= a.global_batch_size; b += r.increment)
      if ((b / unit) % pp != 0)
        throw usage_error("the interleaved schedule needs micro-batches divisible by --pipeline-model-parallel-size; "
                          "the ramp's global batch " + std::to_string(b) + " gives " + std::to_string(b / unit));
}

// Iterations or samples, and the schedule in samples (megatron/training/training.py's
// get_optimizer_param_scheduler).
void parse_schedule(const ParsedOptions& p, TrainArgs& a) {
  const int64_t gbs = a.global_batch_size;
  LrScheduleConfig& s = a.lr_schedule;
  auto warmup_fraction = p.get_opt_float("--lr-warmup-fraction");
  const bool by_samples = p.get_opt_int("--train-samples").has_value();
  if (by_samples == p.get_opt_int("--train-iters").has_value())
    throw usage_error("give exactly one of --train-iters and --train-samples");
  if (by_samples) {
    if (p.raw("--lr-decay-iters") || p.get_int("--lr-warmup-iters") != 0 || p.raw("--lr-wsd-decay-iters"))
      throw usage_error("with --train-samples, use the *-samples schedule flags (--lr-decay-samples, "
                        "--lr-warmup-samples, --lr-wsd-decay-samples), not the *-iters ones");
    a.train_samples = positive(p, "--train-samples");
    a.train_iters = *a.train_samples / gbs;
    if (a.rampup) {
      // Megatron's update_train_iters: the ramp's iterations (through the first batch that
      // starts beyond SAMPLES), then whole global batches; a partial last batch is dropped.
      int64_t consumed = 0, iterations = 0;
      while (consumed <= a.rampup->samples) consumed += a.global_batch_at(consumed), ++iterations;
      a.train_iters = iterations + (*a.train_samples - consumed) / gbs;
    }
    s.decay_steps = p.get_opt_int("--lr-decay-samples").value_or(*a.train_samples);
    s.warmup_steps = warmup_fraction ? static_cast<int64_t>(*warmup_fraction * s.decay_steps)
                                     : p.get_int("--lr-warmup-samples");
    if (warmup_fraction && p.get_int("--lr-warmup-samples") != 0)
      throw usage_error("give only one of --lr-warmup-fraction and --lr-warmup-samples");
    s.wsd_decay_steps = p.get_opt_int("--lr-wsd-decay-samples").value_or(0);
    s.wd_incr_steps = *a.train_samples;
  } else {
    if (p.raw("--lr-decay-samples") || p.get_int("--lr-warmup-samples") != 0 || p.raw("--lr-wsd-decay-samples"))
      throw usage_error("with --train-iters, use the *-iters schedule flags (--lr-decay-iters, --lr-warmup-iters, "
                        "--lr-wsd-decay-iters), not the *-samples ones");
    if (a.rampup)
      throw usage_error("--rampup-batch-size needs sample-based training (--train-samples), as in Megatron");
    a.train_iters = positive(p, "--train-iters");
    s.decay_steps = p.get_opt_int("--lr-decay-iters").value_or(a.train_iters) * gbs;
    if (warmup_fraction && p.get_int("--lr-warmup-iters") != 0)
      throw usage_error("give only one of --lr-warmup-fraction and --lr-warmup-iters");
    s.warmup_steps = warmup_fraction ? static_cast<int64_t>(*warmup_fraction * s.decay_steps)
                                     : p.get_int("--lr-warmup-iters") * gbs;
    s.wsd_decay_steps = p.get_opt_int("--lr-wsd-decay-iters").value_or(0) * gbs;
    s.wd_incr_steps = a.train_iters * gbs;
  }
  if (a.train_iters <= 0) throw usage_error("--train-samples is smaller than one global batch");
  s.max_lr = p.get_float("--lr");
  s.min_lr = p.get_float("--min-lr");
  s.init_lr = p.get_float("--lr-warmup-init");
  const std::string style = p.get_string("--lr-decay-style");
  s.decay_style = style == "constant" ? LrDecayStyle::Constant
                  : style == "linear" ? LrDecayStyle::Linear
                  : style == "cosine" ? LrDecayStyle::Cosine
                  : style == "inverse-square-root" ? LrDecayStyle::InverseSquareRoot
                                                   : LrDecayStyle::WSD;
  const std::string wsd = p.get_string("--lr-wsd-decay-style");
  s.wsd_style = wsd == "linear" ? WsdDecayStyle::Linear : wsd == "cosine" ? WsdDecayStyle::Cosine
                                                                          : WsdDecayStyle::Exponential;
  const std::string wd_style = p.get_string("--weight-decay-incr-style");
  if (wd_style == "constant") {
    if (p.raw("--start-weight-decay") || p.raw("--end-weight-decay"))
      throw usage_error("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
    s.wd_style = WdIncrStyle::Constant;
    s.start_wd = s.end_wd = p.get_float("--weight-decay");
  } else {
    if (!p.raw("--start-weight-decay") || !p.raw("--end-weight-decay"))
      throw usage_error("--weight-decay-incr-style " + wd_style + " needs --start-weight-decay and --end-weight-decay");
    s.wd_style = wd_style == "linear" ? WdIncrStyle::Linear : WdIncrStyle::Cosine;
    s.start_wd = p.get_float("--start-weight-decay");
    s.end_wd = p.get_float("--end-weight-decay");
  }
  LrScheduler check(s);  // Megatron's asserts, as usage errors naming the flags.
}

// The optimizer and gradient clipping.
void parse_optimizer(const ParsedOptions& p, TrainArgs& a) {
  OptimizerConfig& o = a.optimizer;
  o.kind = p.get_string("--optimizer") == "sgd" ? OptimizerKind::SGD : OptimizerKind::Adam;
  // Megatron's distributed optimizer is Adam only (megatron/core/optimizer/distrib_optimizer.py).
  if (a.use_distributed_optimizer && o.kind != OptimizerKind::Adam)
    throw usage_error("--use-distributed-optimizer works with --optimizer adam only",
                      "drop --optimizer sgd, or drop --use-distributed-optimizer");
  o.adam_beta1 = static_cast<float>(p.get_float("--adam-beta1"));
  o.adam_beta2 = static_cast<float>(p.get_float("--adam-beta2"));
  o.adam_eps = static_cast<float>(p.get_float("--adam-eps"));
  o.sgd_momentum = static_cast<float>(p.get_float("--sgd-momentum"));
  o.clip_grad = static_cast<float>(p.get_float("--clip-grad"));
  if (o.clip_grad < 0) throw usage_error("--clip-grad must be >= 0");
}

// --moe-layer-freq: N (layer l is MoE when l % N == 0) or a Python list of 0/1 per layer
// (Megatron's moe_freq_type; its other Python expressions are refused).
std::vector<bool> parse_moe_layer_freq(const std::string& text, int num_layers) {
  std::vector<bool> layers;
  if (text.find('[') == std::string::npos) {
    int n = 0;
    try {
      n = std::stoi(text);
    } catch (const std::exception&) {
    }
    if (n <= 0) throw usage_error("--moe-layer-freq must be a positive integer or a list like [1,0,1,0], got " + text);
    for (int l = 0; l < num_layers; ++l) layers.push_back(l % n == 0);
    return layers;
  }
  if (text.front() != '[' || text.back() != ']')
    throw usage_error("--moe-layer-freq " + text + ": tessera reads a plain list of 0/1 per layer",
                      "write the list out, e.g. [1,1,1,0,1,1,1,0]");
  for (char ch : text.substr(1, text.size() - 2)) {
    if (ch == '0' || ch == '1') layers.push_back(ch == '1');
    else if (ch != ',' && ch != ' ')
      throw usage_error("--moe-layer-freq " + text + ": tessera reads a plain list of 0/1 per layer",
                        "write the list out, e.g. [1,1,1,0,1,1,1,0]");
  }
  if (static_cast<int>(layers.size()) != num_layers)
    throw usage_error("--moe-layer-freq has " + std::to_string(layers.size()) + " entries for --num-layers " +
                      std::to_string(num_layers));
  return layers;
}

// The mixture of experts, with Megatron's checks (megatron/training/arguments.py validate_args,
// TransformerConfig.__post_init__, topk_softmax_with_capacity, MoELayer.forward).
void parse_moe_options(const ParsedOptions& p, TrainArgs& a) {
  MoEConfig& moe = a.model.moe;
  const int tp = a.tensor_parallel_size;
  const int ep = static_cast<int>(positive(p, "--expert-model-parallel-size"));
  const int64_t experts = p.get_opt_int("--num-experts").value_or(0);
  if (experts < 0) throw usage_error("--num-experts must be >= 0");
  if (experts == 0) {
    if (ep > 1) throw usage_error("--expert-model-parallel-size needs --num-experts");
    return;
  }
  moe.num_experts = static_cast<int>(experts);
  moe.topk = static_cast<int>(positive(p, "--moe-router-topk"));
  if (moe.topk > moe.num_experts)
    throw usage_error("--moe-router-topk " + std::to_string(moe.topk) + " is larger than --num-experts " +
                      std::to_string(moe.num_experts));
  moe.pre_softmax = p.get_bool("--moe-router-pre-softmax");
  if (moe.topk == 1 && !moe.pre_softmax)
    throw usage_error("--moe-router-topk 1 needs --moe-router-pre-softmax (Megatron's rule: the softmax over one "
                      "logit is 1)",
                      "add --moe-router-pre-softmax");
  if (moe.num_experts % ep != 0)
    throw usage_error("--num-experts " + std::to_string(moe.num_experts) + " is not divisible by "
                      "--expert-model-parallel-size " + std::to_string(ep));
  moe.expert_parallel_size = ep;
  if (const auto etp = p.get_opt_int("--expert-tensor-parallel-size"); etp && *etp != tp)
    throw usage_error("--expert-tensor-parallel-size " + std::to_string(*etp) + " differs from "
                      "--tensor-model-parallel-size " + std::to_string(tp) + ": tessera slices the experts as the "
                      "dense layers (Megatron's default)",
                      "leave --expert-tensor-parallel-size unset, or set it to --tensor-model-parallel-size");
  if (tp > 1 && !a.sequence_parallel)
    throw usage_error("MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel (Megatron raises this in "
                      "MoELayer.forward during training)",
                      "add --sequence-parallel");
  if (a.model.add_bias_linear)
    throw usage_error("--num-experts without --disable-bias-linear: experts with biases are not supported yet",
                      "add --disable-bias-linear (as Mixtral and Qwen2-MoE)");
  if (a.model.recompute == Recompute::Full)
    throw usage_error("--recompute-granularity full with --num-experts is not supported yet");
  moe.load_balancing = p.get_string("--moe-router-load-balancing-type") == "none" ? MoELoadBalancing::None
                                                                                   : MoELoadBalancing::AuxLoss;
  moe.aux_loss_coeff = p.get_float("--moe-aux-loss-coeff");
  moe.z_loss_coeff = p.get_opt_float("--moe-z-loss-coeff").value_or(0.0);
  moe.ffn_hidden_size = p.get_opt_int("--moe-ffn-hidden-size") ? static_cast<int>(positive(p, "--moe-ffn-hidden-size"))
                                                                : a.model.ffn_hidden_size;
  if (moe.ffn_hidden_size % tp != 0)
    throw usage_error("--moe-ffn-hidden-size " + std::to_string(moe.ffn_hidden_size) +
                      " is not divisible by --tensor-model-parallel-size " + std::to_string(tp));
  moe.moe_layers = parse_moe_layer_freq(p.get_string("--moe-layer-freq"), a.model.num_layers);
  moe.dispatcher = p.get_string("--moe-token-dispatcher-type") == "alltoall" ? MoEDispatcher::AllToAll
                                                                              : MoEDispatcher::AllGather;
  if (p.raw("--moe-shared-expert-intermediate-size")) {
    moe.shared_expert_size = static_cast<int>(positive(p, "--moe-shared-expert-intermediate-size"));
    if (moe.shared_expert_size % tp != 0)
      throw usage_error("--moe-shared-expert-intermediate-size is not divisible by --tensor-model-parallel-size");
  }
  moe.shared_expert_gate = p.get_bool("--moe-shared-expert-gate");
  if (moe.shared_expert_gate && moe.shared_expert_size == 0)
    throw usage_error("--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
  if (p.get_bool("--moe-shared-expert-overlap") && moe.dispatcher != MoEDispatcher::AllToAll)
    throw usage_error("--moe-shared-expert-overlap only works with --moe-token-dispatcher-type alltoall");
  moe.capacity_factor = p.get_opt_float("--moe-expert-capacity-factor").value_or(0.0);
  if (moe.capacity_factor > 0 && moe.dispatcher != MoEDispatcher::AllToAll)
    throw usage_error("--moe-expert-capacity-factor only works with --moe-token-dispatcher-type alltoall (Megatron's "
                      "rule)",
                      "add --moe-token-dispatcher-type alltoall");
  moe.pad_to_capacity = p.get_bool("--moe-pad-expert-input-to-capacity");
  if (moe.pad_to_capacity && moe.capacity_factor <= 0)
    throw usage_error("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  a.moe_per_layer_logging = p.get_bool("--moe-per-layer-logging");
  moe.drop_policy = p.get_string("--moe-token-drop-policy") == "position" ? MoEDropPolicy::Position
                                                                           : MoEDropPolicy::Probs;
}

// --enable-cuda-graph: what the captured step cannot hold yet is refused by name (the device is
// checked when it opens, Trainer). Collectives record events the NCCL watchdog queries and the
// host-staged ones copy to the host; the MoE router reads the routing on the host.
void validate_cuda_graph(const TrainArgs& a) {
  if (!a.enable_cuda_graph) return;
  if (a.world_size > 1)
    throw usage_error("--enable-cuda-graph with " + std::to_string(a.world_size) +
                          " ranks: a captured step cannot hold collectives yet",
                      "run one rank with --enable-cuda-graph, or drop the flag (docs/backends.md, CUDA graphs)");
  if (a.model.moe.enabled())
    throw usage_error("--enable-cuda-graph with --num-experts: the MoE router reads the routing on the host",
                      "drop --enable-cuda-graph for mixture-of-experts models (docs/backends.md, CUDA graphs)");
}

// Each of Megatron's flags writes the attribute Megatron's parser gives it (Megatron's argument
// dump, the Namespace of its checkpoints); tessera's own keep the name derived from the flag.
std::vector<OptionDef> with_megatron_dests(std::vector<OptionDef> defs) {
  for (OptionDef& d : defs)
    if (const MegatronFlag* f = find_megatron_flag(d.flag)) d.dest = f->dest;
  return defs;
}

}  // namespace

const OptionTable& train_option_table() {
  // Megatron's parser sets allow_abbrev=False.
  static const OptionTable table("tessera train", with_megatron_dests([] {
                                   std::vector<OptionDef> defs = train_option_defs();
                                   for (OptionDef& d : moe_option_defs()) defs.push_back(d);
                                   return defs;
                                 }()),
                                 {is_megatron_flag, false});
  return table;
}

int64_t TrainArgs::global_batch_at(int64_t consumed) const {
  if (!rampup || consumed > rampup->samples) return global_batch_size;
  const int64_t increments = (global_batch_size - rampup->start) / rampup->increment;
  const double samples_per_increment = static_cast<double>(rampup->samples) / static_cast<double>(increments);
  const int64_t steps = static_cast<int64_t>(static_cast<double>(consumed) / samples_per_increment);
  return std::min(global_batch_size, rampup->start + steps * rampup->increment);
}

namespace {

// The model's shape and the flags that change its math.
void parse_model_shape(const ParsedOptions& p, GPTConfig& m) {
  m.num_layers = static_cast<int>(positive(p, "--num-layers"));
  m.hidden_size = static_cast<int>(positive(p, "--hidden-size"));
  m.num_attention_heads = static_cast<int>(positive(p, "--num-attention-heads"));
  if (auto kv = p.get_opt_int("--kv-channels")) {
    m.kv_channels = static_cast<int>(positive(p, "--kv-channels"));
  } else {
    if (m.hidden_size % m.num_attention_heads != 0)
      throw usage_error("--hidden-size " + std::to_string(m.hidden_size) + " is not divisible by --num-attention-heads " +
                            std::to_string(m.num_attention_heads),
                        "choose sizes where heads divide the hidden size, or set --kv-channels");
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  m.swiglu = p.get_bool("--swiglu");
  // Megatron's default with --swiglu keeps the MLP's parameter count near 8H^2:
  // int(4H * 2/3 / 64) * 64 (megatron/training/arguments.py).
  m.ffn_hidden_size = p.get_opt_int("--ffn-hidden-size") ? static_cast<int>(positive(p, "--ffn-hidden-size"))
                      : m.swiglu                          ? 4 * m.hidden_size * 2 / 3 / 64 * 64
                                                          : 4 * m.hidden_size;
  if (m.ffn_hidden_size <= 0)
    throw usage_error("--swiglu's default --ffn-hidden-size is 0 for --hidden-size " + std::to_string(m.hidden_size),
                      "set --ffn-hidden-size");
  parse_llama_options(p, m);
  m.seq_length = static_cast<int>(positive(p, "--seq-length"));
  m.max_position_embeddings = static_cast<int>(positive(p, "--max-position-embeddings"));
  if (m.seq_length > m.max_position_embeddings)
    throw usage_error("--seq-length " + std::to_string(m.seq_length) + " is longer than --max-position-embeddings " +
                      std::to_string(m.max_position_embeddings));
  m.norm_epsilon = static_cast<float>(p.get_float("--norm-epsilon"));
  if (!(m.norm_epsilon > 0)) throw usage_error("--norm-epsilon must be > 0");
  m.init_method_std = static_cast<float>(p.get_float("--init-method-std"));
  if (!(m.init_method_std >= 0)) throw usage_error("--init-method-std must be >= 0");
  m.hidden_dropout = probability(p, "--hidden-dropout");
  m.attention_dropout = probability(p, "--attention-dropout");
  // Megatron: the fused bias-GELU (default) and --openai-gelu use tanh; the unfused path erf.
  const bool fused = p.raw("--no-bias-gelu-fusion").value_or("True") == "True";
  m.gelu = (fused || p.get_bool("--openai-gelu")) ? ops::GeluKind::Tanh : ops::GeluKind::Erf;
  m.untie_embeddings_and_output_weights = p.get_bool("--untie-embeddings-and-output-weights");
  m.add_bias_linear = p.raw("--disable-bias-linear").value_or("True") == "True";
  m.add_qkv_bias = p.get_bool("--add-qkv-bias");
  int64_t seed = p.get_int("--seed");
  if (seed <= 0 || seed > 0xffffffffLL) throw usage_error("--seed must be in [1, 2^32)");
  m.seed = static_cast<uint32_t>(seed);
}

// Recomputation, with Megatron's rules for combining the flags.
void parse_recompute(const ParsedOptions& p, GPTConfig& m) {
  std::optional<std::string> granularity = p.raw("--recompute-granularity");
  if (p.get_bool("--recompute-activations")) granularity = "selective";
  const std::optional<std::string> method = p.raw("--recompute-method");
  if (granularity == "full") {
    if (!method) throw usage_error("--recompute-granularity full needs --recompute-method uniform|block");
    m.recompute = Recompute::Full;
    m.recompute_method = *method == "block" ? RecomputeMethod::Block : RecomputeMethod::Uniform;
    if (!p.raw("--recompute-num-layers"))
      throw usage_error("--recompute-granularity full needs --recompute-num-layers");
    m.recompute_num_layers = static_cast<int>(positive(p, "--recompute-num-layers"));
  } else if (granularity == "selective") {
    if (method || p.raw("--recompute-num-layers"))
      throw usage_error("--recompute-method and --recompute-num-layers go with --recompute-granularity full, "
                        "not selective");
    m.recompute = Recompute::Selective;
  } else if (method || p.raw("--recompute-num-layers")) {
    throw usage_error("--recompute-method / --recompute-num-layers need --recompute-granularity full");
  }
}

// Parallel layout: world = TP x CP x DP x PP (Megatron's order, parallel/topology.h).
void parse_parallel_layout(const ParsedOptions& p, TrainArgs& a, int world_size) {
  GPTConfig& m = a.model;
  const int tp = static_cast<int>(positive(p, "--tensor-model-parallel-size"));
  const int pp = static_cast<int>(positive(p, "--pipeline-model-parallel-size"));
  const int cp = parse_context_parallel(p, a, m);
  if (world_size % (tp * cp * pp) != 0)
    throw usage_error("the world size " + std::to_string(world_size) + " is not divisible by "
                      "--tensor-model-parallel-size " + std::to_string(tp) + " x " +
                      (cp > 1 ? "--context-parallel-size " + std::to_string(cp) + " x " : std::string()) +
                      "--pipeline-model-parallel-size " + std::to_string(pp),
                      "start tp x cp x pp x dp processes (tessera launch --nproc_per_node x --nnodes)");
  const int dp = world_size / (tp * cp * pp);
  a.tensor_parallel_size = tp;
  // Each TP rank holds whole query groups (Megatron's grouped QKV rows).
  if (m.query_groups() % tp != 0)
    throw usage_error(
        (m.query_groups() == m.num_attention_heads ? "--num-attention-heads (" : "--num-query-groups (") +
            std::to_string(m.query_groups()) + ") is not divisible by --tensor-model-parallel-size " +
            std::to_string(tp),
        "each tensor-parallel rank holds whole heads and query groups");
  a.pipeline_parallel_size = pp;
  a.sequence_parallel = p.get_bool("--sequence-parallel");
  if (a.sequence_parallel && tp == 1) {
    log_warn("disabling sequence parallelism because tensor model parallelism is disabled");
    a.sequence_parallel = false;
  }
  if (a.sequence_parallel && (m.seq_length / cp) % tp != 0)
    throw usage_error("--seq-length " + std::to_string(m.seq_length) +
                      (cp > 1 ? " / --context-parallel-size " + std::to_string(cp) : std::string()) +
                      " is not divisible by --tensor-model-parallel-size " + std::to_string(tp) +
                      " (needed by --sequence-parallel)");
  a.pipeline_split = parse_pipeline_split(p, m.num_layers, pp);
  // Every stage's layer count is checked here, before anything is allocated.
  for (int r = 0; r < pp; ++r) pipeline_chunks(m.num_layers, a.pipeline_split, r);
  a.world_size = world_size;
  a.data_parallel_size = dp;
  a.distributed_backend = p.get_string("--distributed-backend");
  a.distributed_timeout_minutes = static_cast<int>(positive(p, "--distributed-timeout-minutes"));
  a.overlap_grad_reduce = p.get_bool("--overlap-grad-reduce");
  a.use_distributed_optimizer = p.get_bool("--use-distributed-optimizer");
  a.overlap_param_gather = p.get_bool("--overlap-param-gather");
  // Megatron's validate_args asserts.
  if (a.overlap_param_gather && !a.use_distributed_optimizer)
    throw usage_error("--overlap-param-gather only works with the distributed optimizer",
                      "add --use-distributed-optimizer, or drop --overlap-param-gather");
  if (a.overlap_param_gather && !a.overlap_grad_reduce)
    throw usage_error("--overlap-param-gather needs --overlap-grad-reduce", "add --overlap-grad-reduce");
  a.ddp_bucket_size = p.raw("--ddp-bucket-size") ? positive(p, "--ddp-bucket-size")
                                                 : std::max<int64_t>(40000000, 1000000LL * dp * cp);

}

// Batch sizes, logging and TensorBoard.
void parse_batch_and_logging(const ParsedOptions& p, TrainArgs& a) {
  const int dp = a.data_parallel_size;
  a.micro_batch_size = positive(p, "--micro-batch-size");
  a.global_batch_size = p.get_opt_int("--global-batch-size") ? positive(p, "--global-batch-size")
                                                             : a.micro_batch_size * dp;
  if (a.global_batch_size % (a.micro_batch_size * dp) != 0)
    throw usage_error("--global-batch-size " + std::to_string(a.global_batch_size) +
                          " is not a multiple of --micro-batch-size × data-parallel size (" +
                          std::to_string(a.micro_batch_size) + " × " + std::to_string(dp) + ")");
  a.log_interval = static_cast<int>(positive(p, "--log-interval"));
  a.log_throughput = p.get_bool("--log-throughput");
  if (auto peak = p.get_opt_float("--peak-tflops-per-device")) {
    if (!(*peak > 0)) throw usage_error("--peak-tflops-per-device must be > 0");
    a.peak_tflops_per_device = *peak;
  }
  a.tensorboard_dir = p.get_string("--tensorboard-dir");
  a.tensorboard_log_interval = static_cast<int>(positive(p, "--tensorboard-log-interval"));
  a.log_loss_scale_to_tensorboard = p.raw("--no-log-loss-scale-to-tensorboard").value_or("True") == "True";
  a.log_validation_ppl_to_tensorboard = p.get_bool("--log-validation-ppl-to-tensorboard");
  a.log_memory_to_tensorboard = p.get_bool("--log-memory-to-tensorboard");

}

// When to stop and what to check while running.
void parse_run_control(const ParsedOptions& p, TrainArgs& a) {
  if (p.raw("--exit-interval")) a.exit_interval = positive(p, "--exit-interval");
  if (auto minutes = p.get_opt_float("--exit-duration-in-mins")) {
    if (!(*minutes > 0)) throw usage_error("--exit-duration-in-mins must be > 0");
    a.exit_duration_minutes = *minutes;
  }
  a.exit_signal_handler = p.get_bool("--exit-signal-handler");
  a.check_for_nan = p.raw("--no-check-for-nan-in-loss-and-grad").value_or("True") == "True";
  // Under fp16 dynamic scaling an overflow belongs to the scaler (skip), not the NaN check.
  if (a.loss_scaler && a.loss_scaler->dynamic) a.check_for_nan = false;
  a.dry_run = p.get_bool("--dry-run");
  if (auto z = p.get_opt_float("--skip-spikes")) {
    if (!(*z > 0)) throw usage_error("--skip-spikes must be > 0 (a z-score)");
    a.skip_spikes = *z;
  }
}
}  // namespace

TrainArgs parse_train_args(int argc, char** argv, ParsedOptions* parsed_out, int world_size) {
  ParsedOptions p = train_option_table().parse(argc, argv);
  TrainArgs a;
  GPTConfig& m = a.model;
  parse_model_shape(p, m);
  parse_recompute(p, m);
  parse_parallel_layout(p, a, world_size);
  const int tp = a.tensor_parallel_size, pp = a.pipeline_parallel_size, dp = a.data_parallel_size;

  parse_moe_options(p, a);
  parse_tokenizer(p, a);
  m.padded_vocab_size = padded_vocab_size(m.vocab_size, a.make_vocab_size_divisible_by, tp);
  for (auto [n, flag] : {std::pair{m.num_attention_heads, "--num-attention-heads"},
                         std::pair{m.ffn_hidden_size, "--ffn-hidden-size"}})
    if (n % tp != 0)
      throw usage_error(std::string(flag) + " " + std::to_string(n) + " is not divisible by "
                        "--tensor-model-parallel-size " + std::to_string(tp));

  a.data = parse_data_options(p);

  parse_batch_and_logging(p, a);
  parse_precision(p, a);
  a.eval_interval = static_cast<int>(positive(p, "--eval-interval"));
  a.eval_iters = static_cast<int>(p.get_int("--eval-iters"));
  a.data.seed = m.seed;
  a.data.seq_length = m.seq_length;
  if (a.eval_iters < 0) throw usage_error("--eval-iters must be >= 0");

  parse_batch_rampup(p, a, dp, pp);
  parse_schedule(p, a);
  parse_optimizer(p, a);
  parse_checkpoint_options(p, a);
  parse_run_control(p, a);
  for (int i = 0; i < argc; ++i) a.command_line.push_back(argv[i]);
  a.init_from_hf = p.get_string("--init-from-hf");
  a.log_json = p.get_string("--log-json");
  a.device = p.get_string("--device");
  parse_device_spec(a.device);  // the spelling now; whether this build has it when the device opens
  a.tf32 = p.get_bool("--tf32");
  a.deterministic_mode = p.get_bool("--deterministic-mode");
  a.enable_cuda_graph = p.get_bool("--enable-cuda-graph");
  validate_cuda_graph(a);
  // Megatron's argument dump shows values after its validate_args.
  p.set_derived("--kv-channels", std::to_string(m.kv_channels));
  p.set_derived("--ffn-hidden-size", std::to_string(m.ffn_hidden_size));
  p.set_derived("--global-batch-size", std::to_string(a.global_batch_size));
  p.set_derived("--tokenizer-type", a.tokenizer.type);
  if (parsed_out) *parsed_out = std::move(p);
  return a;
}

}  // namespace tessera
