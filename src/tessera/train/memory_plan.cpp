#include "tessera/train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/data/dataset_config.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/train/rank_memory.h"

namespace tessera {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string gib(double bytes) {
  char buf[32];
  if (bytes < 1024.0 * kMiB) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / kMiB);
  else std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (kMiB * 1024.0));
  return buf;
}

}  // namespace

void print_theoretical_memory(const TrainArgs& args, const Device& device) {
  const std::vector<RankMemory> ranks = estimate_memory_per_rank(args, device);
  const RankMemory& largest = largest_rank_memory(ranks);
  const GPTMemoryEstimate& e = largest.estimate;
  char whose[96] = "per rank";
  if (ranks.size() > 1)
    std::snprintf(whose, sizeof whose, "rank %d (TP rank %d, PP rank %d), the largest of %zu ranks", largest.rank,
                  largest.tp_rank, largest.pp_rank, ranks.size());
  print_rank_0("Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB, total=%.2f MB "
               "(parameters %.2f, gradients %.2f, main parameters %.2f, optimizer %.2f; %s)",
               e.weight_and_optimizer_bytes() / kMiB, e.activation_bytes / kMiB, e.total_bytes() / kMiB,
               e.parameter_bytes / kMiB, e.gradient_bytes / kMiB, e.main_parameter_bytes / kMiB,
               e.optimizer_bytes / kMiB, whose);
  const MoEConfig& moe = args.model.moe;
  if (moe.enabled())
    print_rank_0("  MoE: %d of %d experts per expert-parallel rank (EP %d): %.2f M expert parameters on that rank; "
                 "dispatcher buffers %.2f MB of its activations",
                 moe.num_experts / moe.expert_parallel_size, moe.num_experts, moe.expert_parallel_size,
                 e.expert_parameters / 1e6, e.moe_dispatch_bytes / kMiB);
}

void check_node_memory(const TrainArgs& args, int first_rank, int local_ranks, const Device& device) {
  const std::vector<RankMemory> ranks = estimate_memory_per_rank(args, device);
  const MemoryInfo machine = device.memory_info();
  double need = 0;
  const int end = std::min<int>(first_rank + local_ranks, static_cast<int>(ranks.size()));
  for (int r = first_rank; r < end; ++r) need += static_cast<double>(ranks[r].estimate.total_bytes());
  const std::string what = "the " + std::to_string(end - first_rank) + " rank(s) on this node need " + gib(need) +
                           " (the theoretical memory of ranks " + std::to_string(first_rank) + "-" +
                           std::to_string(end - 1) + ")";
  if (need > static_cast<double>(machine.total_bytes))
    log_warn("--dry-run: %s, more than this machine's %s: training here would fail. Spread the model over more "
             "processes or nodes (--tensor-model-parallel-size, --pipeline-model-parallel-size), lower "
             "--micro-batch-size, recompute activations (--recompute-activations), or start fewer processes per "
             "node", what.c_str(), gib(static_cast<double>(machine.total_bytes)).c_str());
  else if (need > static_cast<double>(machine.free_bytes))
    log_warn("--dry-run: %s, more than the %s free now (of %s)", what.c_str(),
             gib(static_cast<double>(machine.free_bytes)).c_str(), gib(static_cast<double>(machine.total_bytes)).c_str());
  else
    print_rank_0("--dry-run: %s of %s free", what.c_str(), gib(static_cast<double>(machine.free_bytes)).c_str());
}

void check_data_files(const TrainArgs& args) {
  if (args.data.mock_data) return;
  const data::GPTDatasetConfig config =
      data::make_gpt_dataset_config(args.data, data::tokenizer_identity(args.tokenizer), args.eod);
  std::vector<const data::Blend*> blends;
  if (config.blend) blends.push_back(&*config.blend);
  if (config.blend_per_split)
    for (const std::optional<data::Blend>& b : *config.blend_per_split)
      if (b) blends.push_back(&*b);
  int checked = 0;
  for (const data::Blend* b : blends)
    for (const std::string& prefix : b->prefixes) {
      data::IndexedDataset dataset(prefix);  // opens and validates both files
      ++checked;
    }
  print_rank_0("--dry-run: %d dataset prefix(es) found, each with its .bin and .idx", checked);
}

}  // namespace tessera
