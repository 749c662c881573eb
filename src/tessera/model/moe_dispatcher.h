// How an MoE layer's routed tokens reach this rank's experts and come back: Megatron's token
// dispatchers (megatron/core/transformer/moe/token_dispatcher.py), the parallel plumbing kept
// apart from the layer's math (model/moe_layer.h).
//
// The layer routes its own tokens (the whole TP-gathered sequence of this rank's micro-batch)
// and the dispatcher fills the experts' side: a.permuted holds the rows of this rank's experts,
// expert by expert (a.expert_rows), which the layer runs through the experts' GEMMs into
// a.expert_out; the dispatcher then writes the weighted sum of each token's expert outputs.
//   - One expert-parallel rank: the local permutation (moe_permute / moe_unpermute).
//   - alltoall (MoEAlltoAllTokenDispatcher): the local permutation, then the rows of each EP
//     rank's experts sent to it (counts exchanged first), sorted by local expert; back the
//     same way, and unpermuted locally.
//   - allgather (MoEAllGatherTokenDispatcher): the tokens and their routing all-gathered over
//     the EP group, each rank permuting the routes to its own experts out of the gathered
//     tokens, unpermuting into the gathered shape, and reduce-scattering back.
// Both order the experts' rows alike (expert, then source EP rank, then that rank's permuted
// order), so they give the experts the same GEMMs; only the final sums' order differs.
// Tensor parallelism needs nothing here: every TP rank of an EP rank holds the same tokens,
// and the EP group joins ranks of one TP coordinate (Topology's expert grid).
#pragma once

#include <memory>

#include "tessera/comm/communicator.h"
#include "tessera/model/moe_layer.h"
#include "tessera/ops/ops.h"

namespace tessera {

class MoETokenDispatcher {
 public:
  virtual ~MoETokenDispatcher() = default;
  // a.permuted[0, rows) and a.expert_rows from in [N,C] and a.routing (the local maps a.slots,
  // a.weights, a.sources already uploaded).
  virtual void dispatch(MoEActs& a, MoEWorkspace& ws, Tensor in) = 0;
  // out [N,C] (assigned) = each token's routes' weighted a.expert_out rows.
  virtual void combine(MoEActs& a, MoEWorkspace& ws, Tensor out) = 0;
  // combine's backward: ws.d_expert_out (the experts' side) and ws.d_weights [N,k] (this
  // rank's routes, before the TP sum) from d_out [N,C].
  virtual void combine_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_out) = 0;
  // dispatch's backward: d_in [N,C] (+)= per `write` the gradient of the tokens from
  // ws.d_permuted (the experts' side).
  virtual void dispatch_backward(MoEActs& a, MoEWorkspace& ws, Tensor d_in, ops::GradWrite write) = 0;
};

// ep: the expert-parallel group (null when d.ep == 1).
std::unique_ptr<MoETokenDispatcher> make_moe_dispatcher(const MoEDims& d, Communicator* ep);

}  // namespace tessera
