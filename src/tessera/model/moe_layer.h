// The MLP of an MoE layer (Megatron's MoELayer: megatron/core/transformer/moe/moe_layer.py):
// the router (model/moe_router.h), the experts' SwiGLU or GeLU MLPs over their tokens
// (SequentialMLP's math; their GEMMs as one grouped op), and the shared experts with
// Qwen2-MoE's optional sigmoid gate. The GPT model calls it in place of the dense MLP
// between the pre-MLP norm and the row-parallel reduction: it reads the normalised input of
// the whole sequence and writes this tensor-parallel rank's partial sum of the output,
// which the model reduces, drops out and adds to the residual as for the dense MLP.
//
// Tensor parallelism (expert tensor parallelism = TP, Megatron's default): every TP rank
// routes the whole sequence (the same decisions: the same logits, one routing group per
// sequence-parallel slice as Megatron routes each rank's slice) and runs its slice of every
// expert (fc1 split by columns, fc2 by rows). The routing weights' and the gate's gradients
// (dot products with the experts' partial outputs) are summed over the TP group, as Megatron's
// gather of the probabilities sums them in its backward; the router's and gate's input
// gradients are added on TP rank 0 only, since the model sums the input gradient over the group.
//
// Expert parallelism: this rank holds El = E / EP of the experts; the dispatcher
// (model/moe_dispatcher.h) brings it the rows routed to them from every EP rank and takes the
// outputs back. Routing, the aux losses and the router's gradient stay on each rank's own tokens.
//
// Shape legend: N tokens of the micro-batch (B*T), C hidden, E experts, k top-k, M rows
// of the permuted buffer (at most N*k, or E * capacity per group with padding), Mx rows of the
// experts' side (M; EP * M under expert parallelism, the most the EP ranks can send), Fl / Sl
// an expert's / the shared experts' ffn width on this TP rank (Fl2, Sl2: twice with SwiGLU).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/model/gpt_config.h"
#include "tessera/model/moe_router.h"
#include "tessera/parallel/tensor_parallel.h"

namespace tessera {

class Device;
class Communicator;
class MoETokenDispatcher;

// One MoE layer's parameters (or their gradients) on this rank.
struct MoEParams {
  Tensor router;                // [E, C]
  std::vector<Tensor> fc1, fc2;  // per local expert [Fl2, C], [C, Fl]
  Tensor shared_fc1, shared_fc2, shared_gate;  // [Sl2, C], [C, Sl], [1, C]; empty when absent
};

struct MoEDims {
  int64_t N = 0, C = 0, E = 0, k = 0, M = 0, Fl = 0, Fl2 = 0, Sl = 0, Sl2 = 0;
  int64_t ep = 1, El = 0, first_expert = 0, Mx = 0;  // this EP rank's experts [first, first + El)
  MoEDispatcher dispatcher = MoEDispatcher::AllGather;
  bool gate = false;
  // --deterministic-mode under expert parallelism: the experts' GEMMs per (expert, source EP
  // rank) run (MoELayer::per_source_backward); the model sets it from its device.
  bool per_source_runs = false;
  DType act = DType::F32;
  std::vector<std::vector<int64_t>> groups;  // routing groups (moe_router.h)
};
// seq: the sequence a rank holds (--seq-length / CP); tp: the tensor-parallel size;
// sequence_parallel: one routing group per TP rank's slice; ep_size / ep_rank: the
// expert-parallel size and this rank's place in it.
MoEDims moe_dims(const GPTConfig& config, int64_t micro_batch, int64_t seq, int tp, bool sequence_parallel,
                 int ep_size = 1, int ep_rank = 0);

// What one micro-batch's backward needs from its forward.
struct MoEActs {
  Tensor slots, sources, weights;              // i32 [N,k], i32 [M], f32 [N,k]
  Tensor permuted, fc1, act, expert_out;       // the experts' side: [Mx,C], [Mx,Fl2], [Mx,Fl], [Mx,C]
  Tensor shared_fc1, shared_act, shared_out;   // [N,Sl2], [N,Sl], [N,C]
  Tensor gate_weights;                         // f32 [N] sigmoid of the gate's logits
  std::vector<float> logits, gate_logits;      // the host's copies
  MoERouting routing;
  std::vector<int64_t> expert_rows;            // [El] rows of each local expert on the experts' side
  int64_t expert_rows_total = 0;
  // Expert parallelism: [El*EP] rows of each (local expert, source EP rank) run, in the
  // experts' side order (the rows one data-parallel rank's expert GEMM would take).
  std::vector<int64_t> run_rows;
  // Expert parallelism, alltoall: the combined rows in the local permuted order [M,C]; the
  // experts' side row of each received row and back (i32 [Mx]); the runs sent to / received
  // from each EP rank.
  Tensor local_out, sort_map, unsort_map;
  std::vector<int64_t> send_rows, recv_rows;
  // Expert parallelism, allgather: the gathered route of each experts' side row (i32 [Mx]),
  // and the gathered routes' rows and weights (i32 / f32 [EP*N, k]).
  Tensor expert_sources, gathered_slots, gathered_weights;
};

// Shared by every slot within one forward or backward call.
struct MoEWorkspace {
  Tensor logits, d_logits;                  // [N,E]
  Tensor d_weights;                         // f32 [N,k]
  Tensor d_permuted, d_fc1, d_act, d_expert_out;  // as the activations
  Tensor shared_tmp, d_shared_fc1, d_shared_act;  // [N,C], [N,Sl2], [N,Sl]
  Tensor gate_logits, d_gate_logits;        // [N,1]
  Tensor d_gate, identity;                  // f32 [N], i32 [N] = 0..N-1
  std::vector<float> host_d_logits, host_d_weights;
  // Expert parallelism: alltoall's local rows [M,C] and received rows [Mx,C]; allgather's
  // gathered tokens [EP*N,C], its routes' weight gradients f32 [EP*N,k], the reduce-scatter's
  // result [N,C], and f32 staging for 16-bit activations ([EP*N*C], [N*C]).
  Tensor local, recv;
  Tensor gathered, d_gathered_weights, scattered, gathered_f32, scattered_f32;
  // per_source_runs: f32 [CanonicalSumStack::slots_for(EP), Fl2*C], an expert's weight gradient
  // per source EP rank, summed in the canonical order (comm/ordered_sum.h).
  Tensor source_pieces;
};

using ReserveTensor = std::function<void(Tensor&, Shape, DType)>;
void reserve_moe_acts(MoEActs& a, const MoEDims& d, const ReserveTensor& reserve);
void reserve_moe_workspace(MoEWorkspace& ws, const MoEDims& d, const ReserveTensor& reserve);
// After binding: the workspace's constant tensors (the identity map).
void init_moe_workspace(MoEWorkspace& ws, const MoEDims& d);

// Per-layer values Megatron's track_moe_metrics logs (summed over micro-batches).
struct MoELossTracker {
  std::vector<double> load_balancing, z;  // [num_layers]
};

class MoELayer {
 public:
  // ep: the expert-parallel group (null for EP 1); cp: the context-parallel group (null for
  // CP 1), over which the aux loss counts its tokens.
  MoELayer(const GPTConfig& config, Device& device, MoEDims dims, TensorParallelRegion& tp, Communicator* ep,
           Communicator* cp = nullptr);
  ~MoELayer();
  const MoEDims& dims() const { return d_; }
  // out [N,C] = this rank's partial MLP output of in [N,C] (assigned).
  void forward(const MoEParams& w, MoEActs& a, MoEWorkspace& ws, Tensor in, Tensor out);
  // d_in [N,C] = this rank's share of dL/d(in) (assigned) from dL/d(out) d_out; the parameter
  // gradients accumulate into g. aux_scale: the aux losses' gradient (the main loss's scale
  // over micro-batches, Megatron's MoEAuxLossAutoScaler).
  void backward(const MoEParams& w, const MoEParams& g, MoEActs& a, MoEWorkspace& ws, Tensor in, Tensor d_out,
                Tensor d_in, double aux_scale);

 private:
  void experts_forward(const MoEParams& w, MoEActs& a);
  void join_context_parallel_partition(MoERouting& r);
  void activation_forward(Tensor act, Tensor pre);
  void activation_backward(Tensor d_pre, Tensor d_act, Tensor pre);
  void shared_forward(const MoEParams& w, MoEActs& a, MoEWorkspace& ws, Tensor in, Tensor out);
  void shared_backward(const MoEParams& w, const MoEParams& g, MoEActs& a, MoEWorkspace& ws, Tensor in, Tensor d_out,
                       Tensor d_in);
  bool per_source_runs() const;
  void grouped_forward(Tensor out, Tensor inp, const std::vector<Tensor>& weights, const MoEActs& a);
  void grouped_backward(Tensor dinp, const std::vector<Tensor>& dweights, Tensor dout, Tensor inp,
                        const std::vector<Tensor>& weights, const MoEActs& a, const MoEWorkspace& ws);
  void per_source_backward(Tensor dinp, const std::vector<Tensor>& dweights, Tensor dout, Tensor inp,
                           const std::vector<Tensor>& weights, const MoEActs& a, const MoEWorkspace& ws);

  const GPTConfig& config_;
  Device& device_;
  MoEDims d_;
  TensorParallelRegion& tp_;
  Communicator* cp_;
  std::unique_ptr<MoETokenDispatcher> dispatcher_;
};

}  // namespace tessera
