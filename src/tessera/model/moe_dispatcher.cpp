#include "tessera/model/moe_dispatcher.h"

#include <numeric>

#include "tessera/comm/all_to_all.h"
#include "tessera/core/error.h"
#include "tessera/device/device.h"

namespace tessera {
namespace {

constexpr ops::GradWrite kAssign = ops::GradWrite::Assign;

Tensor host_tensor(void* data, DType t, int64_t n) { return Tensor(data, t, {n}, nullptr); }

void upload_i32(Tensor dst, const std::vector<int32_t>& v) {
  copy_from_host(dst.slice_rows(0, static_cast<int64_t>(v.size())), v.data(), v.size() * sizeof(int32_t));
}

// Every EP rank's rows per expert, [EP][E] (the routing is per rank; Megatron's alltoall
// dispatcher exchanges the same counts before moving tokens).
std::vector<int64_t> gather_expert_counts(Communicator& ep, const MoEDims& d, const MoERouting& r) {
  std::vector<int64_t> mine = r.rows_per_expert, all(static_cast<size_t>(d.ep * d.E));
  ep.all_gather(host_tensor(all.data(), DType::I64, d.ep * d.E), host_tensor(mine.data(), DType::I64, d.E));
  return all;
}

// The experts' side order both dispatchers share: local expert, then source EP rank, then the
// source's permuted order. Calls visit(source, first row in the source's permuted buffer, rows)
// per (expert, source) run and fills a.expert_rows and a.run_rows.
template <typename Visit>
void walk_expert_rows(MoEActs& a, const MoEDims& d, const std::vector<int64_t>& counts, Visit visit) {
  a.expert_rows.assign(static_cast<size_t>(d.El), 0);
  a.expert_rows_total = 0;
  a.run_rows.clear();
  for (int64_t e = 0; e < d.El; ++e)
    for (int64_t s = 0; s < d.ep; ++s) {
      const int64_t* c = &counts[static_cast<size_t>(s * d.E)];
      const int64_t first = std::accumulate(c, c + d.first_expert + e, int64_t{0});
      const int64_t n = c[d.first_expert + e];
      visit(s, first, n);
      a.run_rows.push_back(n);
      a.expert_rows[static_cast<size_t>(e)] += n;
      a.expert_rows_total += n;
    }
  TESSERA_CHECK(a.expert_rows_total <= d.Mx, "the experts' rows fit their buffer");
}

// One expert-parallel rank: the router's permutation as it is.
class LocalDispatcher final : public MoETokenDispatcher {
 public:
  explicit LocalDispatcher(const MoEDims& d) : d_(d) {}
  void dispatch(MoEActs& a, MoEWorkspace&, Tensor in) override {
    a.expert_rows = a.routing.rows_per_expert;
    a.expert_rows_total = static_cast<int64_t>(a.routing.source.size());
    ops::moe_permute_forward(rows(a.permuted, a), in, rows(a.sources, a), d_.k);
  }
  void combine(MoEActs& a, MoEWorkspace&, Tensor out) override {
    ops::moe_unpermute_forward(out, rows(a.expert_out, a), a.slots, a.weights);
  }
  void combine_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_out) override {
    ops::moe_unpermute_backward(rows(ws.d_expert_out, a), ws.d_weights, d_out, rows(a.expert_out, a),
                                rows(a.sources, a), a.weights);
  }
  void dispatch_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_in, ops::GradWrite write) override {
    ops::moe_permute_backward(d_in, rows(ws.d_permuted, a), a.slots, write);
  }

 private:
  static Tensor rows(Tensor t, const MoEActs& a) { return t.slice_rows(0, a.expert_rows_total); }
  const MoEDims& d_;
};

// Megatron's MoEAlltoAllTokenDispatcher: permute locally, send each EP rank the rows of its
// experts, sort the received runs by local expert; the way back reverses each step.
class AllToAllDispatcher final : public MoETokenDispatcher {
 public:
  AllToAllDispatcher(const MoEDims& d, Communicator& ep) : d_(d), ep_(ep) {}

  void dispatch(MoEActs& a, MoEWorkspace& ws, Tensor in) override {
    const int64_t M = static_cast<int64_t>(a.routing.source.size());
    ops::moe_permute_forward(ws.local.slice_rows(0, M), in, a.sources.slice_rows(0, M), d_.k);
    plan(a);
    to_experts(a, ws, a.permuted, ws.local);
  }
  void combine(MoEActs& a, MoEWorkspace& ws, Tensor out) override {
    from_experts(a, ws, a.local_out, a.expert_out);
    ops::moe_unpermute_forward(out, local_rows(a.local_out, a), a.slots, a.weights);
  }
  void combine_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_out) override {
    ops::moe_unpermute_backward(local_rows(ws.local, a), ws.d_weights, d_out, local_rows(a.local_out, a),
                                local_rows(a.sources, a), a.weights);
    to_experts(a, ws, ws.d_expert_out, ws.local);
  }
  void dispatch_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_in, ops::GradWrite write) override {
    from_experts(a, ws, ws.local, ws.d_permuted);
    ops::moe_permute_backward(d_in, local_rows(ws.local, a), a.slots, write);
  }

 private:
  static Tensor local_rows(Tensor t, const MoEActs& a) {
    return t.slice_rows(0, static_cast<int64_t>(a.routing.source.size()));
  }

  // The runs each EP rank sends and receives, and the sort from received order (source rank,
  // then expert) to the experts' side order (expert, then source rank).
  void plan(MoEActs& a) {
    const std::vector<int64_t> counts = gather_expert_counts(ep_, d_, a.routing);
    const int64_t me = ep_.rank();
    a.send_rows.assign(static_cast<size_t>(d_.ep), 0);
    a.recv_rows.assign(static_cast<size_t>(d_.ep), 0);
    for (int64_t j = 0; j < d_.ep; ++j)
      for (int64_t e = 0; e < d_.El; ++e) {
        a.send_rows[j] += counts[static_cast<size_t>(me * d_.E + j * d_.El + e)];
        a.recv_rows[j] += counts[static_cast<size_t>(j * d_.E + me * d_.El + e)];
      }
    // Where each source's run for local expert e starts in the received buffer.
    std::vector<int64_t> source_start(static_cast<size_t>(d_.ep), 0);
    for (int64_t s = 1; s < d_.ep; ++s) source_start[s] = source_start[s - 1] + a.recv_rows[s - 1];
    std::vector<int32_t> sort;
    walk_expert_rows(a, d_, counts, [&](int64_t s, int64_t first, int64_t n) {
      const int64_t at = source_start[s] + first - first_of_mine(counts, s);
      for (int64_t i = 0; i < n; ++i) sort.push_back(static_cast<int32_t>(at + i));
    });
    std::vector<int32_t> unsort(sort.size());
    for (size_t i = 0; i < sort.size(); ++i) unsort[static_cast<size_t>(sort[i])] = static_cast<int32_t>(i);
    upload_i32(a.sort_map, sort);
    upload_i32(a.unsort_map, unsort);
  }
  // The first row, in source s's permuted buffer, of this rank's experts.
  int64_t first_of_mine(const std::vector<int64_t>& counts, int64_t s) const {
    const int64_t* c = &counts[static_cast<size_t>(s * d_.E)];
    return std::accumulate(c, c + d_.first_expert, int64_t{0});
  }

  // experts_side [Mx,C] (sorted) <- local [M,C]: the runs to every EP rank, then the sort.
  void to_experts(MoEActs& a, MoEWorkspace& ws, Tensor experts_side, Tensor local) {
    const int64_t R = a.expert_rows_total;
    all_to_all_v(ep_, ws.recv, a.recv_rows, local, a.send_rows);
    ops::moe_permute_forward(experts_side.slice_rows(0, R), ws.recv.slice_rows(0, R), a.sort_map.slice_rows(0, R), 1);
  }
  // local [M,C] <- experts_side [Mx,C]: unsorted into received order, then the runs back.
  void from_experts(MoEActs& a, MoEWorkspace& ws, Tensor local, Tensor experts_side) {
    const int64_t R = a.expert_rows_total;
    ops::moe_permute_forward(ws.recv.slice_rows(0, R), experts_side.slice_rows(0, R), a.unsort_map.slice_rows(0, R),
                             1);
    all_to_all_v(ep_, local, a.send_rows, ws.recv, a.recv_rows);
  }

  const MoEDims& d_;
  Communicator& ep_;
};

// Megatron's MoEAllGatherTokenDispatcher: every rank sees every EP rank's tokens and routes,
// runs the routes to its experts and reduce-scatters the weighted sums back.
class AllGatherDispatcher final : public MoETokenDispatcher {
 public:
  AllGatherDispatcher(const MoEDims& d, Communicator& ep) : d_(d), ep_(ep) {
    // Megatron's rule (the parser's too): capacity and dropping need the alltoall dispatcher,
    // so every rank permutes all N*k routes.
    TESSERA_CHECK(d.M == d.N * d.k, "the allgather dispatcher drops no route");
  }

  void dispatch(MoEActs& a, MoEWorkspace& ws, Tensor in) override {
    ep_.all_gather(ws.gathered.view({d_.ep * d_.N * d_.C}), in.view({d_.N * d_.C}));
    plan(a);
    ops::moe_permute_forward(experts_rows(a.permuted, a), ws.gathered, experts_rows(a.expert_sources, a), d_.k);
  }
  void combine(MoEActs& a, MoEWorkspace& ws, Tensor out) override {
    ops::moe_unpermute_forward(ws.gathered, experts_rows(a.expert_out, a), a.gathered_slots, a.gathered_weights);
    reduce_scatter(ws, out, ws.gathered);
  }
  void combine_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_out) override {
    ep_.all_gather(ws.gathered.view({d_.ep * d_.N * d_.C}), d_out.view({d_.N * d_.C}));
    ops::moe_unpermute_backward(experts_rows(ws.d_expert_out, a), ws.d_gathered_weights, ws.gathered,
                                experts_rows(a.expert_out, a), experts_rows(a.expert_sources, a), a.gathered_weights);
    // Each route's expert sits on one rank; the others' entries are 0.
    ep_.reduce_scatter(ws.d_weights.view({d_.N * d_.k}), ws.d_gathered_weights.view({d_.ep * d_.N * d_.k}),
                       ReduceOp::Sum);
  }
  void dispatch_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_in, ops::GradWrite write) override {
    ops::moe_permute_backward(ws.gathered, experts_rows(ws.d_permuted, a), a.gathered_slots, kAssign);
    if (write == kAssign) return reduce_scatter(ws, d_in, ws.gathered);
    reduce_scatter(ws, ws.scattered, ws.gathered);
    ops::residual_forward(d_in, d_in, ws.scattered);
  }

 private:
  static Tensor experts_rows(Tensor t, const MoEActs& a) { return t.slice_rows(0, a.expert_rows_total); }

  // The gathered routes of this rank's experts, in the experts' side order, and the gathered
  // routing (each gathered route's experts' side row, -1 for another rank's expert).
  void plan(MoEActs& a) {
    const MoERouting& r = a.routing;
    const int64_t Nk = d_.N * d_.k;
    const std::vector<int64_t> counts = gather_expert_counts(ep_, d_, r);
    std::vector<int32_t> sources(static_cast<size_t>(d_.ep * Nk)), mine = r.source;
    ep_.all_gather(host_tensor(sources.data(), DType::I32, d_.ep * Nk), host_tensor(mine.data(), DType::I32, Nk));
    std::vector<float> weights(static_cast<size_t>(d_.ep * Nk)), my_weights = r.weight;
    ep_.all_gather(host_tensor(weights.data(), DType::F32, d_.ep * Nk), host_tensor(my_weights.data(), DType::F32, Nk));
    std::vector<int32_t> expert_sources, slots(static_cast<size_t>(d_.ep * Nk), -1);
    walk_expert_rows(a, d_, counts, [&](int64_t s, int64_t first, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t route = s * Nk + sources[static_cast<size_t>(s * Nk + first + i)];
        slots[static_cast<size_t>(route)] = static_cast<int32_t>(expert_sources.size());
        expert_sources.push_back(static_cast<int32_t>(route));
      }
    });
    upload_i32(a.expert_sources, expert_sources);
    upload_i32(a.gathered_slots.view({d_.ep * Nk}), slots);
    copy_from_host(a.gathered_weights, weights.data(), weights.size() * sizeof(float));
  }

  // out [N,C] (assigned) = this rank's block of the sum over the EP group of whole [EP*N,C];
  // 16-bit rows are summed in f32 and rounded once.
  void reduce_scatter(MoEWorkspace& ws, Tensor out, Tensor whole) {
    const int64_t n = d_.N * d_.C;
    if (d_.act == DType::F32) return ep_.reduce_scatter(out.view({n}), whole.view({d_.ep * n}), ReduceOp::Sum);
    ops::convert(ws.gathered_f32, whole.view({d_.ep * n}));
    ep_.reduce_scatter(ws.scattered_f32, ws.gathered_f32, ReduceOp::Sum);
    ops::convert(out.view({n}), ws.scattered_f32);
  }

  const MoEDims& d_;
  Communicator& ep_;
};

}  // namespace

std::unique_ptr<MoETokenDispatcher> make_moe_dispatcher(const MoEDims& d, Communicator* ep) {
  if (d.ep == 1) return std::make_unique<LocalDispatcher>(d);
  TESSERA_CHECK(ep && ep->size() == d.ep, "the expert-parallel group's size differs from the partition's");
  if (d.dispatcher == MoEDispatcher::AllToAll) return std::make_unique<AllToAllDispatcher>(d, *ep);
  return std::make_unique<AllGatherDispatcher>(d, *ep);
}

}  // namespace tessera
