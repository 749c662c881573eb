#include "tessera/cli/ckpt_summary.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/core/error.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

std::string size_text(uint64_t bytes) {
  char b[32];
  if (bytes >= (uint64_t{1} << 30)) std::snprintf(b, sizeof b, "%.2f GiB", bytes / 1073741824.0);
  else if (bytes >= (uint64_t{1} << 20)) std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
  else std::snprintf(b, sizeof b, "%.1f KiB", bytes / 1024.0);
  return b;
}

// What one shard folder (mp_rank_*) holds.
struct Shard {
  uint64_t bytes = 0;
  int files = 0;
  size_t tensors = 0;       // model tensors
  uint64_t parameters = 0;  // elements of its model tensors (its slices)
};

// The model's tensors of one file: each name once with its whole (unsplit) size, so that a
// tensor every TP rank holds in full, or in slices, counts once.
void add_model_file(const safetensors::Reader& r, std::map<std::string, uint64_t>& whole_numel,
                    std::set<std::string>& dtypes, Shard& shard) {
  for (const auto& t : r.tensors()) {
    Shape global = t.shape;
    if (auto m = r.metadata().find(t.name); m != r.metadata().end())
      if (auto place = parse_tensor_placement(m->second, t.shape)) global = place->global_shape;
    whole_numel[t.name] = static_cast<uint64_t>(shape_numel(global));
    dtypes.insert(t.dtype_name);
    ++shard.tensors;
    shard.parameters += t.numel;
  }
}

}  // namespace

std::string optimizer_description(const nlohmann::json& meta) {
  const int shards = meta.value("optimizer_dp_shards", 0);
  const std::string loads = "loads at any DP, TP and PP, with or without --use-distributed-optimizer";
  if (shards > 0)
    return "distributed (--use-distributed-optimizer), sharded by data-parallel rank: each folder holds " +
           std::to_string(shards) + " files, " + optimizer_dp_shard_file(0) +
           (shards > 1 ? " to " + optimizer_dp_shard_file(shards - 1) : std::string()) +
           ", each a rank's owned ranges of the state" +
           (meta.value("main_params_in_optimizer", false) ? " and of the fp32 main parameters" : std::string()) +
           "; " + loads;
  // Older saves of the distributed optimizer gathered its shards into optimizer.safetensors.
  const nlohmann::json args = meta.value("args", nlohmann::json::array());
  const bool distributed =
      args.is_array() && std::find(args.begin(), args.end(), "--use-distributed-optimizer") != args.end();
  return distributed ? "distributed (--use-distributed-optimizer), shards gathered by parameter; " + loads
                     : "replicated; " + loads;
}

int print_checkpoint_summary(const std::string& it_dir, int64_t iteration, bool latest, const nlohmann::json& meta) {
  auto num = [&](const char* key) { return meta.contains(key) ? meta[key].dump() : std::string("?"); };
  std::map<std::string, Shard> shards;  // by folder
  std::map<std::string, uint64_t> whole_numel;
  std::set<std::string> dtypes;
  uint64_t model_bytes = 0, optimizer_bytes = 0, total_bytes = 0;
  int status = 0;
  for (const auto& entry : fs::recursive_directory_iterator(it_dir)) {
    if (!entry.is_regular_file()) continue;
    const fs::path rel = fs::relative(entry.path(), it_dir);
    Shard& shard = shards[rel.has_parent_path() ? rel.parent_path().string() : "(top level)"];
    const uint64_t bytes = entry.file_size();
    shard.bytes += bytes;
    ++shard.files;
    total_bytes += bytes;
    const std::string name = rel.filename().string();
    if (name == "optimizer.safetensors" || name.rfind("optimizer_dp_", 0) == 0) optimizer_bytes += bytes;
    if (rel.filename() != "model.safetensors") continue;
    model_bytes += bytes;
    try {
      add_model_file(safetensors::Reader::open(entry.path().string()), whole_numel, dtypes, shard);
    } catch (const Error& e) {
      std::printf("  ERROR %s\n", e.what());
      status = 1;
    }
  }
  uint64_t parameters = 0;
  for (const auto& [name, n] : whole_numel) parameters += n;
  std::string dtype_list;
  for (const std::string& d : dtypes) dtype_list += (dtype_list.empty() ? "" : ", ") + d;

  std::printf("checkpoint %s: iteration %lld%s, %s version %s\n", it_dir.c_str(), static_cast<long long>(iteration),
              latest ? " (latest)" : "", meta.value("format", std::string("?")).c_str(), num("format_version").c_str());
  std::printf("  layout: tensor-parallel %s, pipeline-parallel %s, data-parallel %s; padded vocabulary %s\n",
              num("tensor_model_parallel_size").c_str(), num("pipeline_model_parallel_size").c_str(),
              num("data_parallel_size").c_str(), num("padded_vocab_size").c_str());
  std::printf("  model: %llu parameters in %zu tensors (%s); consumed samples %s\n",
              static_cast<unsigned long long>(parameters), whole_numel.size(), dtype_list.c_str(),
              num("consumed_train_samples").c_str());
  if (optimizer_bytes > 0) std::printf("  optimizer: %s\n", optimizer_description(meta).c_str());
  std::printf("  size: %s (model %s, optimizer %s) in %d folders\n", size_text(total_bytes).c_str(),
              size_text(model_bytes).c_str(), size_text(optimizer_bytes).c_str(), static_cast<int>(shards.size()));
  for (const auto& [folder, s] : shards)
    std::printf("  %-20s %d files, %s; %zu model tensors, %llu parameters\n", folder.c_str(), s.files,
                size_text(s.bytes).c_str(), s.tensors, static_cast<unsigned long long>(s.parameters));
  std::printf("checksums not verified (`tessera ckpt inspect` without --summary verifies every file)\n");
  return status;
}

}  // namespace tessera::cli
