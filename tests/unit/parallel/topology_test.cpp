// Topology against Megatron's rank order (megatron/core/parallel_state.py's RankGenerator,
// order tp-cp-ep-dp-pp): world 16, TP 2, PP 2, so DP 4, group by group, coordinates,
// validation errors naming the flags, PP = 1 edge cases, and the communicators
// create_parallel_groups builds (in-process ranks as threads).
#include <gtest/gtest.h>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/core/error.h"
#include "tessera/parallel/topology.h"

using namespace tessera;
using Groups = std::vector<std::vector<int>>;

namespace {
template <typename F>
std::string usage_error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return std::string(e.what()) + "\n" + e.hint();
  }
  ADD_FAILURE() << "no tessera::Error thrown";
  return "";
}
}  // namespace

TEST(Topology, MegatronWorkedExampleWorld16Tp2Pp2) {
  Topology t(16, 5, 2, 2);
  EXPECT_EQ(t.dp_size(), 4);
  EXPECT_EQ(t.cp_size(), 1);
  EXPECT_EQ(t.tp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(t.dp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(t.pp_groups(), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(t.model_parallel_groups(), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  Groups singletons;
  for (int r = 0; r < 16; ++r) singletons.push_back({r});
  EXPECT_EQ(t.cp_groups(), singletons);
  EXPECT_EQ(t.embedding_groups(), t.pp_groups());  // [first, last] of two-stage pp groups
  EXPECT_EQ(t.position_embedding_groups(), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));

  // global_rank = tp + TP*(cp + CP*(dp + DP*pp)); ranks 0-7 are stage 0, 8-15 stage 1.
  for (int r = 0; r < 16; ++r) {
    RankCoords c = t.coords_of(r);
    EXPECT_EQ(c.tp, r % 2);
    EXPECT_EQ(c.dp, (r / 2) % 4);
    EXPECT_EQ(c.pp, r / 8);
    EXPECT_EQ(t.rank_of(c), r);
  }
  EXPECT_EQ(t.tp_rank(), 1);
  EXPECT_EQ(t.dp_rank(), 2);
  EXPECT_EQ(t.pp_rank(), 0);
  EXPECT_TRUE(t.is_first_stage());
  EXPECT_FALSE(t.is_last_stage());
  EXPECT_EQ(Topology::group_of(t.dp_groups(), 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_TRUE(Topology::group_of(t.position_embedding_groups(), 12).empty());
  EXPECT_EQ(t.describe(), "world 16 = TP 2 x CP 1 x DP 4 x PP 2 (order tp-cp-ep-dp-pp); rank 5 is tp 1, cp 0, dp 2, pp 0");
}

// Megatron's RankGenerator(tp=2, cp=2, dp=2, pp=2, order='tp-cp-ep-dp-pp').get_ranks(...),
// printed by megatron-core 0.10.0.
TEST(Topology, MegatronContextParallelGroupsWorld16Tp2Cp2Pp2) {
  Topology t(16, 6, 2, 2, 2);
  EXPECT_EQ(t.dp_size(), 2);
  EXPECT_EQ(t.cp_size(), 2);
  EXPECT_EQ(t.tp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(t.cp_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(t.dp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(t.dp_cp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(t.pp_groups(), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(t.model_parallel_groups(), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(t.coords(), (RankCoords{0, 1, 1, 0}));
  EXPECT_EQ(t.cp_rank(), 1);
  for (int r = 0; r < 16; ++r) EXPECT_EQ(t.rank_of(t.coords_of(r)), r);
  EXPECT_EQ(t.describe(), "world 16 = TP 2 x CP 2 x DP 2 x PP 2 (order tp-cp-ep-dp-pp); rank 6 is tp 0, cp 1, dp 1, pp 0");
  const std::string e = usage_error_of([] { Topology(12, 0, 2, 1, 4); });
  EXPECT_NE(e.find("--context-parallel-size (4)"), std::string::npos) << e;
}

TEST(Topology, DeeperPipelineAndSingleStage) {
  Topology t(8, 0, 1, 4);  // DP 2
  EXPECT_EQ(t.pp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(t.embedding_groups(), (Groups{{0, 6}, {1, 7}}));
  EXPECT_EQ(t.position_embedding_groups(), (Groups{{0}, {1}}));
  EXPECT_EQ(t.dp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));

  Topology flat(4, 3, 2, 1);  // PP 1: embedding groups are the (single-rank) pp groups
  EXPECT_EQ(flat.pp_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(flat.embedding_groups(), flat.pp_groups());
  EXPECT_EQ(flat.position_embedding_groups(), flat.pp_groups());
  EXPECT_TRUE(flat.is_first_stage() && flat.is_last_stage());
  EXPECT_EQ(flat.dp_groups(), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(flat.model_parallel_groups(), (Groups{{0, 1}, {2, 3}}));

  Topology one(1, 0, 1, 1);
  EXPECT_EQ(one.dp_size(), 1);
  EXPECT_EQ(one.tp_groups(), (Groups{{0}}));
}

TEST(Topology, ValidationErrorsNameTheFlagsAndSizes) {
  std::string e = usage_error_of([] { Topology(6, 0, 4, 1); });
  EXPECT_NE(e.find("world size 6 is not divisible by --tensor-model-parallel-size (4) x "
                   "--pipeline-model-parallel-size (1) = 4"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("multiple of 4"), std::string::npos) << e;
  e = usage_error_of([] { Topology(16, 0, 2, 3); });
  EXPECT_NE(e.find("(2) x --pipeline-model-parallel-size (3) = 6"), std::string::npos) << e;
  e = usage_error_of([] { Topology(8, 0, 0, 1); });
  EXPECT_NE(e.find("--tensor-model-parallel-size must be at least 1, got 0"), std::string::npos) << e;
  e = usage_error_of([] { Topology(8, 0, 1, -2); });
  EXPECT_NE(e.find("--pipeline-model-parallel-size must be at least 1, got -2"), std::string::npos) << e;
  e = usage_error_of([] { Topology(8, 8, 1, 1); });
  EXPECT_NE(e.find("rank 8 is outside the world of 8"), std::string::npos) << e;
  e = usage_error_of([] { Topology(8, 0, 2, 4).check_num_layers(6); });
  EXPECT_NE(e.find("--num-layers (6) is not divisible by --pipeline-model-parallel-size (4)"), std::string::npos)
      << e;
  Topology(8, 0, 2, 4).check_num_layers(24);
}

TEST(Topology, ParallelGroupsFromTheWorldCommunicator) {
  // world 8 = TP 2 x DP 2 x PP 2, ranks as threads.
  run_in_process_ranks(8, [](Communicator& world) {
    const int r = world.rank();
    Topology t(8, r, 2, 2);
    ParallelGroups g = create_parallel_groups(world, t);
    ASSERT_TRUE(g.tp && g.dp && g.pp && g.model_parallel && g.embedding);
    EXPECT_EQ(g.tp->world_ranks(), Topology::group_of(t.tp_groups(), r));
    EXPECT_EQ(g.dp->world_ranks(), Topology::group_of(t.dp_groups(), r));
    EXPECT_EQ(g.pp->world_ranks(), Topology::group_of(t.pp_groups(), r));
    EXPECT_EQ(g.model_parallel->world_ranks(), Topology::group_of(t.model_parallel_groups(), r));
    EXPECT_EQ(g.embedding->world_ranks(), Topology::group_of(t.embedding_groups(), r));
    EXPECT_EQ(g.position_embedding != nullptr, t.is_first_stage());
    EXPECT_EQ(g.tp->rank(), t.tp_rank());
    EXPECT_EQ(g.dp->rank(), t.dp_rank());
    EXPECT_EQ(g.pp->rank(), t.pp_rank());
    EXPECT_EQ(g.dp->group_name(), "dp");
    // Summing the world rank over the dp group gives the sum of its members.
    std::vector<int32_t> x(3, r);
    g.dp->all_reduce(Tensor(x.data(), DType::I32, {3}, nullptr), ReduceOp::Sum);
    int expected = 0;
    for (int m : g.dp->world_ranks()) expected += m;
    EXPECT_EQ(x[0], expected);
  });
}

// megatron-core 0.10.0's expert RankGenerator(tp=TP, ep=EP, dp=CP*DP/EP, pp=PP, cp=1,
// order='tp-cp-ep-dp-pp').get_ranks('ep') and get_ranks('dp'), printed by
// /opt/tessera/tools-venv (what parallel_state.initialize_model_parallel builds with
// expert_tensor_parallel_size = TP).
TEST(Topology, MegatronExpertGroups) {
  Topology a(8, 5, 2, 1, 1, 2);  // TP 2 x EP 2 x expert DP 2
  EXPECT_EQ(a.dp_size(), 4);
  EXPECT_EQ(a.expert_dp_size(), 2);
  EXPECT_EQ(a.ep_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(a.expert_dp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(a.expert_coords_of(5), (ExpertCoords{1, 0, 1, 0}));
  EXPECT_EQ(a.ep_rank(), 0);
  EXPECT_EQ(a.expert_dp_rank(), 1);
  EXPECT_EQ(a.describe(), "world 8 = TP 2 x CP 1 x DP 4 x PP 1 (order tp-cp-ep-dp-pp); rank 5 is tp 1, cp 0, dp 2, "
                          "pp 0 (EP 2 x expert DP 2; ep 0, expert dp 1)");

  Topology b(16, 6, 2, 2, 2, 2);  // TP 2 x CP 2 x DP 2 x PP 2, EP 2: expert DP = CP*DP/EP = 2
  EXPECT_EQ(b.ep_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(b.expert_dp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(b.dp_cp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));

  Topology c(8, 0, 1, 1, 2, 4);  // CP 2 x EP 4: the ep groups span CP and DP
  EXPECT_EQ(c.ep_groups(), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(c.expert_dp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));

  Topology d(4, 3, 1, 1, 1, 4);  // EP 4 = the whole world: expert DP 1
  EXPECT_EQ(d.ep_groups(), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(d.expert_dp_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(d.ep_rank(), 3);

  Topology e(4, 0, 1, 1);  // EP 1: expert DP is the dp-cp group
  EXPECT_EQ(e.ep_size(), 1);
  EXPECT_EQ(e.expert_dp_groups(), e.dp_cp_groups());

  const std::string err = usage_error_of([] { Topology(8, 0, 2, 1, 1, 3); });
  EXPECT_NE(err.find("--expert-model-parallel-size (3) does not divide the context x data parallel size 4"),
            std::string::npos)
      << err;
}

TEST(Topology, ExpertParallelGroupsFromTheWorldCommunicator) {
  run_in_process_ranks(8, [](Communicator& world) {
    const int r = world.rank();
    Topology t(8, r, 2, 1, 1, 2);
    ParallelGroups g = create_parallel_groups(world, t);
    ASSERT_TRUE(g.ep && g.expert_dp);
    EXPECT_EQ(g.ep->world_ranks(), Topology::group_of(t.ep_groups(), r));
    EXPECT_EQ(g.expert_dp->world_ranks(), Topology::group_of(t.expert_dp_groups(), r));
    EXPECT_EQ(g.ep->rank(), t.ep_rank());
    EXPECT_EQ(g.expert_dp->rank(), t.expert_dp_rank());
    EXPECT_EQ(&g.expert_dp_group(), g.expert_dp.get());
  });
}
