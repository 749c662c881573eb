#include "tessera/model/moe_layer.h"

#include <cmath>
#include <numeric>

#include "tessera/comm/ordered_sum.h"
#include "tessera/core/error.h"
#include "tessera/device/device.h"
#include "tessera/model/moe_dispatcher.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera {
namespace {

constexpr ops::GradWrite kAssign = ops::GradWrite::Assign;
constexpr ops::GradWrite kAccumulate = ops::GradWrite::Accumulate;

// Row `slot` of a slab [slots, n] seen as a tensor shaped as `like` (f32, at most n elements).
Tensor piece(const Tensor& slab, int slot, const Tensor& like) {
  TESSERA_CHECK(like.dtype == DType::F32 && like.numel() <= slab.shape[1] && slot < slab.shape[0],
                "an expert's f32 gradient fits a row of the per-source pieces");
  return Tensor(slab.handle, slab.offset + static_cast<size_t>(slot * slab.shape[1]) * sizeof(float), DType::F32,
                like.shape, slab.device);
}

// The rows of the permuted buffer: N*k routes, fewer when experts drop tokens, E *
// capacity per routing group when padded to capacity.
int64_t permuted_rows(const MoEConfig& c, const std::vector<std::vector<int64_t>>& groups, int64_t N) {
  if (c.capacity_factor <= 0) return N * c.topk;
  int64_t capacity_rows = 0;
  for (const std::vector<int64_t>& g : groups)
    capacity_rows += c.num_experts * expert_capacity(static_cast<int64_t>(g.size()), c.topk, c.num_experts,
                                                     c.capacity_factor);
  return c.pad_to_capacity ? capacity_rows : std::min(capacity_rows, N * c.topk);
}

}  // namespace

MoEDims moe_dims(const GPTConfig& c, int64_t micro_batch, int64_t seq, int tp, bool sequence_parallel, int ep_size,
                 int ep_rank) {
  MoEDims d;
  d.N = micro_batch * seq;
  d.C = c.hidden_size;
  d.E = c.moe.num_experts;
  d.k = c.moe.topk;
  d.Fl = c.moe.ffn_hidden_size / tp;
  d.Fl2 = c.swiglu ? 2 * d.Fl : d.Fl;
  d.Sl = c.moe.shared_expert_size / tp;
  d.Sl2 = c.swiglu ? 2 * d.Sl : d.Sl;
  d.gate = c.moe.shared_expert_gate && d.Sl > 0;
  d.act = c.params_dtype;
  d.groups = megatron_token_groups(micro_batch, seq, sequence_parallel ? tp : 1);
  d.M = permuted_rows(c.moe, d.groups, d.N);
  d.ep = ep_size;
  d.El = d.E / ep_size;
  d.first_expert = d.El * ep_rank;
  d.Mx = d.M * ep_size;
  d.dispatcher = c.moe.dispatcher;
  return d;
}

void reserve_moe_acts(MoEActs& a, const MoEDims& d, const ReserveTensor& reserve) {
  reserve(a.slots, {d.N, d.k}, DType::I32);
  reserve(a.sources, {d.M}, DType::I32);
  reserve(a.weights, {d.N, d.k}, DType::F32);
  reserve(a.permuted, {d.Mx, d.C}, d.act);
  reserve(a.fc1, {d.Mx, d.Fl2}, d.act);
  reserve(a.act, {d.Mx, d.Fl}, d.act);
  reserve(a.expert_out, {d.Mx, d.C}, d.act);
  if (d.ep > 1 && d.dispatcher == MoEDispatcher::AllToAll) {
    reserve(a.local_out, {d.M, d.C}, d.act);
    reserve(a.sort_map, {d.Mx}, DType::I32);
    reserve(a.unsort_map, {d.Mx}, DType::I32);
  } else if (d.ep > 1) {
    reserve(a.expert_sources, {d.Mx}, DType::I32);
    reserve(a.gathered_slots, {d.ep * d.N, d.k}, DType::I32);
    reserve(a.gathered_weights, {d.ep * d.N, d.k}, DType::F32);
  }
  if (d.Sl > 0) {
    reserve(a.shared_fc1, {d.N, d.Sl2}, d.act);
    reserve(a.shared_act, {d.N, d.Sl}, d.act);
    if (d.gate) reserve(a.shared_out, {d.N, d.C}, d.act);
  }
  if (d.gate) reserve(a.gate_weights, {d.N}, DType::F32);
  a.logits.resize(static_cast<size_t>(d.N * d.E));
  if (d.gate) a.gate_logits.resize(static_cast<size_t>(d.N));
}

void reserve_moe_workspace(MoEWorkspace& ws, const MoEDims& d, const ReserveTensor& reserve) {
  reserve(ws.logits, {d.N, d.E}, d.act);
  reserve(ws.d_logits, {d.N, d.E}, d.act);
  reserve(ws.d_weights, {d.N, d.k}, DType::F32);
  reserve(ws.d_permuted, {d.Mx, d.C}, d.act);
  reserve(ws.d_fc1, {d.Mx, d.Fl2}, d.act);
  reserve(ws.d_act, {d.Mx, d.Fl}, d.act);
  reserve(ws.d_expert_out, {d.Mx, d.C}, d.act);
  if (d.ep > 1 && d.dispatcher == MoEDispatcher::AllToAll) {
    reserve(ws.local, {d.M, d.C}, d.act);
    reserve(ws.recv, {d.Mx, d.C}, d.act);
  } else if (d.ep > 1) {
    reserve(ws.gathered, {d.ep * d.N, d.C}, d.act);
    reserve(ws.d_gathered_weights, {d.ep * d.N, d.k}, DType::F32);
    reserve(ws.scattered, {d.N, d.C}, d.act);
    if (d.act != DType::F32) {
      reserve(ws.gathered_f32, {d.ep * d.N * d.C}, DType::F32);
      reserve(ws.scattered_f32, {d.N * d.C}, DType::F32);
    }
  }
  if (d.Sl > 0) {
    reserve(ws.shared_tmp, {d.N, d.C}, d.act);
    reserve(ws.d_shared_fc1, {d.N, d.Sl2}, d.act);
    reserve(ws.d_shared_act, {d.N, d.Sl}, d.act);
  }
  if (d.per_source_runs)
    reserve(ws.source_pieces, {CanonicalSumStack::slots_for(static_cast<int>(d.ep)), d.Fl2 * d.C}, DType::F32);
  if (d.gate) {
    reserve(ws.gate_logits, {d.N, 1}, d.act);
    reserve(ws.d_gate_logits, {d.N, 1}, d.act);
    reserve(ws.d_gate, {d.N}, DType::F32);
    reserve(ws.identity, {d.N}, DType::I32);
  }
  ws.host_d_logits.resize(static_cast<size_t>(d.N * d.E));
  ws.host_d_weights.resize(static_cast<size_t>(d.N * d.k));
}

void init_moe_workspace(MoEWorkspace& ws, const MoEDims& d) {
  if (ws.identity.empty()) return;
  std::vector<int32_t> identity(static_cast<size_t>(d.N));
  std::iota(identity.begin(), identity.end(), 0);
  copy_from_host(ws.identity, identity.data(), identity.size() * sizeof(int32_t));
}

MoELayer::MoELayer(const GPTConfig& config, Device& device, MoEDims dims, TensorParallelRegion& tp, Communicator* ep,
                   Communicator* cp)
    : config_(config),
      device_(device),
      d_(std::move(dims)),
      tp_(tp),
      cp_(cp && cp->size() > 1 ? cp : nullptr),
      dispatcher_(make_moe_dispatcher(d_, ep)) {}

// The aux loss's token counts and score sums over the context-parallel ranks (Megatron
// all-reduces the counts over TP x CP; the score sums only serve the logged value, which
// Megatron sums over the same group). The sums travel as 64-bit patterns and are added in
// rank order, so every CP rank logs the same bits.
void MoELayer::join_context_parallel_partition(MoERouting& r) {
  if (config_.moe.load_balancing != MoELoadBalancing::AuxLoss || config_.moe.aux_loss_coeff == 0) return;
  const int E = r.num_experts, parts = cp_->size();
  std::vector<int64_t> counts = r.tokens_per_expert;
  cp_->all_reduce(Tensor(counts.data(), DType::I64, {E}, nullptr), ReduceOp::Sum);
  std::vector<double> mine = r.prob_sums, all(static_cast<size_t>(parts) * E), sums(E, 0.0);
  cp_->all_gather(Tensor(all.data(), DType::I64, {int64_t{parts} * E}, nullptr), Tensor(mine.data(), DType::I64, {E}, nullptr));
  for (int p = 0; p < parts; ++p)
    for (int e = 0; e < E; ++e) sums[e] += all[static_cast<size_t>(p) * E + e];
  join_sequence_partition(r, counts, sums, parts);
}

MoELayer::~MoELayer() = default;

// In --deterministic-mode under expert parallelism the experts' GEMMs run per (expert, source
// EP rank) run: the GEMMs a data-parallel rank runs on its own tokens (oneDNN's bits depend on
// a GEMM's row count). Otherwise one GEMM per expert over every source's rows (fewer, larger
// GEMMs).
bool MoELayer::per_source_runs() const { return d_.per_source_runs; }

void MoELayer::grouped_forward(Tensor out, Tensor inp, const std::vector<Tensor>& weights, const MoEActs& a) {
  if (!per_source_runs() && ops::supports(device_, ops::grouped_linear_forward))
    return ops::grouped_linear_forward(out, inp, weights, a.expert_rows);
  const std::vector<int64_t>& rows = per_source_runs() ? a.run_rows : a.expert_rows;
  const size_t runs_per_expert = rows.size() / weights.size();
  int64_t first = 0;
  for (size_t g = 0; g < rows.size(); first += rows[g], ++g)
    if (rows[g] > 0) ops::linear_forward(out.slice_rows(first, rows[g]), inp.slice_rows(first, rows[g]),
                                         weights[g / runs_per_expert], Tensor());
}

void MoELayer::grouped_backward(Tensor dinp, const std::vector<Tensor>& dweights, Tensor dout, Tensor inp,
                                const std::vector<Tensor>& weights, const MoEActs& a, const MoEWorkspace& ws) {
  if (per_source_runs()) return per_source_backward(dinp, dweights, dout, inp, weights, a, ws);
  if (ops::supports(device_, ops::grouped_linear_backward))
    return ops::grouped_linear_backward(dinp, dweights, dout, inp, weights, a.expert_rows, kAssign);
  int64_t first = 0;
  for (size_t e = 0; e < weights.size(); first += a.expert_rows[e], ++e)
    if (a.expert_rows[e] > 0)
      ops::linear_backward(dinp.slice_rows(first, a.expert_rows[e]), dweights[e], Tensor(),
                           dout.slice_rows(first, a.expert_rows[e]), inp.slice_rows(first, a.expert_rows[e]),
                           weights[e], kAssign);
}

// Each run's weight gradient goes to a zeroed piece of its own (what the source DP rank's
// gradient would hold), and an expert's pieces are added in the canonical order over the source
// EP ranks (comm/ordered_sum.h) before joining the gradient: the EP group is an aligned block of
// consecutive data-parallel ranks, so the expert DP group's canonical sum of these block sums
// has the bits of the data-parallel layout's sum over every rank (EP a power of two).
void MoELayer::per_source_backward(Tensor dinp, const std::vector<Tensor>& dweights, Tensor dout, Tensor inp,
                                   const std::vector<Tensor>& weights, const MoEActs& a, const MoEWorkspace& ws) {
  const Tensor& slab = ws.source_pieces;
  auto add = [&](const Tensor& grad, const std::vector<std::pair<int, int>>& steps) {
    for (const auto& [into, from] : steps) ops::residual_forward(piece(slab, into, grad), piece(slab, into, grad),
                                                                 piece(slab, from, grad));
  };
  int64_t first = 0;
  for (size_t e = 0; e < weights.size(); ++e) {
    CanonicalSumStack sum;
    for (int64_t s = 0; s < d_.ep; ++s) {
      const int64_t rows = a.run_rows[e * d_.ep + s];
      const Tensor mine = piece(slab, sum.next_slot(), dweights[e]);
      ops::fill(mine, 0.0f);
      if (rows > 0)
        ops::linear_backward(dinp.slice_rows(first, rows), mine, Tensor(), dout.slice_rows(first, rows),
                             inp.slice_rows(first, rows), weights[e], kAssign);
      first += rows;
      add(dweights[e], sum.push());
    }
    add(dweights[e], sum.finish());
    ops::residual_forward(dweights[e], dweights[e], piece(slab, 0, dweights[e]));
  }
}

void MoELayer::activation_forward(Tensor act, Tensor pre) {
  if (config_.swiglu) ops::swiglu_forward(act, pre);
  else ops::gelu_forward(act, pre, config_.gelu);
}

void MoELayer::activation_backward(Tensor d_pre, Tensor d_act, Tensor pre) {
  if (config_.swiglu) ops::swiglu_backward(d_pre, d_act, pre, kAssign);
  else ops::gelu_backward(d_pre, d_act, pre, config_.gelu, kAssign);
}

// Routes on the host and uploads the maps the permute ops follow.
void MoELayer::forward(const MoEParams& w, MoEActs& a, MoEWorkspace& ws, Tensor in, Tensor out) {
  ops::linear_forward(ws.logits, in, w.router, Tensor());
  copy_floats_to_host(a.logits.data(), a.logits.size(), ws.logits);
  a.routing = route_tokens(config_.moe, a.logits.data(), d_.N, d_.groups);
  if (cp_) join_context_parallel_partition(a.routing);
  const MoERouting& r = a.routing;
  const int64_t M = static_cast<int64_t>(r.source.size());
  TESSERA_CHECK(M <= d_.M, "the permuted rows fit their buffer");
  copy_from_host(a.slots, r.slot.data(), r.slot.size() * sizeof(int32_t));
  copy_from_host(a.weights, r.weight.data(), r.weight.size() * sizeof(float));
  copy_from_host(a.sources.slice_rows(0, M), r.source.data(), r.source.size() * sizeof(int32_t));
  dispatcher_->dispatch(a, ws, in);
  experts_forward(w, a);
  dispatcher_->combine(a, ws, out);
  if (d_.Sl > 0) shared_forward(w, a, ws, in, out);
}

void MoELayer::experts_forward(const MoEParams& w, MoEActs& a) {
  const int64_t M = a.expert_rows_total;
  grouped_forward(a.fc1.slice_rows(0, M), a.permuted.slice_rows(0, M), w.fc1, a);
  activation_forward(a.act.slice_rows(0, M), a.fc1.slice_rows(0, M));
  grouped_forward(a.expert_out.slice_rows(0, M), a.act.slice_rows(0, M), w.fc2, a);
}

// out += the shared experts' MLP of in, times sigmoid(in @ gate^T) with the gate.
void MoELayer::shared_forward(const MoEParams& w, MoEActs& a, MoEWorkspace& ws, Tensor in, Tensor out) {
  ops::linear_forward(a.shared_fc1, in, w.shared_fc1, Tensor());
  activation_forward(a.shared_act, a.shared_fc1);
  if (!d_.gate) {
    ops::linear_forward(ws.shared_tmp, a.shared_act, w.shared_fc2, Tensor());
    return ops::residual_forward(out, out, ws.shared_tmp);
  }
  ops::linear_forward(a.shared_out, a.shared_act, w.shared_fc2, Tensor());
  ops::linear_forward(ws.gate_logits, in, w.shared_gate, Tensor());
  copy_floats_to_host(a.gate_logits.data(), a.gate_logits.size(), ws.gate_logits);
  std::vector<float> score(a.gate_logits.size());
  for (size_t n = 0; n < score.size(); ++n) score[n] = static_cast<float>(1.0 / (1.0 + std::exp(-double(a.gate_logits[n]))));
  copy_from_host(a.gate_weights, score.data(), score.size() * sizeof(float));
  ops::moe_unpermute_forward(ws.shared_tmp, a.shared_out, ws.identity, a.gate_weights);
  ops::residual_forward(out, out, ws.shared_tmp);
}

void MoELayer::shared_backward(const MoEParams& w, const MoEParams& g, MoEActs& a, MoEWorkspace& ws, Tensor in,
                               Tensor d_out, Tensor d_in) {
  Tensor d_shared_out = d_out;
  if (d_.gate) {
    ops::moe_unpermute_backward(ws.shared_tmp, ws.d_gate, d_out, a.shared_out, ws.identity, a.gate_weights);
    tp_.all_reduce(ws.d_gate, ReduceOp::Sum);
    d_shared_out = ws.shared_tmp;
    std::vector<float> d_gate(static_cast<size_t>(d_.N)), score(d_gate.size());
    copy_to_host(d_gate.data(), d_gate.size() * sizeof(float), ws.d_gate);
    copy_to_host(score.data(), score.size() * sizeof(float), a.gate_weights);
    for (size_t n = 0; n < d_gate.size(); ++n) d_gate[n] *= score[n] * (1.0f - score[n]);
    copy_floats_from_host(ws.d_gate_logits, d_gate.data(), d_gate.size());
  }
  ops::linear_backward(ws.d_shared_act, g.shared_fc2, Tensor(), d_shared_out, a.shared_act, w.shared_fc2, kAssign);
  activation_backward(ws.d_shared_fc1, ws.d_shared_act, a.shared_fc1);
  ops::linear_backward(d_in, g.shared_fc1, Tensor(), ws.d_shared_fc1, in, w.shared_fc1, kAssign);
  if (d_.gate)
    ops::linear_backward(tp_.rank() == 0 ? d_in : Tensor(), g.shared_gate, Tensor(), ws.d_gate_logits, in,
                         w.shared_gate, kAccumulate);
}

void MoELayer::backward(const MoEParams& w, const MoEParams& g, MoEActs& a, MoEWorkspace& ws, Tensor in,
                        Tensor d_out, Tensor d_in, double aux_scale) {
  const MoERouting& r = a.routing;
  const int64_t M = a.expert_rows_total;
  if (d_.Sl > 0) shared_backward(w, g, a, ws, in, d_out, d_in);
  dispatcher_->combine_backward(a, ws, d_out);
  grouped_backward(ws.d_act.slice_rows(0, M), g.fc2, ws.d_expert_out.slice_rows(0, M), a.act.slice_rows(0, M), w.fc2,
                   a, ws);
  activation_backward(ws.d_fc1.slice_rows(0, M), ws.d_act.slice_rows(0, M), a.fc1.slice_rows(0, M));
  grouped_backward(ws.d_permuted.slice_rows(0, M), g.fc1, ws.d_fc1.slice_rows(0, M), a.permuted.slice_rows(0, M),
                   w.fc1, a, ws);
  dispatcher_->dispatch_backward(a, ws, d_in, d_.Sl > 0 ? kAccumulate : kAssign);
  // The router: dL/d(weights) back on the host, through the routing and the aux losses.
  tp_.all_reduce(ws.d_weights, ReduceOp::Sum);
  copy_to_host(ws.host_d_weights.data(), ws.host_d_weights.size() * sizeof(float), ws.d_weights);
  route_backward(ws.host_d_logits.data(), config_.moe, r, a.logits.data(), ws.host_d_weights.data(), aux_scale);
  copy_floats_from_host(ws.d_logits, ws.host_d_logits.data(), ws.host_d_logits.size());
  ops::linear_backward(tp_.rank() == 0 ? d_in : Tensor(), g.router, Tensor(), ws.d_logits, in, w.router, kAccumulate);
}

}  // namespace tessera
