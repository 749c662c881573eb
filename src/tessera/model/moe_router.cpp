#include "tessera/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessera/core/error.h"

namespace tessera {
namespace {

// Softmax of x[0..n) in double (Megatron: torch.softmax(dtype=float32); double rounds less).
void softmax(double* out, const float* x, int n) {
  const double mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += out[i] = std::exp(double(x[i]) - mx);
  for (int i = 0; i < n; ++i) out[i] /= sum;
}

double logsumexp(const float* x, int n) {
  const double mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  return mx + std::log(sum);
}

// The k largest of v[0..n), largest first; ties to the lower index (torch.topk's CPU order).
void top_k(int32_t* index, const double* v, int n, int k) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(order.begin(), order.begin() + k, index);
}

// Each token's top-k experts and weights (topk_softmax_with_capacity before the capacity).
void choose_experts(MoERouting& r, const MoEConfig& c, const float* logits) {
  const int E = c.num_experts, k = c.topk;
  std::vector<double> v(E), p(k);
  for (int64_t n = 0; n < r.num_tokens; ++n) {
    const float* x = logits + n * E;
    int32_t* idx = &r.expert[n * k];
    if (c.pre_softmax) {
      softmax(v.data(), x, E);
      top_k(idx, v.data(), E, k);
      for (int j = 0; j < k; ++j) p[j] = v[idx[j]];
    } else {
      for (int e = 0; e < E; ++e) v[e] = x[e];
      top_k(idx, v.data(), E, k);
      std::vector<float> top(k);
      for (int j = 0; j < k; ++j) top[j] = x[idx[j]];
      softmax(p.data(), top.data(), k);
    }
    for (int j = 0; j < k; ++j) {
      r.weight[n * k + j] = static_cast<float>(p[j]);
      ++r.tokens_per_expert[idx[j]];
    }
  }
}

// The capacity mask of one routing group (Megatron's drop policies): for each expert, the
// `capacity` routes with the largest weights (probs) or the first in the group's token
// order (position); the others are dropped. Returns kept[r].
void apply_capacity(std::vector<uint8_t>& kept, const MoERouting& r, const MoEConfig& c,
                    const std::vector<int64_t>& group, int64_t capacity) {
  const int k = r.topk;
  std::vector<std::vector<int64_t>> routes(r.num_experts);  // in the group's token order
  for (int64_t n : group)
    for (int j = 0; j < k; ++j) routes[r.expert[n * k + j]].push_back(n * k + j);
  for (std::vector<int64_t>& list : routes) {
    if (c.drop_policy == MoEDropPolicy::Probs)
      std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) { return r.weight[a] > r.weight[b]; });
    for (size_t i = 0; i < list.size(); ++i) kept[list[i]] = static_cast<int64_t>(i) < capacity;
  }
}

// Lays the kept routes out expert by expert (groups in order, tokens in each group's
// order), padding each expert to capacity per group when asked.
void assign_rows(MoERouting& r, const MoEConfig& c, const std::vector<std::vector<int64_t>>& groups,
                 const std::vector<uint8_t>& kept, const std::vector<int64_t>& capacity) {
  const int k = r.topk;
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t first = static_cast<int64_t>(r.source.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t in_group = 0;
      for (int64_t n : groups[g])
        for (int j = 0; j < k; ++j) {
          const int64_t route = n * k + j;
          if (r.expert[route] != e || !kept[route]) continue;
          r.slot[route] = static_cast<int32_t>(r.source.size());
          r.source.push_back(static_cast<int32_t>(route));
          ++in_group;
        }
      if (c.pad_to_capacity)
        for (; in_group < capacity[g]; ++in_group) r.source.push_back(-1);
    }
    r.rows_per_expert[e] = static_cast<int64_t>(r.source.size()) - first;
  }
}

// switch_load_balancing_loss_func over all groups (counts summed over them, as Megatron
// all-reduces them over the tensor-parallel group) divided by its coefficient, and the
// z-loss's mean of logsumexp^2.
void losses(MoERouting& r, const MoEConfig& c, const float* logits) {
  const int E = r.num_experts;
  const double N = static_cast<double>(r.num_tokens);
  r.partition_tokens = r.num_tokens;
  r.partition_tokens_per_expert = r.tokens_per_expert;
  if (c.load_balancing == MoELoadBalancing::AuxLoss && c.aux_loss_coeff != 0) {
    std::vector<double> s(E);
    std::vector<double>& sums = r.prob_sums;
    sums.assign(E, 0.0);
    for (int64_t n = 0; n < r.num_tokens; ++n) {
      softmax(s.data(), logits + n * E, E);
      for (int e = 0; e < E; ++e) sums[e] += s[e];
    }
    double aux = 0;
    for (int e = 0; e < E; ++e) aux += sums[e] * static_cast<double>(r.tokens_per_expert[e]);
    r.load_balancing_loss = aux * E / (N * N * r.topk);
  }
  if (c.z_loss_coeff != 0) {
    double z = 0;
    for (int64_t n = 0; n < r.num_tokens; ++n) {
      const double l = logsumexp(logits + n * E, E);
      z += l * l;
    }
    r.z_loss = z / N;
  }
}

}  // namespace

int64_t expert_capacity(int64_t tokens, int topk, int experts, double factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * topk) / experts * factor));
}

std::vector<std::vector<int64_t>> megatron_token_groups(int64_t B, int64_t T, int groups) {
  TESSERA_CHECK(groups > 0 && T % groups == 0, "the sequence splits evenly into routing groups");
  std::vector<std::vector<int64_t>> out(groups);
  const int64_t Tl = T / groups;
  for (int g = 0; g < groups; ++g)
    for (int64_t t = g * Tl; t < (g + 1) * Tl; ++t)
      for (int64_t b = 0; b < B; ++b) out[g].push_back(b * T + t);
  return out;
}

MoERouting route_tokens(const MoEConfig& c, const float* logits, int64_t N,
                        const std::vector<std::vector<int64_t>>& groups) {
  MoERouting r;
  r.num_tokens = N;
  r.topk = c.topk;
  r.num_experts = c.num_experts;
  const int64_t routes = N * c.topk;
  r.expert.assign(routes, 0);
  r.slot.assign(routes, -1);
  r.weight.assign(routes, 0.0f);
  r.tokens_per_expert.assign(c.num_experts, 0);
  r.rows_per_expert.assign(c.num_experts, 0);
  r.source.reserve(routes);
  choose_experts(r, c, logits);
  std::vector<uint8_t> kept(routes, 1);
  std::vector<int64_t> capacity(groups.size(), 0);
  if (c.capacity_factor > 0)
    for (size_t g = 0; g < groups.size(); ++g) {
      capacity[g] = expert_capacity(static_cast<int64_t>(groups[g].size()), c.topk, c.num_experts, c.capacity_factor);
      apply_capacity(kept, r, c, groups[g], capacity[g]);
    }
  assign_rows(r, c, groups, kept, capacity);
  for (int64_t route = 0; route < routes; ++route)
    if (!kept[route]) r.weight[route] = 0.0f;
  losses(r, c, logits);
  return r;
}

void join_sequence_partition(MoERouting& r, const std::vector<int64_t>& counts, const std::vector<double>& prob_sums,
                             int parts) {
  const int E = r.num_experts;
  TESSERA_CHECK(static_cast<int>(counts.size()) == E && static_cast<int>(prob_sums.size()) == E,
                "one count and score sum per expert");
  r.partition_parts = parts;
  r.partition_tokens = r.num_tokens * parts;
  r.partition_tokens_per_expert = counts;
  const double N = static_cast<double>(r.partition_tokens);
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += prob_sums[e] * static_cast<double>(counts[e]);
  r.load_balancing_loss = aux * E / (N * N * r.topk);
}

void route_backward(float* dlogits, const MoEConfig& c, const MoERouting& r, const float* logits,
                    const float* dweights, double aux_scale) {
  const int E = r.num_experts, k = r.topk;
  const double N = static_cast<double>(r.num_tokens), Np = static_cast<double>(r.partition_tokens);
  // d(aux loss)/d(softmax score [n, e]) is the same for every token.
  std::vector<double> aux_grad(E, 0.0);
  if (c.load_balancing == MoELoadBalancing::AuxLoss && c.aux_loss_coeff != 0)
    for (int e = 0; e < E; ++e)
      aux_grad[e] = static_cast<double>(r.partition_tokens_per_expert[e]) * E * c.aux_loss_coeff / (Np * Np * k) *
                    aux_scale * r.partition_parts;
  std::vector<double> s(E), ds(E), p(k);
  for (int64_t n = 0; n < r.num_tokens; ++n) {
    const float* x = logits + n * E;
    const int32_t* idx = &r.expert[n * k];
    std::fill(ds.begin(), ds.end(), 0.0);
    double* d = ds.data();
    std::vector<double> grad(E, 0.0);
    // Through the weights; a dropped route's weight is 0 whatever its logit: no gradient.
    if (c.pre_softmax) {
      for (int j = 0; j < k; ++j)
        if (r.slot[n * k + j] >= 0) d[idx[j]] += dweights[n * k + j];
    } else {
      std::vector<float> top(k);
      for (int j = 0; j < k; ++j) top[j] = x[idx[j]];
      softmax(p.data(), top.data(), k);
      double dot = 0;
      for (int j = 0; j < k; ++j)
        if (r.slot[n * k + j] >= 0) dot += p[j] * dweights[n * k + j];
      for (int j = 0; j < k; ++j) {
        const double dp = r.slot[n * k + j] >= 0 ? dweights[n * k + j] : 0.0;
        grad[idx[j]] += p[j] * (dp - dot);
      }
    }
    // Through the full softmax: the pre-softmax weights and the aux loss.
    softmax(s.data(), x, E);
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += s[e] * (d[e] + aux_grad[e]);
    for (int e = 0; e < E; ++e) grad[e] += s[e] * (d[e] + aux_grad[e] - dot);
    if (c.z_loss_coeff != 0) {
      const double l = logsumexp(x, E);
      for (int e = 0; e < E; ++e) grad[e] += 2.0 * l * s[e] * c.z_loss_coeff / N * aux_scale;
    }
    for (int e = 0; e < E; ++e) dlogits[n * E + e] = static_cast<float>(grad[e]);
  }
}

}  // namespace tessera
