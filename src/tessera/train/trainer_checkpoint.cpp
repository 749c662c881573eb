// Trainer's checkpoint side: what a checkpoint holds of the training state, saving it and
// resuming from it (ckpt/checkpoint.h has the file layout). Saving is collective over the
// world: global rank 0 makes the temporary folder, data-parallel rank 0 of each (tp, pp)
// writes its shard (and every data-parallel rank its distributed-optimizer state), rank 0
// commits once every file is written. Loading reads, on every rank, the slices of whatever
// layout was saved.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/megatron_layer_spec.h"
#include "tessera/ckpt/megatron_distrib_optim.h"
#include "tessera/ckpt/megatron_optimizer_state.h"
#include "tessera/ckpt/torch_dist.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/log.h"
#include "tessera/device/device.h"
#include "tessera/train/megatron_args.h"
#include "tessera/train/trainer.h"

namespace tessera {

using json = nlohmann::json;
namespace {

// The schedule's settings as a checkpoint records them; a resume compares them with the flags
// (as OptimizerParamScheduler.load_state_dict in megatron/core/optimizer_param_scheduler.py).
nlohmann::json schedule_json(const LrScheduleConfig& c) {
  return {{"max_lr", c.max_lr},
          {"min_lr", c.min_lr},
          {"init_lr", c.init_lr},
          {"warmup_steps", c.warmup_steps},
          {"decay_steps", c.decay_steps},
          {"decay_style", static_cast<int>(c.decay_style)},
          {"wsd_decay_steps", c.wsd_decay_steps},
          {"wsd_style", static_cast<int>(c.wsd_style)},
          {"start_wd", c.start_wd},
          {"end_wd", c.end_wd},
          {"wd_incr_steps", c.wd_incr_steps},
          {"wd_style", static_cast<int>(c.wd_style)}};
}

LrScheduleConfig schedule_from_json(const nlohmann::json& j) {
  LrScheduleConfig c;
  c.max_lr = j.at("max_lr");
  c.min_lr = j.at("min_lr");
  c.init_lr = j.at("init_lr");
  c.warmup_steps = j.at("warmup_steps");
  c.decay_steps = j.at("decay_steps");
  c.decay_style = static_cast<LrDecayStyle>(j.at("decay_style").get<int>());
  c.wsd_decay_steps = j.at("wsd_decay_steps");
  c.wsd_style = static_cast<WsdDecayStyle>(j.at("wsd_style").get<int>());
  c.start_wd = j.at("start_wd");
  c.end_wd = j.at("end_wd");
  c.wd_incr_steps = j.at("wd_incr_steps");
  c.wd_style = static_cast<WdIncrStyle>(j.at("wd_style").get<int>());
  return c;
}

int rank_in(const Communicator* group) { return group ? group->rank() : 0; }

// Every setting where the checkpoint's schedule and the flags' differ, each with both values
// and the flags behind it ("" when they agree). Lengths are in samples, as the schedule counts.
std::string schedule_differences(const LrScheduleConfig& saved, const LrScheduleConfig& flags) {
  static const char* const kDecay[] = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};
  static const char* const kWsd[] = {"linear", "cosine", "exponential"};
  static const char* const kWdIncr[] = {"constant", "linear", "cosine"};
  std::string out;
  auto field = [&](const char* what, const char* flag, const std::string& a, const std::string& b, bool differs) {
    if (differs) out += std::string(out.empty() ? "" : "; ") + what + " " + a + " in the checkpoint, " + b + " from " + flag;
  };
  auto number = [&](const char* what, const char* flag, double a, double b) {
    char x[32], y[32];
    std::snprintf(x, sizeof x, "%.9g", a);
    std::snprintf(y, sizeof y, "%.9g", b);
    field(what, flag, x, y, a != b);
  };
  auto samples = [&](const char* what, const char* flag, int64_t a, int64_t b) {
    field(what, flag, std::to_string(a) + " samples", std::to_string(b) + " samples", a != b);
  };
  auto style = [&](const char* what, const char* flag, const char* const* names, auto a, auto b) {
    field(what, flag, names[static_cast<int>(a)], names[static_cast<int>(b)], a != b);
  };
  number("peak learning rate", "--lr", saved.max_lr, flags.max_lr);
  number("minimum learning rate", "--min-lr", saved.min_lr, flags.min_lr);
  number("warm-up initial learning rate", "--lr-warmup-init", saved.init_lr, flags.init_lr);
  samples("warm-up", "--lr-warmup-iters/-samples/-fraction", saved.warmup_steps, flags.warmup_steps);
  samples("decay", "--lr-decay-iters/-samples (default: the run's length, --train-iters x --global-batch-size)",
          saved.decay_steps, flags.decay_steps);
  style("decay style", "--lr-decay-style", kDecay, saved.decay_style, flags.decay_style);
  samples("WSD decay", "--lr-wsd-decay-iters/-samples", saved.wsd_decay_steps, flags.wsd_decay_steps);
  style("WSD decay style", "--lr-wsd-decay-style", kWsd, saved.wsd_style, flags.wsd_style);
  number("initial weight decay", "--start-weight-decay (or --weight-decay)", saved.start_wd, flags.start_wd);
  number("final weight decay", "--end-weight-decay (or --weight-decay)", saved.end_wd, flags.end_wd);
  samples("weight-decay increment", "--train-iters x --global-batch-size (or --train-samples)", saved.wd_incr_steps,
          flags.wd_incr_steps);
  style("weight-decay increment style", "--weight-decay-incr-style", kWdIncr, saved.wd_style, flags.wd_style);
  return out;
}

// This rank's parameters as checkpoint tensors: the global name, shape and where the slice
// sits. The tied embedding's copy on the last pipeline stage is left out of saves (it equals
// the first stage's word embedding); loads fill it from the word embedding, under its name.
std::vector<ShardedTensor> model_tensors(const GPTModel& model, bool with_embedding_copy) {
  std::vector<ShardedTensor> out;
  for (size_t i = 0; i < model.shards().size(); ++i) {
    const ParamShard& s = model.shards()[i];
    if (s.is_embedding_copy && !with_embedding_copy) continue;
    out.push_back({s.spec.name, model.params()[i], s.spec.shape, s.split_dim, s.offset});
  }
  return out;
}

// Optimizer state, "<kind>.<parameter name>", sharded as its parameter (the copy's state
// equals the word embedding's: same gradients, same updates).
std::vector<ShardedTensor> optimizer_tensors(const Optimizer& optimizer, const GPTModel& model,
                                             bool with_embedding_copy) {
  std::vector<ShardedTensor> out;
  for (const Optimizer::StateTensor& t : optimizer.state_tensors()) {
    const ParamShard& s = model.shards().at(t.param);
    if (s.is_embedding_copy && !with_embedding_copy) continue;
    out.push_back({std::string(t.kind) + "." + s.spec.name, t.tensor, s.spec.shape, s.split_dim, s.offset});
  }
  return out;
}

// Each parameter's optimizer state by kind (Adam's exp_avg and exp_avg_sq, or SGD's
// momentum_buffer), in the order of the model's shards.
using ParamStates = std::vector<std::vector<std::pair<std::string, Tensor>>>;

// This rank's parameters as Megatron's file holds them (--ckpt-format torch): chunk by chunk,
// each chunk's layers numbered from 0, the tied embedding's copy as output_layer.weight.
// `main`: each parameter's f32 main values, which the writer rounds into a 16-bit model (and
// keeps as fp32_from_fp16_params); `states` (empty: none) its optimizer state. Under expert
// parallelism the rank's experts are numbered from 0, as in its mp_rank_TT[_PPP]_EEE folder,
// and their state is the expert optimizer's.
std::vector<MegatronParam> megatron_params(const GPTModel& model, const std::vector<Tensor>& main,
                                           const ParamStates& states) {
  const std::vector<ModelChunk>& chunks = model.partition().chunks;
  const int first_expert = model.partition().local_experts(model.config().moe.num_experts).first;
  std::vector<MegatronParam> out;
  for (size_t i = 0; i < model.shards().size(); ++i) {
    const ParamShard& s = model.shards()[i];
    out.push_back({s.is_embedding_copy ? "output_layer.weight"
                                       : megatron_local_name(s.spec.name, chunks[s.chunk].first_layer, first_expert),
                   main.at(i), s.spec.weight_decay, states.empty() ? ParamStates::value_type{} : states.at(i), s.chunk,
                   model.partition().ep_size > 1 && s.is_expert});
  }
  // Megatron's optimizer takes the chunks' parameters in chunk order.
  std::stable_sort(out.begin(), out.end(), [](const MegatronParam& a, const MegatronParam& b) { return a.chunk < b.chunk; });
  return out;
}

// The replicated optimizer's state (parameter i is optimizer parameter i).
ParamStates optimizer_states(const Optimizer& optimizer, size_t params) {
  ParamStates out(params);
  for (const Optimizer::StateTensor& t : optimizer.state_tensors()) out.at(t.param).emplace_back(t.kind, t.tensor);
  return out;
}

// model_optim_rng.pt and, with the distributed optimizer's state, distrib_optim.pt (the dense
// optimizer's part only when with_dense: this rank is its data-parallel rank 0).
void write_megatron_shard(const std::string& tmp_dir, const std::string& shard, const MegatronFileSpec& spec,
                          const std::vector<MegatronParam>& params, bool with_dense) {
  const std::filesystem::path folder = std::filesystem::path(tmp_dir) / shard;
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw runtime_error("cannot create " + folder.string() + ": " + ec.message(), "check that --save is writable");
  write_megatron_file((folder / kMegatronFile).string(), spec, params);
  if (spec.distributed_optimizer && spec.with_optimizer)
    write_megatron_distrib_optim((folder / kDistribOptimFile).string(), spec, params, with_dense);
  fsync_directory(folder.string());
}

// The files every writer wrote, on every rank: fixed-size records (path, SHA-256, size)
// all-gathered over the world.
constexpr size_t kPathChars = 64, kFilesPerRank = 2;
constexpr size_t kRecordWords = (kPathChars + 64) / 8 + 1;  // path, hex digest, bytes
constexpr size_t kRankWords = 1 + kFilesPerRank * kRecordWords;

std::vector<CheckpointFile> gather_files(Communicator* world, const std::vector<CheckpointFile>& mine) {
  if (!world) return mine;
  TESSERA_CHECK(mine.size() <= kFilesPerRank, "too many checkpoint files per rank");
  std::vector<int64_t> record(kRankWords, 0);
  record[0] = static_cast<int64_t>(mine.size());
  for (size_t f = 0; f < mine.size(); ++f) {
    TESSERA_CHECK(mine[f].path.size() < kPathChars && mine[f].sha256.size() == 64, "checkpoint file record");
    char* p = reinterpret_cast<char*>(&record[1 + f * kRecordWords]);
    std::memcpy(p, mine[f].path.data(), mine[f].path.size());
    std::memcpy(p + kPathChars, mine[f].sha256.data(), 64);
    record[1 + f * kRecordWords + kRecordWords - 1] = static_cast<int64_t>(mine[f].bytes);
  }
  const int n = world->size();
  std::vector<int64_t> all(kRankWords * n);
  world->all_gather(Tensor(all.data(), DType::I64, {static_cast<int64_t>(all.size())}, nullptr),
                    Tensor(record.data(), DType::I64, {static_cast<int64_t>(kRankWords)}, nullptr));
  std::vector<CheckpointFile> files;
  for (int r = 0; r < n; ++r) {
    const int64_t* rec = &all[r * kRankWords];
    for (int64_t f = 0; f < rec[0]; ++f) {
      const char* p = reinterpret_cast<const char*>(&rec[1 + f * kRecordWords]);
      files.push_back({std::string(p, strnlen(p, kPathChars)), std::string(p + kPathChars, 64),
                       static_cast<uint64_t>(rec[1 + f * kRecordWords + kRecordWords - 1])});
    }
  }
  return files;
}

// Every rank's JSON value at every rank (torch_dist's storage records): the lengths, then the
// texts padded to the longest.
std::vector<json> gather_json(Communicator* world, const json& mine) {
  if (!world) return {mine};
  const std::string text = mine.dump();
  int64_t length = static_cast<int64_t>(text.size());
  const int n = world->size();
  std::vector<int64_t> lengths(n);
  world->all_gather(Tensor(lengths.data(), DType::I64, {n}, nullptr), Tensor(&length, DType::I64, {1}, nullptr));
  const int64_t words = (*std::max_element(lengths.begin(), lengths.end()) + 7) / 8;
  std::vector<int64_t> padded(static_cast<size_t>(words), 0), all(static_cast<size_t>(words * n));
  std::memcpy(padded.data(), text.data(), text.size());
  world->all_gather(Tensor(all.data(), DType::I64, {words * n}, nullptr),
                    Tensor(padded.data(), DType::I64, {words}, nullptr));
  std::vector<json> out;
  for (int r = 0; r < n; ++r)
    out.push_back(json::parse(std::string(reinterpret_cast<const char*>(&all[static_cast<size_t>(r * words)]),
                                          static_cast<size_t>(lengths[static_cast<size_t>(r)]))));
  return out;
}

// Megatron keeps the checkpoint's padded vocabulary: the flags must give the same one.
void check_padded_vocab(const TrainArgs& args, const CheckpointState& s, const std::string& dir) {
  const int64_t saved = s.layout.padded_vocab_size, run = args.model.padded_vocab_size;
  if (saved <= 0 || saved == run) return;
  const int tp = args.tensor_parallel_size, vocab = args.model.vocab_size;
  std::string hint;
  for (int64_t d = saved / tp; d >= 1 && hint.empty(); --d)
    if (saved % (d * tp) == 0 && padded_vocab_size(vocab, static_cast<int>(d), tp) == saved)
      hint = "pass --make-vocab-size-divisible-by " + std::to_string(d) + ", which pads the vocabulary to " +
             std::to_string(saved) + " with --tensor-model-parallel-size " + std::to_string(tp);
  if (hint.empty())
    hint = saved % tp != 0 ? "--tensor-model-parallel-size " + std::to_string(tp) + " does not divide the " +
                                 "checkpoint's padded vocabulary " + std::to_string(saved) + "; choose one that does"
                           : "the tokenizer's vocabulary (" + std::to_string(vocab) + ") does not fit the checkpoint's";
  throw usage_error("the checkpoint in " + dir + " has a padded vocabulary of " + std::to_string(saved) +
                        " rows, this run's is " + std::to_string(run) + " (the tokenizer's " +
                        std::to_string(vocab) + " padded to a multiple of --make-vocab-size-divisible-by " +
                        std::to_string(args.make_vocab_size_divisible_by) + " x --tensor-model-parallel-size " +
                        std::to_string(tp) + ")",
                    hint);
}

// The rng_state payload a torch_dist resume carries into its next save: Megatron's
// load_checkpoint restores the generators only at the saved TP/PP, not for a release
// checkpoint, with --finetune or with --no-load-rng.
std::optional<std::vector<uint8_t>> resumed_rng_state(const TrainArgs& a, const std::string& dir, int64_t iteration,
                                                      const CheckpointState& saved, int tp_rank, int pp_rank) {
  if (a.no_load_rng || a.finetune || saved.release || saved.layout.tensor_parallel != a.tensor_parallel_size ||
      saved.layout.pipeline_parallel != a.pipeline_parallel_size || !is_torch_dist_checkpoint(dir, iteration))
    return std::nullopt;
  return read_torch_dist_rng_state(dir, iteration,
                                   {tp_rank, a.tensor_parallel_size, pp_rank, a.pipeline_parallel_size});
}

// DIR without a trailing separator ("ckpt/iter_0000100/" -> "ckpt/iter_0000100").
std::filesystem::path folder_path(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

// DIR/iter_0000100 of a tessera or Megatron checkpoint (its name, or what it holds).
bool is_iteration_folder(const std::string& dir) {
  static const std::regex kName(R"(iter_\d{7})");
  std::error_code ec;
  return std::regex_match(folder_path(dir).filename().string(), kName) ||
         std::filesystem::exists(folder_path(dir) / "metadata.json", ec);
}

Error schedule_mismatch(const LrScheduleConfig& saved, const LrScheduleConfig& flags) {
  return usage_error("the learning-rate schedule of the flags differs from the checkpoint's: " +
                         schedule_differences(saved, flags),
                     "pass the checkpoint's values, or --use-checkpoint-opt_param-scheduler to take its schedule, or "
                     "--override-opt_param-scheduler to take the flags'");
}

// The first failed rank's error, from every rank's (world-gathered, fixed-size records: the
// message and the hint, cut to a record's length); nullopt when no rank failed.
struct RankError {
  int rank = 0;
  std::string what, hint;
};
std::optional<RankError> first_rank_error(Communicator& world, const std::optional<Error>& mine) {
  constexpr size_t kField = 1024;
  std::vector<char> record(2 * kField, 0);
  if (mine) {
    std::strncpy(record.data(), mine->what(), kField - 1);
    std::strncpy(record.data() + kField, mine->hint().c_str(), kField - 1);
  }
  std::vector<char> all(record.size() * world.size());
  world.all_gather(Tensor(all.data(), DType::U8, {static_cast<int64_t>(all.size())}, nullptr),
                   Tensor(record.data(), DType::U8, {static_cast<int64_t>(record.size())}, nullptr));
  for (int r = 0; r < world.size(); ++r) {
    const char* rec = all.data() + r * record.size();
    if (rec[0]) return RankError{r, std::string(rec, strnlen(rec, kField)), 
                                 std::string(rec + kField, strnlen(rec + kField, kField))};
  }
  return std::nullopt;
}

// Runs one step of a collective save or load on every rank (a rank with no part in it passes
// an empty step) and agrees over the world whether it failed anywhere, so that no rank waits
// in a collective that a failed one never reaches. A failure stops every rank with an Error:
// those whose step failed with their own, the others with "rank R could not <step>: " and
// rank R's message (the launcher may show any rank's last lines). `on_failure` (the clean-up)
// runs, and every rank waits for it, before any rank throws.
template <typename Step>
void on_every_rank(Communicator* world, const std::string& what_step, Step step,
                   const std::function<void()>& on_failure = {}) {
  std::optional<Error> failure;
  try {
    throw_if_save_interrupted();
    step();
  } catch (const Error& e) {
    failure = e;
  }
  if (world) {
    const std::optional<RankError> first = first_rank_error(*world, failure);
    if (first && !failure)
      failure = runtime_error("rank " + std::to_string(first->rank) + " could not " + what_step + ": " + first->what,
                              first->hint);
  }
  if (!failure) return;
  if (on_failure) on_failure();
  if (world) world->barrier();
  throw *failure;
}

}  // namespace

void report_stale_checkpoint_saves(const std::string& dir) {
  for (const StaleCheckpointSave& s : find_stale_checkpoint_saves(dir)) {
    if (s.removable) {
      abandon_checkpoint_save(s.path);
      log_warn("removed %s, a checkpoint save that never finished (%s)", s.path.c_str(), s.owner.c_str());
    } else {
      log_warn("%s is a checkpoint save that never finished or is still being written (%s); it is left in place: "
               "remove it once no run saves to %s", s.path.c_str(), s.owner.c_str(), dir.c_str());
    }
  }
}

// One host buffer over the whole buffer layout per name prefix, and a checkpoint tensor
// "<prefix><parameter name>" per parameter viewing its range.
Trainer::HostOptimizerState Trainer::host_whole_params(const std::vector<std::string>& prefixes,
                                                       bool with_embedding_copy) const {
  HostOptimizerState state;
  const GradBufferLayout& layout = model_.buffer_layout();
  state.buffers.assign(prefixes.size(), std::vector<float>(static_cast<size_t>(layout.numel), 0.0f));
  for (size_t i = 0; i < model_.shards().size(); ++i) {
    const ParamShard& s = model_.shards()[i];
    if (s.is_embedding_copy && !with_embedding_copy) continue;
    for (size_t k = 0; k < prefixes.size(); ++k)
      state.tensors.push_back({prefixes[k] + s.spec.name,
                               Tensor(state.buffers[k].data() + layout.params[i].start, DType::F32, s.shape, nullptr),
                               s.spec.shape, s.split_dim, s.offset});
  }
  return state;
}

namespace {

// The optimizer's state tensors of kind k, one per owned piece (its parameters), in order.
std::vector<Tensor> state_of_kind(const Optimizer& optimizer, size_t k) {
  const size_t kinds = optimizer.state_kinds().size();
  const std::vector<Optimizer::StateTensor> all = optimizer.state_tensors();
  std::vector<Tensor> out;
  for (size_t j = k; j < all.size(); j += kinds) out.push_back(all[j].tensor);
  return out;
}

// Checkpoint pieces under "<prefix><name>" (a 16-bit model's main parameters as "main.*").
std::vector<FlatPiece> prefixed(std::vector<FlatPiece> pieces, const std::string& prefix) {
  for (FlatPiece& p : pieces) p.slice.name = prefix + p.slice.name;
  return pieces;
}

}  // namespace

void Trainer::add_owned_piece(std::vector<FlatPiece>& out, const std::string& prefix, size_t piece,
                              const Tensor& values, bool with_embedding_copy) const {
  const DataParallelBuckets::OwnedPiece& owned = dp_buckets_->owned_pieces().at(piece);
  const ParamShard& s = model_.shards()[owned.param];
  if (s.is_embedding_copy && !with_embedding_copy) return;
  out.push_back({{prefix + s.spec.name, model_.params()[owned.param], s.spec.shape, s.split_dim, s.offset},
                 owned.begin, owned.end, values});
}

std::vector<FlatPiece> Trainer::owned_state_pieces(bool with_embedding_copy) const {
  std::vector<FlatPiece> out;
  for (const Optimizer::StateTensor& t : optimizer_->state_tensors())
    add_owned_piece(out, std::string(t.kind) + ".", t.param, t.tensor, with_embedding_copy);
  return out;
}

std::vector<ShardedTensor> Trainer::main_param_tensors(bool with_embedding_copy) const {
  std::vector<ShardedTensor> out;
  for (size_t i = 0; i < model_.shards().size(); ++i) {
    const ParamShard& s = model_.shards()[i];
    if (s.is_embedding_copy && !with_embedding_copy) continue;
    out.push_back({s.spec.name, optimizer_->main_param(i), s.spec.shape, s.split_dim, s.offset});
  }
  return out;
}

// Data-parallel replicas hold the same parameters: dp-cp rank 0 of each (tp, pp) saves them;
// under expert parallelism each EP rank holds other experts, which expert data-parallel rank 0
// of each (tp, ep, pp) saves.
bool Trainer::saves_param(const ParamShard& s) const {
  if (model_.partition().ep_size > 1 && s.is_expert) return rank_in(groups_.expert_dp) == 0;
  return rank_in(groups_.dp) == 0;
}

bool Trainer::saves_any_param() const {
  return std::any_of(model_.shards().begin(), model_.shards().end(),
                     [&](const ParamShard& s) { return saves_param(s); });
}

// The tensors of those parameters this rank saves; optimizer state is named "<kind>.<parameter>".
std::vector<ShardedTensor> Trainer::saved_here(std::vector<ShardedTensor> tensors, bool state) const {
  std::set<std::string> others;
  for (const ParamShard& s : model_.shards())
    if (!saves_param(s)) others.insert(s.spec.name);
  std::erase_if(tensors, [&](const ShardedTensor& t) {
    return others.count(state ? t.name.substr(t.name.find('.') + 1) : t.name) > 0;
  });
  return tensors;
}

std::vector<FlatPiece> Trainer::main_param_pieces(bool with_embedding_copy) const {
  if (!distributed_optimizer()) return whole_pieces(main_param_tensors(with_embedding_copy));
  std::vector<FlatPiece> out;
  for (size_t j = 0; j < dp_buckets_->owned_pieces().size(); ++j)
    add_owned_piece(out, "", j, optimizer_->main_param(j), with_embedding_copy);
  return out;
}

std::vector<FlatPiece> Trainer::owned_optimizer_pieces() const {
  // The first stage's word embedding holds the same state as its copy.
  std::vector<FlatPiece> out = owned_state_pieces(false);
  if (main_params_apart()) {
    const std::vector<FlatPiece> main = prefixed(main_param_pieces(false), "main.");
    out.insert(out.end(), main.begin(), main.end());
  }
  return out;
}

// The optimizer's main parameters, one per optimizer parameter (whole parameters, or the
// distributed optimizer's owned pieces in owned_pieces() order).
static std::vector<Tensor> main_params_of(const Optimizer& optimizer) {
  std::vector<Tensor> out;
  for (size_t j = 0; j < optimizer.params().size(); ++j) out.push_back(optimizer.main_param(j));
  return out;
}

Trainer::HostOptimizerState Trainer::host_distrib_optim_state(bool main_only) const {
  std::vector<std::string> prefixes{""};
  if (!main_only)
    for (const char* kind : optimizer_->state_kinds()) prefixes.push_back(std::string(kind) + ".");
  HostOptimizerState s = host_whole_params(prefixes, true);
  if (distributed_optimizer()) {
    dp_buckets_->gather_to_host(s.buffers[0].data(), main_params_of(*optimizer_));
    for (size_t k = 1; k < s.buffers.size(); ++k)
      dp_buckets_->gather_to_host(s.buffers[k].data(), state_of_kind(*optimizer_, k - 1));
    return s;
  }
  // One data-parallel rank: the optimizer's parameters are whole.
  const GradBufferLayout& layout = model_.buffer_layout();
  for (size_t i = 0; i < model_.shards().size(); ++i) {
    const Tensor m = optimizer_->main_param(i);
    copy_to_host(s.buffers[0].data() + layout.params[i].start, m.bytes(), m);
  }
  const std::vector<const char*> kinds = optimizer_->state_kinds();
  for (const Optimizer::StateTensor& t : main_only ? std::vector<Optimizer::StateTensor>{} : optimizer_->state_tensors()) {
    const size_t k = static_cast<size_t>(std::find(kinds.begin(), kinds.end(), t.kind) - kinds.begin());
    copy_to_host(s.buffers[1 + k].data() + layout.params[t.param].start, t.tensor.bytes(), t.tensor);
  }
  return s;
}

MegatronFileSpec Trainer::megatron_file_spec() const {
  const int tp = rank_in(groups_.tp), pp = rank_in(groups_.pp);
  MegatronFileSpec spec;
  spec.args = megatron_namespace(args_, consumed_samples_, consumed_valid_samples_);
  spec.iteration = iteration_;
  spec.model_dtype = args_.bf16 ? DType::BF16 : args_.fp16 ? DType::F16 : DType::F32;
  spec.with_optimizer = !args_.no_save_optim;
  spec.distributed_optimizer = args_.use_distributed_optimizer;
  // Megatron's buffer key: fp32 gradients unless fp16 without --accumulate-allreduce-grads-in-fp32.
  spec.grad_dtype =
      args_.fp16 && !spec.args.value("accumulate_allreduce_grads_in_fp32", false) ? DType::F16 : DType::F32;
  spec.optimizer = args_.optimizer;
  spec.lr = scheduler_.lr();
  spec.weight_decay = scheduler_.weight_decay();
  spec.optimizer_steps = optimizer_->steps_taken();
  if (loss_scaler_) spec.grad_scaler = loss_scaler_->state_dict();
  spec.scheduler = megatron_scheduler_state(args_.lr_schedule, scheduler_.num_steps());
  spec.last_stage = pp == args_.pipeline_parallel_size - 1;
  spec.with_rng = !args_.no_save_rng;
  spec.tp_rank = tp;
  spec.pp_rank = pp;
  return spec;
}

void Trainer::write_megatron_files(const std::string& tmp_dir, const HostOptimizerState& whole) const {
  const int tp = rank_in(groups_.tp), pp = rank_in(groups_.pp);
  const MegatronFileSpec spec = megatron_file_spec();
  // The main parameters: the optimizer's, or the distributed optimizer's gathered (`whole`
  // holds, per parameter, its main values and then its state kinds).
  std::vector<Tensor> main;
  const size_t kinds = whole.buffers.size();
  for (size_t i = 0; i < model_.shards().size(); ++i)
    main.push_back(spec.distributed_optimizer ? whole.tensors.at(i * kinds).tensor : optimizer_->main_param(i));
  ParamStates states;
  if (spec.with_optimizer && !spec.distributed_optimizer) states = optimizer_states(*optimizer_, main.size());
  if (spec.with_optimizer && spec.distributed_optimizer) {
    const std::vector<const char*> state_kinds = optimizer_->state_kinds();
    states.resize(main.size());
    for (size_t i = 0; i < main.size(); ++i)
      for (size_t k = 0; k < state_kinds.size(); ++k)
        states[i].emplace_back(state_kinds[k], whole.tensors.at(i * kinds + 1 + k).tensor);
  }
  const ModelPartition& part = model_.partition();
  write_megatron_shard(tmp_dir, megatron_shard_folder(tp, pp, args_.pipeline_parallel_size, part.ep_rank, part.ep_size),
                       spec, megatron_params(model_, main, states), rank_in(groups_.dp) == 0);
}

json Trainer::write_torch_dist_files(const std::string& tmp_dir) const {
  TorchDistShard shard;
  shard.tp_rank = rank_in(groups_.tp);
  shard.tp_size = args_.tensor_parallel_size;
  shard.pp_rank = rank_in(groups_.pp);
  shard.pp_size = args_.pipeline_parallel_size;
  shard.num_layers = args_.model.num_layers;
  shard.num_experts = args_.model.moe.num_experts;
  const nlohmann::json ns = megatron_file_spec().args;
  shard.numbered_layers = torch_dist_numbered_layers(ns);
  shard.swiglu = args_.model.swiglu;
  shard.transformer_engine = megatron_uses_transformer_engine(ns);
  if (args_.model.moe.enabled()) shard.moe_layers = args_.model.moe.moe_layers;
  const bool writes_model = saves_any_param();
  if (writes_model) shard.params = saved_here(model_tensors(model_, false), false);
  if (rank_in(groups_.dp) == 0) {  // not the other EP ranks, which add only their experts
    if (!args_.no_save_rng) shard.rng_state = torch_dist_rng_state();
    shard.rerun_state = [iteration = iteration_](const zip::StoredWriter::Append& append) {
      append_megatron_rerun_state_object(append, iteration);
    };
  }
  if (args_.no_save_optim) return write_torch_dist_shard(tmp_dir, rank_in(groups_.world), shard);
  if (args_.use_distributed_optimizer) {
    // Megatron's default layout for its distributed optimizer (fully_sharded_model_space, as
    // under --ckpt-fully-parallel-save): every DP rank its own ranges, the main parameters as
    // fp32_param whatever the model's dtype.
    shard.flat_state = distributed_optimizer() ? owned_state_pieces(false)
                                               : whole_pieces(optimizer_tensors(*optimizer_, model_, false));
    const std::vector<FlatPiece> main = prefixed(main_param_pieces(false), "fp32_param.");
    shard.flat_state.insert(shard.flat_state.end(), main.begin(), main.end());
  } else if (writes_model) {
    shard.state = saved_here(optimizer_tensors(*optimizer_, model_, false), true);
    if (main_params_apart()) shard.main = saved_here(main_param_tensors(false), false);
  }
  return write_torch_dist_shard(tmp_dir, rank_in(groups_.world), shard);
}

std::function<void(const zip::StoredWriter::Append&)> Trainer::torch_dist_rng_state() const {
  if (loaded_rng_state_)
    return [bytes = *loaded_rng_state_](const zip::StoredWriter::Append& append) { append(bytes); };
  return [seed = int64_t{args_.model.seed}, tp = rank_in(groups_.tp), pp = rank_in(groups_.pp)](
             const zip::StoredWriter::Append& append) { append_megatron_rng_state_object(append, seed, tp, pp); };
}

// Megatron's parameter groups of this rank's parameters: one per weight-decay class, in order of
// first appearance (megatron/core/optimizer/__init__.py _get_param_groups).
static std::vector<bool> group_weight_decay(const GPTModel& model) {
  std::vector<bool> out;
  for (const ParamShard& s : model.shards())
    if (std::find(out.begin(), out.end(), s.spec.weight_decay) == out.end()) out.push_back(s.spec.weight_decay);
  return out;
}

void Trainer::save_checkpoint(const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  // SIGINT/SIGTERM that would kill the process mid-save stop the save and remove its
  // temporary folder first (ckpt/checkpoint.h); --exit-signal-handler blocks them instead,
  // and they ask for an exit after the save.
  std::optional<SaveSignalScope> signals;
  if (!args_.exit_signal_handler) signals.emplace();
  auto stop_for_signal = [&](const char* what) {
    log_warn("%s during the save of iteration %lld%s; stopping", save_signal_name(signals->received()).c_str(),
             static_cast<long long>(iteration_), what);
    signals->reraise();
  };
  try {
    write_checkpoint(dir);
  } catch (const Error&) {
    if (signals && signals->received()) stop_for_signal(": stopped it, leaving no temporary folder");
    throw;
  }
  // Megatron's line after a save (save_checkpoint in megatron/training/checkpointing.py).
  print_rank_0("  successfully saved checkpoint from iteration %7lld to %s [ t 1/%d, p 1/%d ] (%.1f s)",
               static_cast<long long>(iteration_), dir.c_str(), args_.tensor_parallel_size,
               args_.pipeline_parallel_size,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // A signal after the last check: the checkpoint is whole.
  if (signals && signals->received()) stop_for_signal(", which finished first");
}

void Trainer::write_checkpoint(const std::string& dir) {
  // The parameters every rank saves are whole again (an overlapped gather may still run).
  if (dp_buckets_ && distributed_optimizer()) dp_buckets_->wait_all_params();
  Communicator* world = groups_.world && groups_.world->size() > 1 ? groups_.world : nullptr;
  const int rank = rank_in(world), tp = rank_in(groups_.tp), pp = rank_in(groups_.pp), dp = rank_in(groups_.dp);
  // Everyone writes into global rank 0's temporary folder, named by its process id.
  int64_t token = ::getpid();
  const std::string at = " the checkpoint of iteration " + std::to_string(iteration_) + " in " + dir;
  on_every_rank(world, "start" + at, [&] {
    if (rank == 0) prepare_checkpoint_save(dir, iteration_, token);
  });
  if (world) world->broadcast(Tensor(&token, DType::I64, {1}, nullptr), 0);
  const std::string tmp_dir = checkpoint_temp_dir(dir, iteration_, token);
  // Megatron's line before a save, with tessera's own format named as such where Megatron
  // names its --ckpt-format; printed once the temporary folder exists.
  print_rank_0("saving checkpoint at iteration %7lld to %s in %s format", static_cast<long long>(iteration_),
               dir.c_str(), args_.save_torch_dist ? "torch_dist" : args_.save_megatron_format ? "torch" : "tessera");
  // A failed step removes the temporary folder (rank 0 made it), so a full disk is not left full.
  auto abandon = [&] {
    if (rank == 0) abandon_checkpoint_save(tmp_dir);
  };
  const std::string write_failed = "write its part of" + at;
  const std::string commit_failed = "commit" + at;
  if (args_.save_torch_dist) {
    const bool every_dp_rank = distributed_optimizer() && !args_.no_save_optim;
    json mine = json::array();
    on_every_rank(world, write_failed, [&] {
      if (dp == 0 || every_dp_rank || saves_any_param()) mine = write_torch_dist_files(tmp_dir);
    }, abandon);
    const std::vector<json> records = gather_json(world, mine);
    on_every_rank(world, commit_failed, [&] {
      if (rank != 0) return;
      write_torch_dist_index(tmp_dir, records, megatron_file_spec(), group_weight_decay(model_));
      commit_checkpoint_folder(dir, tmp_dir, iteration_);
    }, abandon);
    return;
  }
  if (args_.save_megatron_format) {
    // The distributed optimizer's state whole, for DP rank 0 to write (Megatron gathers it
    // there too): collective over the DP group, so before any rank may fail alone.
    HostOptimizerState whole;
    if (args_.use_distributed_optimizer) whole = host_distrib_optim_state(args_.no_save_optim);
    // Megatron's files record no checksums: the writers finish, then rank 0 commits. Under
    // expert parallelism every expert-data-parallel rank 0 writes its EP rank's file, with the
    // replicated parameters too (megatron/training/checkpointing.py save_checkpoint).
    const bool writer = model_.partition().ep_size > 1 ? rank_in(groups_.expert_dp) == 0 : dp == 0;
    // The dense optimizer's data-parallel rank 0 writes its part of distrib_optim.pt: it must be a writer.
    TESSERA_CHECK(writer || dp != 0, "the dense data-parallel rank 0 writes a Megatron file");
    on_every_rank(world, write_failed, [&] {
      if (writer) write_megatron_files(tmp_dir, whole);
    }, abandon);
    on_every_rank(world, commit_failed, [&] {
      if (rank == 0) commit_checkpoint_folder(dir, tmp_dir, iteration_);
    }, abandon);
    return;
  }
  // Data-parallel replicas hold the same parameters: DP rank 0 of each (tp, pp) writes them,
  // and the replicated optimizer's state (the other EP ranks' experts into folders of their
  // own: saves_param). The distributed optimizer's state is written where it lives: every DP
  // rank writes its owned ranges, in parallel, into a file of its own.
  const bool sharded_optimizer = distributed_optimizer() && !args_.no_save_optim;
  const std::string shard = checkpoint_shard_folder(tp, pp, args_.pipeline_parallel_size);
  std::vector<CheckpointFile> mine;
  on_every_rank(world, write_failed, [&] {
    if (sharded_optimizer) mine.push_back(write_optimizer_dp_shard(tmp_dir, shard, dp, owned_optimizer_pieces()));
    if (!saves_any_param()) return;
    // The model file holds f32 values, staged one tensor at a time: a 16-bit model's main
    // parameters, or with the distributed optimizer (whose files hold those) its 16-bit
    // parameters widened.
    const bool whole_main_params = main_params_apart() && !distributed_optimizer();
    const std::vector<CheckpointFile> written = write_checkpoint_shard(
        tmp_dir, checkpoint_shard_folder(tp, pp, args_.pipeline_parallel_size, model_.partition().ep_rank),
        saved_here(whole_main_params ? main_param_tensors(false) : model_tensors(model_, false), false),
        args_.no_save_optim || sharded_optimizer ? std::vector<ShardedTensor>{}
                                                 : saved_here(optimizer_tensors(*optimizer_, model_, false), true),
        FloatStorage::WidenToF32);
    mine.insert(mine.end(), written.begin(), written.end());
  }, abandon);
  // After every file is written and fsynced: rank 0 records them, renames, updates the tracker.
  const std::vector<CheckpointFile> files = gather_files(world, mine);
  // Nobody runs ahead of a save that may yet fail.
  on_every_rank(world, commit_failed, [&] {
    if (rank != 0) return;
    CheckpointState state;
    state.iteration = iteration_;
    state.consumed_train_samples = consumed_samples_;
    state.consumed_valid_samples = consumed_valid_samples_;
    state.scheduler_num_steps = scheduler_.num_steps();
    state.optimizer_steps = optimizer_->steps_taken();
    state.scheduler = schedule_json(args_.lr_schedule);
    state.args = args_.command_line;
    if (loss_scaler_ && !args_.no_save_optim) state.grad_scaler = loss_scaler_->state_dict();
    if (sharded_optimizer) state.optimizer_dp_shards = args_.data_parallel_with_cp();
    state.main_params_in_optimizer = sharded_optimizer && main_params_apart();
    state.layout = {args_.tensor_parallel_size, args_.pipeline_parallel_size, args_.data_parallel_size,
                    args_.pipeline_split.virtual_stages, args_.model.padded_vocab_size};
    commit_checkpoint_save(dir, tmp_dir, state, files);
  }, abandon);
}

void Trainer::load_checkpoint(const std::string& dir) {
  const std::optional<int64_t> latest = latest_checkpoint_iteration(dir);
  if (!latest && is_iteration_folder(dir)) {
    const std::string parent = folder_path(dir).parent_path().string();
    throw usage_error("--load " + dir + " is the folder of one checkpoint; --load takes the folder that holds them",
                      "pass --load " + (parent.empty() ? std::string(".") : parent) +
                          " (it resumes the iteration its latest_checkpointed_iteration.txt names)");
  }
  if (!latest) {
    log_warn("could not find a checkpoint in --load %s (no latest_checkpointed_iteration.txt); starting from "
             "random initialisation", dir.c_str());
    return;
  }
  const bool load_optimizer = !args_.no_load_optim && !args_.finetune;
  Communicator* world = groups_.world && groups_.world->size() > 1 ? groups_.world : nullptr;
  // Every rank reads the slices it needs; a failure on any rank stops every rank, each with
  // an error (the ranks that failed with theirs).
  CheckpointState s;
  const std::string which = *latest == kReleaseIteration ? "release" : "iteration " + std::to_string(*latest);
  on_every_rank(world, "load the checkpoint of " + which + " in " + dir, [&] {
    const CheckpointState saved = read_checkpoint_metadata(dir, *latest);
    check_padded_vocab(args_, saved, dir);
    const bool with_optimizer = load_optimizer && !saved.release;
    // Every target is filled in place (the distributed optimizer's: its owned pieces), one
    // saved piece at a time. A 16-bit model's parameters are rounded from the files' f32
    // values, which fill its main parameters too.
    std::vector<FlatPiece> params = whole_pieces(model_tensors(model_, true));
    std::vector<FlatPiece> state =
        distributed_optimizer() ? owned_state_pieces(true) : whole_pieces(optimizer_tensors(*optimizer_, model_, true));
    const std::vector<FlatPiece> main = main_params_apart() ? main_param_pieces(true) : params;
    if (main_params_apart()) params.insert(params.end(), main.begin(), main.end());
    // A 16-bit run of the distributed optimizer saved its exact main parameters with the
    // optimizer state (its model.safetensors holds their rounding, which rounds to the same
    // 16-bit parameters): they replace the f32 values loaded from the model's files (the
    // optimizer's files are read second).
    if (saved.main_params_in_optimizer) {
      const std::vector<FlatPiece> exact = prefixed(main, "main.");
      state.insert(state.end(), exact.begin(), exact.end());
    }
    s = load_checkpoint_pieces(dir, *latest, params, state, with_optimizer, rank_in(groups_.tp),
                               args_.tensor_parallel_size);
    loaded_rng_state_ = resumed_rng_state(args_, dir, *latest, saved, rank_in(groups_.tp), rank_in(groups_.pp));
  });
  const char* format = s.release                                  ? " (Megatron-LM's release checkpoint)"
                       : is_torch_dist_checkpoint(dir, *latest) ? " (Megatron-LM's torch_dist format)"
                       : s.megatron_format                      ? " (Megatron-LM's torch format)"
                                                                  : "";
  print_rank_0(" loading checkpoint from %s at iteration %lld%s", dir.c_str(), static_cast<long long>(s.iteration),
               format);
  const CheckpointLayout& l = s.layout;
  if (l.tensor_parallel != args_.tensor_parallel_size || l.pipeline_parallel != args_.pipeline_parallel_size ||
      l.data_parallel != args_.data_parallel_size || l.virtual_stages != args_.pipeline_split.virtual_stages)
    print_rank_0(" > resharded: saved with TP=%d PP=%d DP=%d (virtual stages %d), loaded into TP=%d PP=%d DP=%d "
                 "(virtual stages %d)", l.tensor_parallel, l.pipeline_parallel, l.data_parallel, l.virtual_stages,
                 args_.tensor_parallel_size, args_.pipeline_parallel_size, args_.data_parallel_size,
                 args_.pipeline_split.virtual_stages);
  print_rank_0("  successfully loaded checkpoint from %s [ t 1/%d, p 1/%d ] at iteration %lld", dir.c_str(),
               args_.tensor_parallel_size, args_.pipeline_parallel_size, static_cast<long long>(s.iteration));
  if (args_.finetune) return;  // iteration 0, fresh optimizer and data position
  iteration_ = s.iteration;
  consumed_samples_ = s.consumed_train_samples;
  consumed_valid_samples_ = s.consumed_valid_samples;
  if (s.release) return;  // iteration 0: the optimizer, its schedule and the RNG start fresh
  if (load_optimizer) optimizer_->set_steps_taken(s.optimizer_steps);
  // The loss scaler travels with the optimizer state, as in Megatron.
  if (loss_scaler_ && load_optimizer) {
    if (!s.grad_scaler.is_null())
      loss_scaler_->load_state_dict(s.grad_scaler);
    else
      print_rank_0("WARNING: the checkpoint holds no loss-scaler state (it was saved without --fp16 or a "
                   "--loss-scale); the scaler starts from its flags");
  }
  if (s.scheduler.is_null()) {
    // A converted checkpoint records no schedule: the flags' schedule runs on.
  } else if (s.megatron_format) {
    if (args_.use_checkpoint_scheduler)
      scheduler_ = LrScheduler(schedule_from_megatron(s.scheduler, args_.lr_schedule));
    else if (!args_.override_scheduler && !same_megatron_schedule(s.scheduler, args_.lr_schedule))
      throw schedule_mismatch(schedule_from_megatron(s.scheduler, args_.lr_schedule), args_.lr_schedule);
  } else if (args_.use_checkpoint_scheduler) {
    scheduler_ = LrScheduler(schedule_from_json(s.scheduler));
  } else if (!args_.override_scheduler && s.scheduler != schedule_json(args_.lr_schedule)) {
    throw schedule_mismatch(schedule_from_json(s.scheduler), args_.lr_schedule);
  }
  scheduler_.set_num_steps(s.scheduler_num_steps);
}

}  // namespace tessera
