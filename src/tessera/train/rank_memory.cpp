#include "tessera/train/rank_memory.h"

#include <map>

#include "tessera/parallel/topology.h"
#include "tessera/train/trainer.h"

namespace tessera {

GPTMemoryEstimate estimate_rank_memory(const TrainArgs& args, int tp_rank, int pp_rank, const Device& device) {
  ModelPartition partition;
  partition.tp_size = args.tensor_parallel_size;
  partition.tp_rank = tp_rank;
  partition.sequence_parallel = args.sequence_parallel;
  partition.ep_size = args.model.moe.expert_parallel_size;  // every EP rank holds E / EP experts
  partition.cp_size = args.context_parallel_size;  // activations hold S/CP rows (CP ranks alike)
  partition.chunks = pipeline_chunks(args.model.num_layers, args.pipeline_split, pp_rank);
  const auto [act_slots, io_slots] = Trainer::pipeline_slots(args, pp_rank);
  return estimate_gpt_memory(args.model, static_cast<int>(args.micro_batch_size), partition, act_slots, io_slots,
                             grad_buffer_options(args, pp_rank), device);
}

std::vector<RankMemory> estimate_memory_per_rank(const TrainArgs& args, const Device& device) {
  const Topology topology(args.world_size, 0, args.tensor_parallel_size, args.pipeline_parallel_size,
                          args.context_parallel_size, args.model.moe.expert_parallel_size);
  std::map<std::pair<int, int>, GPTMemoryEstimate> by_coords;  // data-parallel replicas share one
  std::vector<RankMemory> out;
  for (int r = 0; r < args.world_size; ++r) {
    const RankCoords c = topology.coords_of(r);
    auto it = by_coords.find({c.tp, c.pp});
    if (it == by_coords.end()) it = by_coords.emplace(std::pair{c.tp, c.pp}, estimate_rank_memory(args, c.tp, c.pp, device)).first;
    out.push_back({r, c.tp, c.pp, it->second});
  }
  return out;
}

const RankMemory& largest_rank_memory(const std::vector<RankMemory>& ranks) {
  const RankMemory* best = &ranks.front();
  for (const RankMemory& r : ranks)
    if (r.estimate.total_bytes() > best->estimate.total_bytes()) best = &r;
  return *best;
}

}  // namespace tessera
