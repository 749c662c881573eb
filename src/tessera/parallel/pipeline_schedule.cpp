#include "tessera/parallel/pipeline_schedule.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera {

namespace {

// One rank's step list as Megatron's schedule code issues it: compute steps alone, the p2p
// calls of one Megatron communication call gathered into one batch. A call whose partner
// does not exist (no input before virtual stage 0, no output after the last) is dropped, as
// Megatron's p2p functions return without communicating there; an empty batch is no step.
class RankSteps {
 public:
  RankSteps(int pp, int virtual_stages, int rank)
      : pp_(pp), v_(virtual_stages), rank_(rank), inputs_(virtual_stages, 0), grads_(virtual_stages, 0) {}

  void forward(int chunk, int micro) { compute(PipeOp::Forward, chunk, micro); }
  void backward(int chunk, int micro) { compute(PipeOp::Backward, chunk, micro); }

  void send_forward(int chunk, int micro) {
    if (!is_last(chunk)) batch_.push_back({PipeOp::SendForward, chunk, micro, next()});
  }
  void send_backward(int chunk, int micro) {
    if (!is_first(chunk)) batch_.push_back({PipeOp::SendBackward, chunk, micro, prev()});
  }
  // A chunk runs its micro-batches in increasing order, so the n-th tensor received for a
  // chunk belongs to its micro-batch n.
  void recv_forward(int chunk) {
    if (!is_first(chunk)) batch_.push_back({PipeOp::RecvForward, chunk, inputs_[chunk]++, prev()});
  }
  void recv_backward(int chunk) {
    if (!is_last(chunk)) batch_.push_back({PipeOp::RecvBackward, chunk, grads_[chunk]++, next()});
  }
  // Ends the batch being gathered: its calls are posted together and waited for together.
  void post() {
    if (!batch_.empty()) steps_.push_back(PipeStep{std::move(batch_)});
    batch_.clear();
  }

  std::vector<PipeStep> take() {
    post();
    return std::move(steps_);
  }

 private:
  bool is_first(int chunk) const { return rank_ == 0 && chunk == 0; }
  bool is_last(int chunk) const { return rank_ == pp_ - 1 && chunk == v_ - 1; }
  int next() const { return (rank_ + 1) % pp_; }
  int prev() const { return (rank_ + pp_ - 1) % pp_; }
  void compute(PipeOp op, int chunk, int micro) {
    TESSERA_CHECK(batch_.empty(), "pipeline schedule: a p2p batch was not posted before a compute step");
    steps_.push_back(PipeStep{{PipeAction{op, chunk, micro, -1}}});
  }

  int pp_, v_, rank_;
  std::vector<int> inputs_, grads_;  // tensors received so far, per chunk
  std::vector<PipeAction> batch_;
  std::vector<PipeStep> steps_;
};

// Megatron's forward_backward_pipelining_without_interleaving.
std::vector<PipeStep> one_f_one_b(int pp, int rank, int num_micro) {
  RankSteps s(pp, 1, rank);
  const int warmup = std::min(pp - rank - 1, num_micro);
  const int steady = num_micro - warmup;
  for (int m = 0; m < warmup; ++m) {
    s.recv_forward(0);
    s.post();
    s.forward(0, m);
    s.send_forward(0, m);
    s.post();
  }
  if (steady > 0) s.recv_forward(0);
  s.post();
  for (int i = 0; i < steady; ++i) {
    s.forward(0, warmup + i);
    s.send_forward(0, warmup + i);  // send_forward_recv_backward
    s.recv_backward(0);
    s.post();
    s.backward(0, i);
    s.send_backward(0, i);  // send_backward_recv_forward, or send_backward in the last one
    if (i + 1 < steady) s.recv_forward(0);
    s.post();
  }
  for (int m = steady; m < num_micro; ++m) {
    s.recv_backward(0);
    s.post();
    s.backward(0, m);
    s.send_backward(0, m);
    s.post();
  }
  return s.take();
}

// Python's modulo (never negative): Megatron computes chunk ids of negative iterations.
int py_mod(int a, int n) { return ((a % n) + n) % n; }

// Megatron's forward_backward_pipelining_with_interleaving (batched p2p, no overlap). The
// k-th forward (backward) of a rank runs the chunk of Megatron's get_model_chunk_id on its
// micro-batch get_microbatch_id_in_model_chunk: groups of pp micro-batches go through chunk
// 0, 1, ..., V-1 (backward: V-1, ..., 0) before the next group starts.
std::vector<PipeStep> interleaved(int pp, int v, int rank, int num_micro) {
  RankSteps s(pp, v, rank);
  const int total = num_micro * v;
  auto chunk_of = [&](int k, bool forward) {
    const int c = py_mod(k, pp * v) / pp;
    return forward ? c : v - 1 - c;
  };
  auto micro_of = [&](int k) { return k / (pp * v) * pp + k % pp; };

  int warmup = (pp - rank - 1) * 2 + (v - 1) * pp;
  const bool all_warmup = warmup >= total;
  warmup = std::min(warmup, total);
  const int remaining = total - warmup;

  s.recv_forward(0);
  s.post();
  for (int k = 0; k < warmup; ++k) {
    const int c = chunk_of(k, true);
    s.forward(c, micro_of(k));
    const int next_c = chunk_of(k + 1, true);
    const bool recv_prev = !(rank == 0 && next_c == 0) && k != total - 1;
    s.send_forward(c, micro_of(k));  // send_forward_recv_forward
    if (recv_prev) s.recv_forward(next_c);
    // The last warm-up call also receives the gradient of the first backward.
    if (k == warmup - 1 && !all_warmup) s.recv_backward(v - 1);
    s.post();
  }
  for (int i = 0; i < remaining; ++i) {
    const int fk = warmup + i, bk = i;
    const int fc = chunk_of(fk, true), bc = chunk_of(bk, false);
    s.forward(fc, micro_of(fk));
    s.backward(bc, micro_of(bk));
    // What the neighbours send now: the first rank is pp-1 forwards ahead of the last one
    // (and the last rank pp-1 backwards ahead of the first), so the chunk a received tensor
    // belongs to follows from the sender's iteration.
    bool recv_prev = true, recv_next = true;
    int next_fc, next_bc;
    if (rank == 0) {
      next_fc = chunk_of(fk - (pp - 1), true);
      recv_prev = next_fc != v - 1;
      next_fc += 1;
    } else {
      next_fc = chunk_of(fk + 1, true);
    }
    if (rank == pp - 1) {
      next_bc = chunk_of(bk - (pp - 1), false);
      recv_next = next_bc != 0;
      next_bc -= 1;
    } else {
      next_bc = chunk_of(bk + 1, false);
    }
    if (i == remaining - 1) recv_prev = false;
    // Forward-direction calls first: with pp 2 both directions of a pair carry activations
    // and gradients, and one FIFO per pair needs both ends to list them in the same order
    // (Megatron's batch order, send to prev first, would not; the schedule test shows it).
    s.send_forward(fc, micro_of(fk));  // send_forward_backward_recv_forward_backward
    if (recv_prev) s.recv_forward(next_fc);
    s.send_backward(bc, micro_of(bk));
    if (recv_next) s.recv_backward(next_bc);
    s.post();
  }
  if (all_warmup) {
    s.recv_backward(v - 1);
    s.post();
  }
  for (int k = remaining; k < total; ++k) {
    const int c = chunk_of(k, false);
    s.backward(c, micro_of(k));
    const int next_c = chunk_of(k + 1, false);
    const bool recv_next = !(rank == pp - 1 && next_c == v - 1) && k != total - 1;
    s.send_backward(c, micro_of(k));  // send_backward_recv_backward
    if (recv_next) s.recv_backward(next_c);
    s.post();
  }
  return s.take();
}

const char* short_name(PipeOp op) {
  switch (op) {
    case PipeOp::Forward: return "F";
    case PipeOp::Backward: return "B";
    case PipeOp::RecvForward: return "recv_fwd";
    case PipeOp::SendForward: return "send_fwd";
    case PipeOp::RecvBackward: return "recv_bwd";
    case PipeOp::SendBackward: return "send_bwd";
  }
  return "?";
}

}  // namespace

PipelineSchedule make_pipeline_schedule(int pp, int virtual_stages, int num_micro) {
  if (pp < 1)
    throw usage_error("--pipeline-model-parallel-size must be at least 1, got " + std::to_string(pp));
  if (virtual_stages < 1)
    throw usage_error("the number of virtual pipeline stages must be at least 1, got " +
                      std::to_string(virtual_stages));
  if (num_micro < 1)
    throw usage_error("a pipeline schedule needs at least one micro-batch, got " + std::to_string(num_micro),
                      "micro-batches per step = --global-batch-size / (--micro-batch-size x data-parallel size)");
  if (virtual_stages > 1 && pp == 1)
    throw usage_error("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size of at least 2 "
                      "(the interleaved schedule splits the model over several pipeline ranks)",
                      "drop --num-layers-per-virtual-pipeline-stage, or raise --pipeline-model-parallel-size");
  if (virtual_stages > 1 && num_micro % pp != 0)
    throw usage_error("the interleaved pipeline schedule needs the number of micro-batches (" +
                          std::to_string(num_micro) + ") to be a multiple of --pipeline-model-parallel-size (" +
                          std::to_string(pp) + ")",
                      "micro-batches per step = --global-batch-size / (--micro-batch-size x data-parallel size): "
                      "choose --global-batch-size and --micro-batch-size so that it is a multiple of the pipeline "
                      "size, or drop --num-layers-per-virtual-pipeline-stage");
  PipelineSchedule s;
  s.pp = pp;
  s.virtual_stages = virtual_stages;
  s.num_micro = num_micro;
  for (int rank = 0; rank < pp; ++rank)
    s.ranks.push_back(virtual_stages == 1 ? one_f_one_b(pp, rank, num_micro)
                                          : interleaved(pp, virtual_stages, rank, num_micro));
  return s;
}

int PipelineSchedule::max_in_flight(int rank, int chunk) const {
  int live = 0, most = 0;
  for (const PipeStep& step : ranks.at(rank))
    for (const PipeAction& a : step.actions) {
      if (a.chunk != chunk) continue;
      if (a.op == PipeOp::Forward) most = std::max(most, ++live);
      if (a.op == PipeOp::Backward) --live;
    }
  return most;
}

std::string describe(const PipeAction& a, int virtual_stages) {
  std::string s = short_name(a.op);
  if (virtual_stages > 1) s += " c" + std::to_string(a.chunk);
  s += " m" + std::to_string(a.micro);
  const bool incoming = a.op == PipeOp::RecvForward || a.op == PipeOp::RecvBackward;
  if (a.peer >= 0) s += (incoming ? " from " : " to ") + std::to_string(a.peer);
  return s;
}

std::string describe(const PipelineSchedule& schedule, int rank) {
  std::string out;
  for (const PipeStep& step : schedule.ranks.at(rank)) {
    for (size_t i = 0; i < step.actions.size(); ++i)
      out += (i ? " + " : "") + describe(step.actions[i], schedule.virtual_stages);
    out += "\n";
  }
  return out;
}

}  // namespace tessera
