// The memory each rank of a run allocates, from the same model partition and pipeline slots
// `tessera train` builds its model with (model/memory_estimate.h). Ranks differ by their
// (tensor, pipeline) coordinates: a TP rank holds a slice of every layer, a pipeline stage
// only its layers (the first the embedding, the last the head); data-parallel replicas equal
// their model-parallel rank.
#pragma once

#include <vector>

#include "tessera/model/memory_estimate.h"
#include "tessera/train/arguments.h"

namespace tessera {

// The estimate of the rank at (tp_rank, pp_rank) of `args`'s layout, on `device`'s backend.
GPTMemoryEstimate estimate_rank_memory(const TrainArgs& args, int tp_rank, int pp_rank,
                                       const Device& device = cpu_device());

struct RankMemory {
  int rank = 0;  // global rank
  int tp_rank = 0, pp_rank = 0;
  GPTMemoryEstimate estimate;
};
// Every global rank's estimate, rank order, for a world of args.world_size processes.
std::vector<RankMemory> estimate_memory_per_rank(const TrainArgs& args, const Device& device = cpu_device());
// The rank that needs the most memory (the lowest such rank on a tie).
const RankMemory& largest_rank_memory(const std::vector<RankMemory>& ranks);

}  // namespace tessera
