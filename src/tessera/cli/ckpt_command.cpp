// `tessera ckpt <action>`: tools for tessera checkpoints (docs/checkpoints.md, "Tools").
//   inspect DIR [--iteration N]        iteration, arguments, layout, tensors, checksum status
//           [--summary]                (ckpt_summary.h) one line per shard folder
//   export-hf DIR OUT [--iteration N]  a Hugging Face GPT-2, Llama or Qwen2 folder (config.json,
//                                      model.safetensors, tokenizer files when known)
//   import-hf HF_DIR OUT [train flags] a Hugging Face GPT-2, Llama or Qwen2 as a tessera checkpoint
//                                      (iteration 0, model only) for --load OUT --finetune
//   convert SRC DST --to torch_dist|torch|tessera  between tessera's format and Megatron-LM's
//                                      two (model only, any target TP/PP)
// Each reads tessera's and Megatron-LM's (--ckpt-format torch_dist and torch) checkpoints alike.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/hf_export.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/megatron_layer_spec.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/ckpt/torch_dist.h"
#include "tessera/cli/ckpt_summary.h"
#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/options.h"
#include "tessera/core/sha256.h"
#include "tessera/data/tokenizer.h"
#include "tessera/train/arguments.h"
#include "tessera/train/megatron_args.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void print_help() {
  std::printf(
      "usage: tessera ckpt <action> [flags]\n\n"
      "actions:\n"
      "  inspect DIR [--iteration N] [--summary]\n"
      "      print the iteration (latest unless --iteration), the recorded arguments, the layout,\n"
      "      every tensor (dtype, shape, bytes) and every file's checksum status (OK, MISMATCH,\n"
      "      MISSING); exits 1 when any check fails. --summary: iteration, layout, parameter count,\n"
      "      dtypes, sizes and one line per shard folder, without verifying checksums\n"
      "  export-hf DIR OUT [--iteration N] [--tokenizer-model PATH]\n"
      "      write a Hugging Face folder: OUT/config.json, OUT/model.safetensors (F32) and, for\n"
      "      GPT2BPETokenizer, OUT/vocab.json and OUT/merges.txt; GPT2LMHeadModel, or for\n"
      "      RMSNorm/RoPE/SwiGLU models LlamaForCausalLM (Qwen2ForCausalLM with --add-qkv-bias)\n"
      "  import-hf HF_DIR OUT [train flags]\n"
      "      write HF_DIR's GPT-2, Llama or Qwen2 as a tessera checkpoint (iteration 0, model only) for\n"
      "      `tessera train --load OUT --finetune`; the model flags are derived from\n"
      "      HF_DIR/config.json unless given\n"
      "  convert SRC DST --to torch_dist|torch|tessera [--target-tensor-parallel-size N]\n"
      "          [--target-pipeline-parallel-size M] [--target-expert-parallel-size E] [--iteration N]\n"
      "          [--tokenizer-model PATH] [--transformer-impl local|transformer_engine]\n"
      "      write SRC's model (either format) into DST in Megatron-LM's --ckpt-format torch\n"
      "      files or tessera's, sharded for the target TP/PP (default: SRC's); the iteration,\n"
      "      consumed samples and arguments carry over, the optimizer state does not;\n"
      "      --transformer-impl: the layer spec of Megatron files (default: SRC's Namespace's,\n"
      "      local for tessera's checkpoints), transformer_engine for Megatron's default\n"
      "DIR and SRC may hold tessera's checkpoints or Megatron-LM's (--ckpt-format torch).\n"
      "--tokenizer-model PATH: the tokenizer the checkpoint's run used (HuggingFaceTokenizer,\n"
      "SentencePieceTokenizer, ...), for a checkpoint that records none or a path not on this machine.\n");
}

const OptionTable& ckpt_option_table() {
  static const OptionTable table("tessera ckpt",
                                 {{"--iteration", OptKind::Int, nullptr, "the checkpoint's iteration (default: latest)"},
                                  {"--summary", OptKind::StoreTrue, nullptr, "inspect: one line per shard folder"},
                                  {"--to", OptKind::Choice, nullptr, "convert: the target format",
                                   "torch_dist|torch|tessera"},
                                  {"--target-tensor-parallel-size", OptKind::Int, nullptr, "convert: the target TP"},
                                  {"--target-pipeline-parallel-size", OptKind::Int, nullptr, "convert: the target PP"},
                                  {"--target-expert-parallel-size", OptKind::Int, nullptr,
                                   "convert --to torch: the target EP (mp_rank_*_EEE folders)"},
                                  {"--transformer-impl", OptKind::Choice, nullptr,
                                   "convert --to torch|torch_dist: the files' layer spec (docs/checkpoints.md)",
                                   "local|transformer_engine"},
                                  {"--tokenizer-model", OptKind::String, nullptr,
                                   "convert, export-hf: the tokenizer's model file or folder, for a checkpoint that "
                                   "records none (or one not on this machine)"}},
                                 {nullptr, false});
  return table;
}

// Positional arguments and parsed flags.
struct Command {
  std::vector<std::string> positional;
  ParsedOptions options;
};

Command split_args(int argc, char** argv) {
  Command c;
  std::vector<char*> flags;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      flags.push_back(argv[i]);
      if (a.find('=') == std::string::npos && i + 1 < argc && a != "--summary") flags.push_back(argv[++i]);
    } else {
      c.positional.push_back(a);
    }
  }
  c.options = ckpt_option_table().parse(static_cast<int>(flags.size()), flags.data());
  return c;
}

std::string iteration_dir(const std::string& dir, int64_t iteration) { return checkpoint_iteration_dir(dir, iteration); }

int64_t choose_iteration(const std::string& dir, const ParsedOptions& p) {
  if (auto it = p.get_opt_int("--iteration")) {
    if (*it < 0) throw usage_error("--iteration must be >= 0");
    return *it;
  }
  if (!fs::is_directory(dir)) throw usage_error("checkpoint folder " + dir + " does not exist");
  auto latest = latest_checkpoint_iteration(dir);
  if (!latest)
    throw usage_error(dir + " holds no checkpoint (no latest_checkpointed_iteration.txt)",
                      "pass the folder given to --save, or --iteration N");
  return *latest;
}

json read_metadata(const std::string& it_dir) {
  const std::string path = (fs::path(it_dir) / "metadata.json").string();
  if (!fs::exists(path))
    throw runtime_error("checkpoint " + it_dir + " has no metadata.json",
                        "it was not written by tessera, or the save did not finish");
  json meta = json::parse(read_file(path), nullptr, false);
  if (meta.is_discarded() || !meta.is_object()) throw runtime_error(path + " is not a valid JSON object");
  return meta;
}

std::vector<std::string> recorded_args(const json& meta, const std::string& it_dir) {
  std::vector<std::string> out;
  auto it = meta.find("args");
  if (it == meta.end() || !it->is_array())
    throw runtime_error(it_dir + "/metadata.json records no \"args\" list", "re-save the checkpoint with tessera");
  for (const json& a : *it) {
    if (!a.is_string()) throw runtime_error(it_dir + "/metadata.json: \"args\" holds a non-string " + a.dump());
    out.push_back(a.get<std::string>());
  }
  return out;
}

bool has_flag(const std::vector<std::string>& flags, const std::string& f) {
  return std::any_of(flags.begin(), flags.end(),
                     [&](const std::string& a) { return a == f || a.rfind(f + "=", 0) == 0; });
}

// TrainArgs from flags that describe a model; training-only flags that are required
// (data, batch, length) are filled with placeholders when absent. world_size: the processes
// of the run that recorded them (its TP x PP x DP), so that its layout flags parse.
TrainArgs model_args(std::vector<std::string> flags, int world_size = 1) {
  if (!has_flag(flags, "--mock-data") && !has_flag(flags, "--data-path") && !has_flag(flags, "--data-args-path") &&
      !has_flag(flags, "--train-data-path") && !has_flag(flags, "--per-split-data-args-path"))
    flags.push_back("--mock-data");
  if (!has_flag(flags, "--micro-batch-size")) flags.insert(flags.end(), {"--micro-batch-size", "1"});
  if (!has_flag(flags, "--train-iters") && !has_flag(flags, "--train-samples"))
    flags.insert(flags.end(), {"--train-iters", "1"});
  if (!has_flag(flags, "--lr")) flags.insert(flags.end(), {"--lr", "0.0001"});
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr, world_size);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& a : v) {
    if (!s.empty()) s += ' ';
    s += a.find(' ') == std::string::npos && !a.empty() ? a : "'" + a + "'";
  }
  return s;
}

// `flags` with `flag`'s value replaced (or appended).
void set_flag(std::vector<std::string>& flags, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < flags.size(); ++i)
    if (flags[i] == flag) {
      flags[i + 1] = value;
      return;
    }
  flags.insert(flags.end(), {flag, value});
}

// A checkpoint's model, either format: the flags that describe it, parsed, and its state.
struct CheckpointModel {
  std::vector<std::string> flags;
  TrainArgs args;
  CheckpointState state;
};

// --tokenizer-model, when given, stands for the one the checkpoint records.
CheckpointModel checkpoint_model(const std::string& dir, int64_t iteration, const ParsedOptions& options) {
  CheckpointModel m;
  m.state = read_checkpoint_metadata(dir, iteration);
  const CheckpointLayout& l = m.state.layout;
  if (m.state.megatron_format) {
    m.flags = train_flags_from_megatron_args(m.state.args);
  } else {
    const std::string it_dir = iteration_dir(dir, iteration);
    m.flags = recorded_args(read_metadata(it_dir), it_dir);
  }
  if (options.given("--tokenizer-model"))
    set_flag(m.flags, "--tokenizer-model", options.get_string("--tokenizer-model"));
  m.args = model_args(m.flags, l.tensor_parallel * l.pipeline_parallel * l.data_parallel);
  // The saved padded vocabulary wins, as in Megatron (a converter may pad for another TP).
  if (l.padded_vocab_size > 0) m.args.model.padded_vocab_size = static_cast<int>(l.padded_vocab_size);
  return m;
}

// The state a Megatron-format checkpoint records (both of Megatron's formats).
void print_megatron_state(const std::string& it_dir, const CheckpointState& s, const ParsedOptions& options,
                          const std::string& format) {
  const CheckpointLayout& l = s.layout;
  std::printf("checkpoint %s\n", it_dir.c_str());
  std::printf("  iteration: %lld%s\n", static_cast<long long>(s.iteration),
              s.release ? " (release checkpoint: the model alone)"
              : options.given("--iteration") ? "" : " (latest)");
  std::printf("  format: %s\n", format.c_str());
  const int ep = s.args.value("expert_model_parallel_size", 1);
  std::printf("  layout: tensor-parallel %d, pipeline-parallel %d, data-parallel %d%s; padded vocabulary %lld\n",
              l.tensor_parallel, l.pipeline_parallel, l.data_parallel,
              ep > 1 ? (", expert-parallel " + std::to_string(ep)).c_str() : "",
              static_cast<long long>(l.padded_vocab_size));
  std::printf("  consumed samples: train %lld, valid %lld; scheduler steps %lld; optimizer steps %lld\n",
              static_cast<long long>(s.consumed_train_samples), static_cast<long long>(s.consumed_valid_samples),
              static_cast<long long>(s.scheduler_num_steps), static_cast<long long>(s.optimizer_steps));
  std::printf("  model flags: %s\n", join(train_flags_from_megatron_args(s.args)).c_str());
}

int run_inspect_megatron(const std::string& dir, int64_t iteration, const ParsedOptions& options) {
  const std::string it_dir = iteration_dir(dir, iteration);
  const CheckpointState s = read_megatron_metadata(dir, iteration);
  const std::vector<MegatronFileSummary> files = summarize_megatron_checkpoint(dir, iteration);
  char version[32];
  std::snprintf(version, sizeof version, "%g", files.front().checkpoint_version);
  print_megatron_state(it_dir, s, options,
                       std::string("Megatron-LM torch (") + kMegatronFile + " per rank), checkpoint_version " +
                           version);
  for (const MegatronFileSummary& f : files) {
    std::string keys;
    for (const std::string& k : f.top_level_keys) keys += (keys.empty() ? "" : ", ") + k;
    std::printf("%s: iteration %lld, %s names, optimizer: %s, %zu tensors\n", f.rel.c_str(),
                static_cast<long long>(f.iteration), f.names.c_str(), f.optimizer.c_str(), f.model.size());
    if (options.get_bool("--summary")) continue;  // one line per shard folder
    std::printf("  keys: %s\n", keys.c_str());
    for (const MegatronFileSummary::Entry& e : f.model)
      std::printf("  %-64s %-16s %s\n", e.key.c_str(), e.storage_type.c_str(), shape_str(e.shape).c_str());
  }
  return 0;
}

// Megatron's torch_dist: common.pt's state, then each global key of .metadata (every chunk read
// and checked).
int run_inspect_torch_dist(const std::string& dir, int64_t iteration, const ParsedOptions& options) {
  const std::string it_dir = iteration_dir(dir, iteration);
  const CheckpointState s = read_torch_dist_metadata(dir, iteration);
  const std::vector<std::string> tensors = summarize_torch_dist_checkpoint(dir, iteration);
  print_megatron_state(it_dir, s, options, "Megatron-LM torch_dist (common.pt, .metadata, __R_I.distcp)");
  if (options.get_bool("--summary")) return 0;
  for (const std::string& line : tensors) std::printf("  %s\n", line.c_str());
  return 0;
}

// The slice of a whole tensor that one shard holds.
std::vector<float> slice_of(const std::vector<float>& whole, const ParamShard& s) {
  std::vector<float> out(static_cast<size_t>(s.numel()));
  for (int64_t e = 0; e < s.numel(); ++e) out[static_cast<size_t>(e)] = whole[static_cast<size_t>(s.full_index(e))];
  return out;
}

// One (tp, pp) rank's --ckpt-format torch files, one per expert-parallel rank (Megatron's
// mp_rank_TT[_PPP]_EEE folders when ep > 1): each holds its own experts numbered from 0 and
// the replicas of every other parameter (megatron/training/checkpointing.py save_checkpoint:
// each expert-data-parallel rank 0 saves its model's state_dict).
void write_megatron_rank(const std::string& tmp_dir, MegatronFileSpec spec, const std::vector<ParamShard>& shards,
                         std::vector<std::vector<float>>& slices, int pp_size, int ep_size, int local_experts,
                         int first_layer) {
  for (int e = 0; e < ep_size; ++e) {
    std::vector<MegatronParam> params;
    for (size_t i = 0; i < shards.size(); ++i) {
      const int expert = megatron_expert_of(shards[i].spec.name);
      if (expert >= 0 && expert / local_experts != e) continue;
      params.push_back({shards[i].is_embedding_copy
                            ? "output_layer.weight"
                            : megatron_local_name(shards[i].spec.name, first_layer, e * local_experts),
                        Tensor(slices[i].data(), DType::F32, shards[i].shape, nullptr), shards[i].spec.weight_decay,
                        {}});
    }
    const std::string shard = megatron_shard_folder(spec.tp_rank, spec.pp_rank, pp_size, e, ep_size);
    fs::create_directories(fs::path(tmp_dir) / shard);
    write_megatron_file((fs::path(tmp_dir) / shard / kMegatronFile).string(), spec, params);
    fsync_directory((fs::path(tmp_dir) / shard).string());
  }
}

// The format of a checkpoint, as convert reports it.
const char* source_format(const std::string& dir, int64_t iteration) {
  if (is_megatron_checkpoint(dir, iteration)) return "Megatron-LM torch";
  if (is_torch_dist_checkpoint(dir, iteration)) return "Megatron-LM torch_dist";
  return "tessera";
}

// What convert writes: the format and the layout of the target.
struct ConvertTarget {
  std::string format;  // torch_dist, torch or tessera
  int tp = 1, pp = 1, ep = 1;
  bool megatron() const { return format == "torch" || format == "torch_dist"; }
};

// The target's format and layout from the flags (defaults: the source's), checked against the model.
ConvertTarget convert_target(const Command& c, const CheckpointModel& m) {
  const CheckpointLayout& from = m.state.layout;
  const GPTConfig& config = m.args.model;
  ConvertTarget to;
  to.format = c.options.get_string("--to");
  to.tp = static_cast<int>(c.options.get_opt_int("--target-tensor-parallel-size").value_or(from.tensor_parallel));
  to.pp = static_cast<int>(c.options.get_opt_int("--target-pipeline-parallel-size").value_or(from.pipeline_parallel));
  if (to.tp < 1 || to.pp < 1 || config.num_attention_heads % to.tp != 0 || config.padded_vocab_size % to.tp != 0 ||
      config.ffn_hidden_size % to.tp != 0 || config.num_layers % to.pp != 0)
    throw usage_error("--target-tensor-parallel-size " + std::to_string(to.tp) + " must divide the heads (" +
                          std::to_string(config.num_attention_heads) + "), the FFN size and the padded vocabulary (" +
                          std::to_string(config.padded_vocab_size) + "), and --target-pipeline-parallel-size " +
                          std::to_string(to.pp) + " the layers (" + std::to_string(config.num_layers) + ")",
                      "choose sizes that divide them");
  to.ep = static_cast<int>(c.options.get_opt_int("--target-expert-parallel-size")
                               .value_or(m.state.megatron_format ? m.state.args.value("expert_model_parallel_size", 1) : 1));
  if (to.ep < 1 || (to.ep > 1 && (to.format != "torch" || config.moe.num_experts % to.ep != 0)))
    throw usage_error("--target-expert-parallel-size " + std::to_string(to.ep) +
                          " needs --to torch (the other formats do not depend on it) and must divide the experts (" +
                          std::to_string(config.moe.num_experts) + ")",
                      "choose a size that divides --num-experts, or leave the flag out");
  if (c.options.given("--transformer-impl") && !to.megatron())
    throw usage_error("--transformer-impl picks the layer spec of Megatron-LM files; --to " + to.format + " has none",
                      "leave it out, or convert --to torch or torch_dist");
  return to;
}

// The Namespace a Megatron target records: the source's own (a Megatron source) or the one
// tessera's arguments give, with the target's layout and format.
json megatron_target_namespace(const Command& c, const CheckpointModel& m, const ConvertTarget& to) {
  json ns = m.state.megatron_format
                ? m.state.args
                : megatron_namespace(m.args, m.state.consumed_train_samples, m.state.consumed_valid_samples);
  if (c.options.given("--transformer-impl")) ns["transformer_impl"] = c.options.get_string("--transformer-impl");
  ns["tensor_model_parallel_size"] = to.tp;
  ns["pipeline_model_parallel_size"] = to.pp;
  // Expert parallelism is carved from data parallelism: the smallest world has DP = EP.
  ns["expert_model_parallel_size"] = to.ep;
  ns["data_parallel_size"] = to.ep;
  ns["world_size"] = to.tp * to.pp * to.ep;
  ns["padded_vocab_size"] = m.args.model.padded_vocab_size;
  ns["ckpt_format"] = to.format;
  ns["use_dist_ckpt"] = to.format == "torch_dist";
  return ns;
}

// Where a conversion's ranks put what they wrote, for the commit.
struct ConvertOutput {
  std::vector<CheckpointFile> files;  // tessera's shard files
  std::vector<json> records;          // torch_dist's storage records, per rank
};

// One tensor/pipeline rank (t, p) of the target, sliced from the whole model's weights.
void write_converted_rank(const std::string& tmp_dir, const ConvertTarget& to, const json& ns, const CheckpointModel& m,
                          const std::map<std::string, std::vector<float>>& weights, int p, int t, ConvertOutput& out) {
  const GPTConfig& config = m.args.model;
  ModelPartition part;
  part.tp_size = to.tp;
  part.tp_rank = t;
  part.chunks = pipeline_chunks(config.num_layers, PipelineSplit{to.pp, 1, -1, -1}, p);
  const std::vector<ParamShard> shards = shard_params(config, part);
  std::vector<std::vector<float>> slices;
  for (const ParamShard& s : shards) slices.push_back(slice_of(weights.at(s.spec.name), s));
  if (to.format == "torch") {
    MegatronFileSpec spec;
    spec.args = ns;
    spec.iteration = m.state.iteration;
    spec.last_stage = p == to.pp - 1;
    spec.tp_rank = t;
    spec.pp_rank = p;
    write_megatron_rank(tmp_dir, spec, shards, slices, to.pp, to.ep, config.moe.num_experts / to.ep,
                        part.chunks.front().first_layer);
    return;
  }
  std::vector<ShardedTensor> model;
  for (size_t i = 0; i < shards.size(); ++i)
    if (!shards[i].is_embedding_copy)
      model.push_back({shards[i].spec.name, Tensor(slices[i].data(), DType::F32, shards[i].shape, nullptr),
                       shards[i].spec.shape, shards[i].split_dim, shards[i].offset});
  if (to.format == "torch_dist") {
    TorchDistShard dist;
    dist.params = std::move(model);
    dist.tp_rank = t;
    dist.num_layers = config.num_layers;
    dist.num_experts = config.moe.num_experts;
    dist.numbered_layers = torch_dist_numbered_layers(ns);
    dist.swiglu = config.swiglu;
    dist.transformer_engine = megatron_uses_transformer_engine(ns);
    if (config.moe.enabled()) dist.moe_layers = config.moe.moe_layers;
    out.records.push_back(write_torch_dist_shard(tmp_dir, p * to.tp + t, dist));
    return;
  }
  const std::vector<CheckpointFile> written =
      write_checkpoint_shard(tmp_dir, checkpoint_shard_folder(t, p, to.pp), model, {});
  out.files.insert(out.files.end(), written.begin(), written.end());
}

// Makes the written folder the target's checkpoint (model only: no optimizer, scheduler or scaler).
void commit_conversion(const std::string& dst, const std::string& tmp_dir, const ConvertTarget& to, const json& ns,
                       const CheckpointModel& m, const ConvertOutput& out) {
  if (to.format == "torch_dist") {
    MegatronFileSpec spec;
    spec.args = ns;
    spec.iteration = m.state.iteration;
    write_torch_dist_index(tmp_dir, out.records, spec, {});
  }
  if (to.megatron()) return commit_checkpoint_folder(dst, tmp_dir, m.state.iteration);
  CheckpointState state = m.state;
  state.args = m.flags;
  state.scheduler = nullptr;
  state.grad_scaler = nullptr;
  state.optimizer_steps = 0;
  state.megatron_format = false;
  state.layout = {to.tp, to.pp, 1, 1, m.args.model.padded_vocab_size};
  commit_checkpoint_save(dst, tmp_dir, state, out.files);
}

int run_convert(const Command& c) {
  if (c.positional.size() != 2 || !c.options.given("--to"))
    throw usage_error("convert takes SRC DST --to torch_dist|torch|tessera",
                      "e.g. tessera ckpt convert megatron-ckpt tessera-ckpt --to tessera");
  const std::string src = c.positional[0], dst = c.positional[1];
  const int64_t iteration = choose_iteration(src, c.options);
  if (fs::exists(dst) && latest_checkpoint_iteration(dst))
    throw usage_error(dst + " already holds a checkpoint", "convert into a new folder");
  CheckpointModel m = checkpoint_model(src, iteration, c.options);
  const ConvertTarget to = convert_target(c, m);
  const std::map<std::string, std::vector<float>> weights = read_checkpoint_model(src, iteration, m.args.model);
  const json ns = to.megatron() ? megatron_target_namespace(c, m, to) : json();
  set_flag(m.flags, "--tensor-model-parallel-size", std::to_string(to.tp));
  set_flag(m.flags, "--pipeline-model-parallel-size", std::to_string(to.pp));

  const std::string tmp_dir = prepare_checkpoint_save(dst, m.state.iteration, ::getpid());
  ConvertOutput out;
  for (int p = 0; p < to.pp; ++p)
    for (int t = 0; t < to.tp; ++t) write_converted_rank(tmp_dir, to, ns, m, weights, p, t, out);
  commit_conversion(dst, tmp_dir, to, ns, m, out);

  const CheckpointLayout& from = m.state.layout;
  std::printf("converted %s (iteration %lld, %s format, TP=%d PP=%d) to %s (%s format, TP=%d PP=%d%s), model only\n",
              iteration_dir(src, iteration).c_str(), static_cast<long long>(m.state.iteration),
              source_format(src, iteration), from.tensor_parallel, from.pipeline_parallel, dst.c_str(),
              to.format == "tessera" ? "tessera" : ("Megatron-LM " + to.format).c_str(), to.tp, to.pp,
              to.ep > 1 ? (" EP=" + std::to_string(to.ep)).c_str() : "");
  std::printf("  resume with --no-load-optim (the optimizer starts fresh) or fine-tune with --finetune\n");
  return 0;
}

// ------------------------------------------------------------------------------------------

// The header lines of a tessera checkpoint: iteration, format, layout, counters, optimizer and
// the recorded arguments. False when the arguments cannot be read.
bool print_tessera_header(const std::string& it_dir, int64_t iteration, bool latest, const json& meta) {
  auto num = [&](const char* key) { return meta.contains(key) ? meta[key].dump() : std::string("?"); };
  std::printf("checkpoint %s\n", it_dir.c_str());
  std::printf("  iteration: %lld%s\n", static_cast<long long>(iteration), latest ? " (latest)" : "");
  std::printf("  format: %s, version %s\n", meta.value("format", std::string("?")).c_str(),
              num("format_version").c_str());
  if (meta.value("format_version", 1) >= 2)
    std::printf("  layout: tensor-parallel %s, pipeline-parallel %s, data-parallel %s (saved by data-parallel "
                "rank 0), virtual pipeline stages %s; padded vocabulary %s\n",
                num("tensor_model_parallel_size").c_str(), num("pipeline_model_parallel_size").c_str(),
                num("data_parallel_size").c_str(), num("virtual_pipeline_model_parallel_size").c_str(),
                num("padded_vocab_size").c_str());
  else
    std::printf("  layout: tensor-parallel %s, pipeline-parallel %s\n", num("tensor_model_parallel_size").c_str(),
                num("pipeline_model_parallel_size").c_str());
  std::printf("  consumed samples: train %s, valid %s; scheduler steps %s; optimizer steps %s\n",
              num("consumed_train_samples").c_str(), num("consumed_valid_samples").c_str(),
              num("scheduler_num_steps").c_str(), num("optimizer_steps").c_str());
  if (const json listed = meta.value("files", json::object()); listed.is_object())
    for (const auto& [rel, info] : listed.items())
      if (fs::path(rel).filename().string().rfind("optimizer", 0) == 0) {
        std::printf("  optimizer: %s\n", optimizer_description(meta).c_str());
        break;
      }
  try {
    std::printf("  arguments: %s\n", join(recorded_args(meta, it_dir)).c_str());
    return true;
  } catch (const Error& e) {
    std::printf("  arguments: ERROR %s\n", e.what());
    return false;
  }
}

// One listed file against its recorded size and sha256: "OK", "MISSING" or "MISMATCH", and
// the detail printed after its name.
std::pair<std::string, std::string> check_listed_file(const std::string& path, const json& info) {
  const bool listed = info.is_object() && info.contains("bytes") && info["bytes"].is_number_unsigned() &&
                      info.contains("sha256") && info["sha256"].is_string();
  if (!fs::exists(path)) return {"MISSING", ""};
  if (!listed) return {"MISMATCH", " (metadata.json records no size or sha256)"};
  const std::string bytes = read_file(path);
  const std::string sha = sha256_hex({reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()});
  const uint64_t want = info["bytes"].get<uint64_t>();
  if (bytes.size() != want)
    return {"MISMATCH",
            " (" + std::to_string(bytes.size()) + " bytes, metadata.json records " + std::to_string(want) + ")"};
  if (sha != info["sha256"].get<std::string>())
    return {"MISMATCH", " (sha256 " + sha.substr(0, 16) + "…, metadata.json records " +
                            info["sha256"].get<std::string>().substr(0, 16) + "…)"};
  return {"OK", " (" + std::to_string(want) + " bytes, sha256 " + sha.substr(0, 16) + "…)"};
}

// The "files:" section: every listed file checked, then the files metadata.json does not list
// (never loaded; reported only) and the recorded iteration. Counts into checked and failed;
// false on a metadata error.
bool print_file_checks(const std::string& it_dir, int64_t iteration, const json& meta, int& checked, int& failed) {
  bool ok = true;
  std::printf("files:\n");
  auto files = meta.find("files");
  if (files == meta.end() || !files->is_object()) {
    std::printf("  ERROR metadata.json lists no files\n");
    ok = false;
  } else {
    for (const auto& [rel, info] : files->items()) {
      ++checked;
      const auto [status, detail] = check_listed_file((fs::path(it_dir) / rel).string(), info);
      if (status != "OK") ++failed;
      std::printf("  %-8s %s%s\n", status.c_str(), rel.c_str(), detail.c_str());
    }
  }
  for (const auto& entry : fs::recursive_directory_iterator(it_dir)) {
    const std::string rel = fs::relative(entry.path(), it_dir).string();
    if (entry.is_regular_file() && rel != "metadata.json" && (files == meta.end() || !files->contains(rel)))
      std::printf("  %-8s %s (not in metadata.json; never loaded)\n", "UNLISTED", rel.c_str());
  }
  if (auto it = meta.find("iteration"); it == meta.end() || !it->is_number_integer() || it->get<int64_t>() != iteration) {
    std::printf("  ERROR metadata.json records iteration %s, the folder is iteration %lld\n",
                it == meta.end() ? "none" : it->dump().c_str(), static_cast<long long>(iteration));
    ok = false;
  }
  return ok;
}

// The tensors of one safetensors file, each with where its slice sits ("of [64, 32], dim 0
// from 32"). False when the file or a placement cannot be read.
bool print_tensors(const fs::path& file, const std::string& rel) {
  std::printf("tensors of %s:\n", rel.c_str());
  bool ok = true;
  try {
    safetensors::Reader r = safetensors::Reader::open(file.string());
    uint64_t total_bytes = 0, total_elems = 0;
    for (const auto& t : r.tensors()) {
      std::string where;
      if (auto m = r.metadata().find(t.name); m != r.metadata().end()) {
        if (auto place = parse_tensor_placement(m->second, t.shape)) {
          if (place->split_dim >= 0 && place->global_shape != t.shape)
            where = "of " + shape_str(place->global_shape) + ", dim " + std::to_string(place->split_dim) + " from " +
                    std::to_string(place->offset);
        } else {
          where = "(invalid placement)";
          ok = false;
        }
      }
      std::printf("  %-56s %-4s %-16s %12llu bytes  %s\n", t.name.c_str(), t.dtype_name.c_str(),
                  shape_str(t.shape).c_str(), static_cast<unsigned long long>(t.end - t.begin), where.c_str());
      total_bytes += t.end - t.begin;
      total_elems += t.numel;
    }
    std::printf("  %zu tensors, %llu elements, %llu bytes\n", r.tensors().size(),
                static_cast<unsigned long long>(total_elems), static_cast<unsigned long long>(total_bytes));
  } catch (const Error& e) {
    std::printf("  ERROR %s\n", e.what());
    ok = false;
  }
  return ok;
}

int run_inspect(const Command& c) {
  if (c.positional.size() != 1)
    throw usage_error("inspect takes one checkpoint folder", "e.g. tessera ckpt inspect checkpoints/gpt");
  const std::string dir = c.positional[0];
  const int64_t iteration = choose_iteration(dir, c.options);
  const std::string it_dir = iteration_dir(dir, iteration);
  if (!fs::is_directory(it_dir))
    throw runtime_error("checkpoint " + it_dir + " does not exist", "list " + dir + " for the saved iterations");
  if (is_megatron_checkpoint(dir, iteration)) return run_inspect_megatron(dir, iteration, c.options);
  if (is_torch_dist_checkpoint(dir, iteration)) return run_inspect_torch_dist(dir, iteration, c.options);
  const json meta = read_metadata(it_dir);
  const bool latest = !c.options.given("--iteration");
  if (c.options.get_bool("--summary")) return print_checkpoint_summary(it_dir, iteration, latest, meta);

  bool ok = print_tessera_header(it_dir, iteration, latest, meta);
  int failed = 0, checked = 0;
  ok = print_file_checks(it_dir, iteration, meta, checked, failed) && ok;
  std::vector<fs::path> tensor_files;
  for (const auto& entry : fs::recursive_directory_iterator(it_dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") tensor_files.push_back(entry.path());
  std::sort(tensor_files.begin(), tensor_files.end());
  for (const fs::path& file : tensor_files) ok = print_tensors(file, fs::relative(file, it_dir).string()) && ok;
  if (failed > 0 || !ok) {
    std::printf("checksums: %d of %d files failed\n", failed, checked);
    std::fprintf(stderr, "error: checkpoint %s failed its checks\n", it_dir.c_str());
    return 1;
  }
  std::printf("checksums: all %d files OK\n", checked);
  return 0;
}

int run_export_hf(const Command& c) {
  if (c.positional.size() != 2)
    throw usage_error("export-hf takes a checkpoint folder and an output folder",
                      "e.g. tessera ckpt export-hf checkpoints/gpt gpt2-hf");
  const std::string dir = c.positional[0], out = c.positional[1];
  const int64_t iteration = choose_iteration(dir, c.options);
  const std::string it_dir = iteration_dir(dir, iteration);
  const TrainArgs args = checkpoint_model(dir, iteration, c.options).args;
  check_hf_expressible(args.model);  // before reading any weights

  HFExportSpec spec;
  spec.model = args.model;
  // The tokenizer's own bos and eos (the end-of-document id is its eos).
  const std::unique_ptr<data::Tokenizer> tokenizer = data::build_tokenizer(args.tokenizer);
  spec.bos_token_id = tokenizer->bos().value_or(-1);
  spec.eos_token_id = tokenizer->eod();
  if (args.tokenizer.type == "GPT2BPETokenizer") {
    spec.tokenizer_files = {{"vocab.json", args.tokenizer.vocab_file}, {"merges.txt", args.tokenizer.merge_file}};
  } else if (args.tokenizer.type == "HuggingFaceTokenizer") {
    // The folder's tokenizer.json, and what AutoTokenizer reads beside it when present.
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      const fs::path src = fs::path(args.tokenizer.tokenizer_model) / name;
      if (fs::exists(src)) spec.tokenizer_files[name] = src.string();
    }
  }
  write_hf_model(out, spec, read_checkpoint_model(dir, iteration, args.model));
  std::string written = "config.json, model.safetensors";
  for (const auto& [name, src] : spec.tokenizer_files) written += ", " + name;
  std::printf("exported %s (iteration %lld) to %s: %s\n", it_dir.c_str(), static_cast<long long>(iteration),
              out.c_str(), written.c_str());
  if (spec.tokenizer_files.empty())
    std::printf("  no tokenizer files: the run used %s\n", args.tokenizer.type.c_str());
  if (args.model.padded_vocab_size != args.model.vocab_size)
    std::printf("  dropped %d padding rows of the vocabulary (%d -> %d)\n",
                args.model.padded_vocab_size - args.model.vocab_size, args.model.padded_vocab_size,
                args.model.vocab_size);
  return 0;
}

int run_import_hf(int argc, char** argv) {
  std::vector<std::string> pos;
  int i = 0;
  for (; i < argc && pos.size() < 2; ++i) {
    if (std::string(argv[i]).rfind("--", 0) == 0)
      throw usage_error("import-hf takes HF_DIR OUT first, then the train flags",
                        "e.g. tessera ckpt import-hf gpt2-hf checkpoints/gpt2 [--num-layers 12 ...]");
    pos.push_back(argv[i]);
  }
  if (pos.size() != 2)
    throw usage_error("import-hf takes a Hugging Face folder and an output folder",
                      "e.g. tessera ckpt import-hf gpt2-hf checkpoints/gpt2");
  const std::string hf_dir = pos[0], out = pos[1];
  std::vector<std::string> flags(argv + i, argv + argc);
  const bool derived = flags.empty();
  if (derived) flags = train_flags_from_hf_config(hf_dir);
  if (latest_checkpoint_iteration(out))
    throw usage_error(out + " already holds a checkpoint", "import into a new folder");
  const TrainArgs args = model_args(flags);
  std::map<std::string, std::vector<float>> weights = load_hf_model(hf_dir, args.model);

  std::vector<NamedTensor> model;
  int64_t params = 0;
  for (const ParamSpec& s : gpt_param_specs(args.model)) {
    std::vector<float>& v = weights.at(s.name);
    model.push_back({s.name, Tensor(v.data(), DType::F32, s.shape, nullptr)});
    params += static_cast<int64_t>(v.size());
  }
  CheckpointState state;
  state.iteration = 0;
  state.args = flags;
  state.layout.padded_vocab_size = args.model.padded_vocab_size;  // TP 1, PP 1: any layout loads it
  save_checkpoint(out, state, model, {});
  std::printf("imported %s into %s (iteration 0, model only, %lld parameters)\n", hf_dir.c_str(),
              iteration_dir(out, 0).c_str(), static_cast<long long>(params));
  std::printf("  model flags%s: %s\n", derived ? " (from config.json)" : "", join(flags).c_str());
  std::printf("  fine-tune with: tessera train <these flags and your training flags> --load %s --finetune\n",
              out.c_str());
  return 0;
}

}  // namespace

int run_ckpt(int argc, char** argv) {
  std::string action = argc > 0 ? argv[0] : "";
  if (action.empty() || action == "--help" || action == "-h") {
    print_help();
    return action.empty() ? 2 : 0;
  }
  if (action == "import-hf") {
    if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
      print_help();
      return 0;
    }
    return run_import_hf(argc - 1, argv + 1);
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      print_help();
      return 0;
    }
  }
  if (action == "inspect") return run_inspect(split_args(argc - 1, argv + 1));
  if (action == "export-hf") return run_export_hf(split_args(argc - 1, argv + 1));
  if (action == "convert") return run_convert(split_args(argc - 1, argv + 1));
  throw usage_error("unknown action '" + action + "' for tessera ckpt",
                    "actions: inspect, export-hf, import-hf, convert");
}

}  // namespace tessera::cli
