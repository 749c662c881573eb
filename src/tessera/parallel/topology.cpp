#include "tessera/parallel/topology.h"

#include "tessera/core/error.h"

namespace tessera {

namespace {
const char* kTpFlag = "--tensor-model-parallel-size";
const char* kPpFlag = "--pipeline-model-parallel-size";
const char* kCpFlag = "--context-parallel-size";
const char* kEpFlag = "--expert-model-parallel-size";

// The groups of a grid of four dimensions (first fastest) spanned by those flagged in
// `in_group`: members listed by their coordinates in the group's dimensions, groups by the
// others', first fastest (Megatron's generate_masked_orthogonal_rank_groups).
template <typename RankOf>
std::vector<std::vector<int>> grid_groups(const int (&sizes)[4], const bool (&in_group)[4], RankOf rank_of) {
  std::vector<int> group_dims, other_dims;
  for (int d = 0; d < 4; ++d) (in_group[d] ? group_dims : other_dims).push_back(d);
  auto count = [&](const std::vector<int>& dims) {
    int n = 1;
    for (int d : dims) n *= sizes[d];
    return n;
  };
  // Sets the coordinates of `dims` from index i, first dimension fastest.
  auto unflatten = [&](const std::vector<int>& dims, int i, int* coord) {
    for (int d : dims) {
      coord[d] = i % sizes[d];
      i /= sizes[d];
    }
  };
  std::vector<std::vector<int>> groups(count(other_dims));
  for (size_t g = 0; g < groups.size(); ++g) {
    int coord[4] = {0, 0, 0, 0};
    unflatten(other_dims, static_cast<int>(g), coord);
    for (int k = 0; k < count(group_dims); ++k) {
      unflatten(group_dims, k, coord);
      groups[g].push_back(rank_of(coord));
    }
  }
  return groups;
}
}  // namespace

Topology::Topology(int world_size, int rank, int tensor_parallel, int pipeline_parallel, int context_parallel,
                   int expert_parallel)
    : world_(world_size),
      rank_(rank),
      tp_(tensor_parallel),
      pp_(pipeline_parallel),
      cp_(context_parallel),
      dp_(0),
      ep_(expert_parallel) {
  if (world_ < 1) throw usage_error("the world size must be at least 1, got " + std::to_string(world_));
  if (tp_ < 1)
    throw usage_error(std::string(kTpFlag) + " must be at least 1, got " + std::to_string(tp_));
  if (pp_ < 1)
    throw usage_error(std::string(kPpFlag) + " must be at least 1, got " + std::to_string(pp_));
  if (cp_ < 1)
    throw usage_error(std::string(kCpFlag) + " must be at least 1, got " + std::to_string(cp_));
  const int model = tp_ * cp_ * pp_;
  if (world_ % model != 0)
    throw usage_error("the world size " + std::to_string(world_) + " is not divisible by " + kTpFlag + " (" +
                          std::to_string(tp_) + ") x " +
                          (cp_ > 1 ? std::string(kCpFlag) + " (" + std::to_string(cp_) + ") x " : std::string()) +
                          kPpFlag + " (" + std::to_string(pp_) + ") = " + std::to_string(model),
                      "the data-parallel size is world / (TP x CP x PP): start a multiple of " +
                          std::to_string(model) + " processes (--nproc_per_node x --nnodes), or change the parallel "
                          "sizes");
  if (rank_ < 0 || rank_ >= world_)
    throw usage_error("rank " + std::to_string(rank_) + " is outside the world of " + std::to_string(world_) +
                      " processes");
  dp_ = world_ / model;
  if (ep_ < 1) throw usage_error(std::string(kEpFlag) + " must be at least 1, got " + std::to_string(ep_));
  if ((cp_ * dp_) % ep_ != 0)
    throw usage_error(std::string(kEpFlag) + " (" + std::to_string(ep_) + ") does not divide the context x data "
                          "parallel size " + std::to_string(cp_ * dp_) + " (world " + std::to_string(world_) +
                          " / (TP " + std::to_string(tp_) + " x PP " + std::to_string(pp_) + "))",
                      "expert parallelism is carved out of context x data parallelism (Megatron's expert "
                      "RankGenerator): start a multiple of " + std::to_string(tp_ * pp_ * ep_) +
                          " processes, or choose an expert-parallel size that divides " + std::to_string(cp_ * dp_));
}

ExpertCoords Topology::expert_coords_of(int r) const {
  const RankCoords c = coords_of(r);
  const int cp_dp = c.cp + cp_ * c.dp;  // the index the expert grid splits into (ep, edp)
  return {c.tp, cp_dp % ep_, cp_dp / ep_, c.pp};
}

RankCoords Topology::coords_of(int r) const {
  TESSERA_CHECK(r >= 0 && r < world_, "Topology::coords_of: rank out of range");
  RankCoords c;
  c.tp = r % tp_;
  c.cp = (r / tp_) % cp_;
  c.dp = (r / (tp_ * cp_)) % dp_;
  c.pp = r / (tp_ * cp_ * dp_);
  return c;
}

int Topology::rank_of(const RankCoords& c) const {
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

std::vector<std::vector<int>> Topology::groups_over(bool tp, bool cp, bool dp, bool pp) const {
  return grid_groups({tp_, cp_, dp_, pp_}, {tp, cp, dp, pp},
                     [&](const int* c) { return rank_of(RankCoords{c[0], c[1], c[2], c[3]}); });
}

std::vector<std::vector<int>> Topology::expert_groups_over(bool tp, bool ep, bool edp, bool pp) const {
  return grid_groups({tp_, ep_, expert_dp_size(), pp_}, {tp, ep, edp, pp}, [&](const int* c) {
    return c[0] + tp_ * (c[1] + ep_ * (c[2] + expert_dp_size() * c[3]));
  });
}

std::vector<std::vector<int>> Topology::tp_groups() const { return groups_over(true, false, false, false); }
std::vector<std::vector<int>> Topology::cp_groups() const { return groups_over(false, true, false, false); }
std::vector<std::vector<int>> Topology::dp_groups() const { return groups_over(false, false, true, false); }
std::vector<std::vector<int>> Topology::dp_cp_groups() const { return groups_over(false, true, true, false); }
std::vector<std::vector<int>> Topology::pp_groups() const { return groups_over(false, false, false, true); }
std::vector<std::vector<int>> Topology::model_parallel_groups() const { return groups_over(true, false, false, true); }

std::vector<std::vector<int>> Topology::embedding_groups() const {
  std::vector<std::vector<int>> out;
  for (const auto& g : pp_groups()) out.push_back(g.size() > 1 ? std::vector<int>{g.front(), g.back()} : g);
  return out;
}

std::vector<std::vector<int>> Topology::position_embedding_groups() const {
  std::vector<std::vector<int>> out;
  for (const auto& g : pp_groups()) out.push_back({g.front()});
  return out;
}

std::vector<std::vector<int>> Topology::ep_groups() const { return expert_groups_over(false, true, false, false); }
std::vector<std::vector<int>> Topology::expert_dp_groups() const {
  return expert_groups_over(false, false, true, false);
}

std::vector<int> Topology::group_of(const std::vector<std::vector<int>>& groups, int r) {
  for (const auto& g : groups)
    for (int member : g)
      if (member == r) return g;
  return {};
}

void Topology::check_num_layers(int num_layers) const {
  if (num_layers < 1) throw usage_error("--num-layers must be at least 1, got " + std::to_string(num_layers));
  if (num_layers % pp_ != 0)
    throw usage_error("--num-layers (" + std::to_string(num_layers) + ") is not divisible by " + kPpFlag + " (" +
                          std::to_string(pp_) + ")",
                      "every pipeline stage holds the same number of layers: choose a pipeline size that divides "
                      "the number of layers");
}

std::string Topology::describe() const {
  const RankCoords c = coords();
  return "world " + std::to_string(world_) + " = TP " + std::to_string(tp_) + " x CP " + std::to_string(cp_) +
         " x DP " + std::to_string(dp_) + " x PP " + std::to_string(pp_) + " (order tp-cp-ep-dp-pp); rank " +
         std::to_string(rank_) + " is tp " + std::to_string(c.tp) + ", cp " + std::to_string(c.cp) + ", dp " +
         std::to_string(c.dp) + ", pp " + std::to_string(c.pp) +
         (ep_ > 1 ? " (EP " + std::to_string(ep_) + " x expert DP " + std::to_string(expert_dp_size()) + "; ep " +
                        std::to_string(ep_rank()) + ", expert dp " + std::to_string(expert_dp_rank()) + ")"
                  : std::string());
}

ParallelGroups create_parallel_groups(Communicator& world, const Topology& topology) {
  TESSERA_CHECK(world.size() == topology.world_size() && world.rank() == topology.rank(),
                "create_parallel_groups: the topology was built for rank " + std::to_string(topology.rank()) +
                    " of " + std::to_string(topology.world_size()) + ", the communicator is rank " +
                    std::to_string(world.rank()) + " of " + std::to_string(world.size()));
  ParallelGroups g;
  g.tp = world.split(topology.tp_groups(), "tp");
  g.cp = world.split(topology.cp_groups(), "cp");
  g.dp = world.split(topology.dp_groups(), "dp");
  g.dp_cp = world.split(topology.dp_cp_groups(), "dp_cp");
  g.pp = world.split(topology.pp_groups(), "pp");
  g.model_parallel = world.split(topology.model_parallel_groups(), "mp");
  g.embedding = world.split(topology.embedding_groups(), "embd");
  g.position_embedding = world.split(topology.position_embedding_groups(), "pos_embd");
  if (topology.ep_size() > 1) {
    g.ep = world.split(topology.ep_groups(), "ep");
    g.expert_dp = world.split(topology.expert_dp_groups(), "expert_dp");
  }
  // A rank's side of a Gloo pair can be connected before its peer's side has read the handshake; a rank
  // that leaves right after (a --dry-run) would close the socket under its peer. Nobody leaves until
  // every rank holds every group.
  world.barrier();
  return g;
}

}  // namespace tessera
