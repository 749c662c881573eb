// The MoE router (model/moe_router.h) against a re-implementation of Megatron's
// topk_softmax_with_capacity and switch_load_balancing_loss_func written the way Megatron
// writes them (dense [N, E] masks, megatron/core/transformer/moe/moe_utils.py), for both drop
// policies, padding and pre-softmax routing; its gradient against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tessera/model/moe_router.h"

using namespace tessera;

namespace {

std::vector<float> random_logits(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Megatron's routing of one group (its tokens in the group's order), as dense masks.
struct Dense {
  std::vector<double> probs;  // [N, E] after the capacity mask
  std::vector<uint8_t> map;   // [N, E]
  std::vector<int64_t> tokens_per_expert;
};

Dense megatron_routing(const MoEConfig& c, const std::vector<float>& logits, const std::vector<int64_t>& group) {
  const int E = c.num_experts, k = c.topk;
  const int64_t G = static_cast<int64_t>(group.size());
  Dense d{std::vector<double>(G * E, 0.0), std::vector<uint8_t>(G * E, 0), std::vector<int64_t>(E, 0)};
  for (int64_t i = 0; i < G; ++i) {
    const float* x = &logits[group[i] * E];
    std::vector<double> s(E);
    const double mx = *std::max_element(x, x + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += s[e] = std::exp(x[e] - mx);
    for (int e = 0; e < E; ++e) s[e] /= sum;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    const std::vector<double> key = c.pre_softmax ? s : std::vector<double>(x, x + E);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
    double top_sum = 0;
    for (int j = 0; j < k; ++j) top_sum += std::exp(x[order[j]] - mx);
    for (int j = 0; j < k; ++j) {
      const int e = order[j];
      d.probs[i * E + e] = c.pre_softmax ? s[e] : std::exp(x[e] - mx) / top_sum;
      d.map[i * E + e] = 1;
      ++d.tokens_per_expert[e];
    }
  }
  if (c.capacity_factor <= 0) return d;
  const int64_t capacity = static_cast<int64_t>(std::ceil(double(G * k) / E * c.capacity_factor));
  for (int e = 0; e < E; ++e) {
    // The capacity mask: the `capacity` largest gates (probs) or the first routed tokens (position).
    std::vector<int64_t> rows(G);
    std::iota(rows.begin(), rows.end(), 0);
    if (c.drop_policy == MoEDropPolicy::Probs)
      std::stable_sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) { return d.probs[a * E + e] > d.probs[b * E + e]; });
    else
      std::stable_partition(rows.begin(), rows.end(), [&](int64_t r) { return d.map[r * E + e] != 0; });
    for (int64_t i = capacity; i < G; ++i) {
      d.map[rows[i] * E + e] = 0;
      d.probs[rows[i] * E + e] = 0;
    }
  }
  return d;
}

void expect_same_routing(const MoEConfig& c, const std::vector<float>& logits, int64_t B, int64_t T, int groups) {
  const int64_t N = B * T;
  const auto token_groups = megatron_token_groups(B, T, groups);
  const MoERouting r = route_tokens(c, logits.data(), N, token_groups);
  const int E = c.num_experts, k = c.topk;
  std::vector<int64_t> counts(E, 0), rows(E, 0);
  double aux_sums = 0;
  for (const std::vector<int64_t>& g : token_groups) {
    const Dense d = megatron_routing(c, logits, g);
    for (int e = 0; e < E; ++e) counts[e] += d.tokens_per_expert[e];
    for (size_t i = 0; i < g.size(); ++i)
      for (int e = 0; e < E; ++e) {
        int found = -1;
        for (int j = 0; j < k; ++j)
          if (r.expert[g[i] * k + j] == e) found = j;
        const bool kept = found >= 0 && r.slot[g[i] * k + found] >= 0;
        EXPECT_EQ(kept, d.map[i * E + e] != 0) << "token " << g[i] << " expert " << e;
        if (kept) EXPECT_NEAR(r.weight[g[i] * k + found], d.probs[i * E + e], 1e-6);
        rows[e] += kept;
      }
  }
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(r.tokens_per_expert[e], counts[e]);
    if (!c.pad_to_capacity) EXPECT_EQ(r.rows_per_expert[e], rows[e]);
  }
  // The permuted rows: every kept route once, experts in order, padding only with pad_to_capacity.
  std::vector<int> seen(N * k, 0);
  int64_t m = 0;
  for (int e = 0; e < E; ++e)
    for (int64_t i = 0; i < r.rows_per_expert[e]; ++i, ++m) {
      const int32_t route = r.source[m];
      if (route < 0) {
        EXPECT_TRUE(c.pad_to_capacity);
        continue;
      }
      EXPECT_EQ(r.expert[route], e);
      EXPECT_EQ(r.slot[route], m);
      ++seen[route];
    }
  EXPECT_EQ(m, static_cast<int64_t>(r.source.size()));
  for (int64_t route = 0; route < N * k; ++route) EXPECT_EQ(seen[route], r.slot[route] >= 0 ? 1 : 0);
  if (c.pad_to_capacity)
    for (int e = 0; e < E; ++e)
      EXPECT_EQ(r.rows_per_expert[e], groups * expert_capacity(N / groups, k, E, c.capacity_factor));
  // The aux loss: counts summed over the groups, N the whole micro-batch.
  for (int64_t n = 0; n < N; ++n) {
    const float* x = &logits[n * E];
    const double mx = *std::max_element(x, x + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(x[e] - mx);
    for (int e = 0; e < E; ++e) aux_sums += std::exp(x[e] - mx) / sum * counts[e];
  }
  EXPECT_NEAR(r.load_balancing_loss, aux_sums * E / (double(N) * N * k), 1e-12);
}

MoEConfig config(int experts, int k) {
  MoEConfig c;
  c.num_experts = experts;
  c.topk = k;
  c.aux_loss_coeff = 0.01;
  return c;
}

}  // namespace

TEST(MoERouter, TopKWithoutCapacityIsMegatrons) {
  for (bool pre : {false, true}) {
    MoEConfig c = config(8, 2);
    c.pre_softmax = pre;
    expect_same_routing(c, random_logits(2 * 12 * 8, 1), 2, 12, 1);
  }
}

TEST(MoERouter, CapacityDropsAsMegatronForBothPoliciesPerGroup) {
  for (MoEDropPolicy policy : {MoEDropPolicy::Probs, MoEDropPolicy::Position})
    for (bool pad : {false, true})
      for (int groups : {1, 2}) {
        MoEConfig c = config(4, 2);
        c.capacity_factor = 0.75;  // tight: most experts drop some tokens
        c.drop_policy = policy;
        c.pad_to_capacity = pad;
        SCOPED_TRACE(std::string(policy == MoEDropPolicy::Probs ? "probs" : "position") + (pad ? " padded" : "") +
                     " groups " + std::to_string(groups));
        const std::vector<float> logits = random_logits(2 * 16 * 4, 2);
        expect_same_routing(c, logits, 2, 16, groups);
        const MoERouting r = route_tokens(c, logits.data(), 32, megatron_token_groups(2, 16, groups));
        EXPECT_TRUE(std::count(r.slot.begin(), r.slot.end(), -1) > 0) << "the capacity drops something";
      }
}

// route_backward is the gradient of sum_r weight_r * g_r + aux_scale * (aux + z) with respect to
// the logits, with the routing held fixed (finite differences small enough not to change it).
TEST(MoERouter, BackwardMatchesFiniteDifferences) {
  for (bool pre : {false, true}) {
    MoEConfig c = config(4, 2);
    c.pre_softmax = pre;
    c.z_loss_coeff = 0.001;
    const int64_t B = 1, T = 6, N = B * T, E = 4, k = 2;
    std::vector<float> logits = random_logits(N * E, 3);
    const std::vector<float> g = random_logits(N * k, 4);
    const double aux_scale = 0.5;
    auto objective = [&](const std::vector<float>& x) {
      const MoERouting r = route_tokens(c, x.data(), N, megatron_token_groups(B, T, 1));
      double f = 0;
      for (int64_t i = 0; i < N * k; ++i) f += double(r.weight[i]) * g[i];
      return f + aux_scale * (c.aux_loss_coeff * r.load_balancing_loss + c.z_loss_coeff * r.z_loss);
    };
    const MoERouting r = route_tokens(c, logits.data(), N, megatron_token_groups(B, T, 1));
    std::vector<float> grad(N * E);
    route_backward(grad.data(), c, r, logits.data(), g.data(), aux_scale);
    for (int64_t i = 0; i < N * E; ++i) {
      std::vector<float> plus = logits, minus = logits;
      const float h = 1e-3f;
      plus[i] += h, minus[i] -= h;
      const double fd = (objective(plus) - objective(minus)) / (double(plus[i]) - minus[i]);
      EXPECT_NEAR(grad[i], fd, 2e-4 + 2e-3 * std::fabs(fd)) << (pre ? "pre-softmax " : "") << "logit " << i;
    }
  }
}

TEST(MoERouter, CapacityIsMegatronsGetCapacity) {
  EXPECT_EQ(expert_capacity(32, 2, 4, 1.0), 16);
  EXPECT_EQ(expert_capacity(30, 2, 4, 1.0), 15);
  EXPECT_EQ(expert_capacity(10, 1, 4, 1.0), 3);  // ceil(2.5)
  EXPECT_EQ(expert_capacity(32, 2, 4, 0.75), 12);
}
