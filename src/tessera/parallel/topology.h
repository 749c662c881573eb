// Topology: where each rank sits in the tensor-, context-, expert-, data- and pipeline-parallel
// grid, and the groups it belongs to; a value built once from the world size, the rank and the
// sizes, validated, and passed by reference (no global process-group state).
//
// Megatron's default order tp-cp-ep-dp-pp (RankGenerator in megatron/core/parallel_state.py),
// first token fastest, for the dense layers:
//   global_rank = tp + TP·(cp + CP·(dp + DP·pp)).
// The experts see a second grid over the same ranks (parallel_state.initialize_model_parallel's
// expert RankGenerator: expert tensor parallelism = TP, no CP, the expert data-parallel size
// EDP = CP·DP / EP), so expert parallelism is carved out of context x data parallelism:
//   global_rank = tp + TP·(ep + EP·(edp + EDP·pp)).
// World 8, TP 2, EP 2 gives DP 4, EDP 2 and
//   ep [0,2] [1,3] [4,6] [5,7]   expert_dp [0,4] [1,5] [2,6] [3,7]
// expert_dp holds the ranks that reduce the experts' gradients (Megatron's expert data-parallel
// group; with CP it spans CP too, as CP ranks hold the same experts).
// A group of kind X holds the ranks that differ only in the X coordinates, listed in
// increasing order of those coordinates (first fastest); the groups of a kind are listed by
// the remaining coordinates, first fastest. World 16, TP 2, PP 2 gives DP 4 and
//   tp [0,1] [2,3] ... [14,15]   dp [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]
//   pp [0,8] [1,9] ... [7,15]    model-parallel (tp-pp) [0,1,8,9] [2,3,10,11] ...
//   embedding (first and last stage of each pp group) [0,8] [1,9] ...
//   position embedding (first stage) [0] [1] ... [7]
// World 8, TP 2, CP 2 gives DP 2 and cp [0,2] [1,3] [4,6] [5,7], dp [0,4] [1,5] [2,6] [3,7],
// and the data-parallel group with context parallelism (dp-cp: gradients are reduced over it)
// [0,2,4,6] [1,3,5,7].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera {

struct RankCoords {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
  bool operator==(const RankCoords&) const = default;
};

// A rank's place in the experts' grid (tp and pp as in RankCoords).
struct ExpertCoords {
  int tp = 0;
  int ep = 0;
  int edp = 0;
  int pp = 0;
  bool operator==(const ExpertCoords&) const = default;
};

class Topology {
 public:
  // Throws tessera::Error (usage) naming the flags: sizes below 1, a world size that
  // --tensor-model-parallel-size × --context-parallel-size × --pipeline-model-parallel-size
  // does not divide, an --expert-model-parallel-size that CP × DP does not divide, a rank
  // outside the world.
  Topology(int world_size, int rank, int tensor_parallel, int pipeline_parallel, int context_parallel = 1,
           int expert_parallel = 1);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int tp_size() const { return tp_; }
  int cp_size() const { return cp_; }
  int ep_size() const { return ep_; }
  int expert_dp_size() const { return cp_ * dp_ / ep_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }

  RankCoords coords_of(int rank) const;
  int rank_of(const RankCoords& c) const;
  RankCoords coords() const { return coords_of(rank_); }
  int tp_rank() const { return coords().tp; }
  int cp_rank() const { return coords().cp; }
  int dp_rank() const { return coords().dp; }
  int pp_rank() const { return coords().pp; }
  ExpertCoords expert_coords_of(int rank) const;
  int ep_rank() const { return expert_coords_of(rank_).ep; }
  int expert_dp_rank() const { return expert_coords_of(rank_).edp; }
  bool is_first_stage() const { return pp_rank() == 0; }
  bool is_last_stage() const { return pp_rank() == pp_ - 1; }

  // Every group of a kind, in Megatron's order.
  std::vector<std::vector<int>> tp_groups() const;
  std::vector<std::vector<int>> cp_groups() const;
  std::vector<std::vector<int>> dp_groups() const;
  std::vector<std::vector<int>> dp_cp_groups() const;  // Megatron's data-parallel group with context parallelism
  std::vector<std::vector<int>> pp_groups() const;
  std::vector<std::vector<int>> model_parallel_groups() const;  // tp-pp
  std::vector<std::vector<int>> embedding_groups() const;
  std::vector<std::vector<int>> position_embedding_groups() const;
  std::vector<std::vector<int>> ep_groups() const;         // Megatron's expert-model-parallel group
  std::vector<std::vector<int>> expert_dp_groups() const;  // Megatron's expert data-parallel group

  // The group of a kind that holds this rank (empty when none does: position embedding on
  // later stages).
  static std::vector<int> group_of(const std::vector<std::vector<int>>& groups, int rank);

  // --num-layers must be divisible by the pipeline size (Megatron's rule when no uneven
  // first/last stage is configured); throws a usage Error naming both flags.
  void check_num_layers(int num_layers) const;

  // "world 16 = TP 2 x CP 1 x DP 4 x PP 2 (order tp-cp-ep-dp-pp); rank 5 is tp 1, cp 0, dp 2, pp 0",
  // with " (EP 2 x expert DP 2 ...; ep 1, expert dp 0)" added under expert parallelism.
  std::string describe() const;

 private:
  // The groups spanned by the dimensions flagged in `in_group` ({tp, cp, dp, pp}).
  std::vector<std::vector<int>> groups_over(bool tp, bool cp, bool dp, bool pp) const;
  // The same in the experts' grid ({tp, ep, edp, pp}).
  std::vector<std::vector<int>> expert_groups_over(bool tp, bool ep, bool edp, bool pp) const;

  int world_, rank_, tp_, pp_, cp_, dp_, ep_;
};

// This rank's communicators for every group kind, made from the world communicator by
// split (collective: every rank of the world calls it, in the same order). A member is null
// when this rank is in no group of that kind (position_embedding beyond the first stage).
// `ep` and `expert_dp` exist only under expert parallelism (EP > 1); with EP = 1 the ep groups
// are single ranks and expert_dp equals dp_cp, which expert_dp_group() returns.
struct ParallelGroups {
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> cp;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> dp_cp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> model_parallel;
  std::unique_ptr<Communicator> embedding;
  std::unique_ptr<Communicator> position_embedding;
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> expert_dp;

  Communicator& expert_dp_group() const { return expert_dp ? *expert_dp : *dp_cp; }
};
ParallelGroups create_parallel_groups(Communicator& world, const Topology& topology);

}  // namespace tessera
