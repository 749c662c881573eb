// Pipeline schedules as data: for each pipeline rank, the list of steps it runs in one
// training iteration (Megatron's forward_backward_pipelining_*), built without processes or
// tensors and interpreted by one executor (train/pipeline_executor.h). Tests run every rank's
// list in a simulator: every send has its receive, no deadlock, every forward precedes its
// backward, in-flight activations stay within the bound.
//
// Model chunks and virtual stages (Megatron's interleaving): with V chunks per rank, chunk c
// of pipeline rank p is virtual stage c*pp + p. Virtual stage 0 embeds (no input); the last
// one (rank pp-1, chunk V-1) computes the loss (no output, its backward starts from the
// loss). Activations flow from rank p to p+1 and from rank pp-1 (chunk c) to rank 0
// (chunk c+1); gradients flow back the same way.
//
// A step is either one compute action or a batch of point-to-point actions posted together
// and then all waited for (Megatron's batch_isend_irecv; Communicator::send_async/recv_async).
// Per ordered pair of ranks the k-th send meets the k-th recv (communicator.h), and the
// schedules are built so that every pair's k-th send and k-th recv carry the same tensor.
#pragma once

#include <string>
#include <vector>

namespace tessera {

enum class PipeOp { Forward, Backward, RecvForward, SendForward, RecvBackward, SendBackward };

// chunk: model chunk on this rank (0..V-1); micro: micro-batch; peer: the pipeline rank of
// the partner of a p2p action, -1 for compute. The p2p actions name the (chunk, micro) of
// THIS rank whose tensor they move: RecvForward fills chunk's input, SendForward sends its
// output, RecvBackward fills the gradient of its output, SendBackward sends the gradient of
// its input.
struct PipeAction {
  PipeOp op;
  int chunk;
  int micro;
  int peer;
};

// Exactly one compute action, or one or more p2p actions posted together.
struct PipeStep {
  std::vector<PipeAction> actions;
};

struct PipelineSchedule {
  int pp = 1;
  int virtual_stages = 1;
  int num_micro = 0;
  std::vector<std::vector<PipeStep>> ranks;  // the steps of each pipeline rank

  int virtual_stage(int rank, int chunk) const { return chunk * pp + rank; }
  // The most micro-batches whose forward has run and whose backward has not, at any point,
  // for that chunk on that rank: the activation slots to allocate.
  int max_in_flight(int rank, int chunk) const;
};

// V == 1: Megatron's 1F1B (forward_backward_pipelining_without_interleaving; with pp == 1,
// forward then backward of each micro-batch, Megatron's no-pipelining). V > 1: Megatron's
// interleaved 1F1B (forward_backward_pipelining_with_interleaving). Throws a usage Error
// naming the flags for sizes below 1, V > 1 with pp == 1, and V > 1 with num_micro not a
// multiple of pp.
PipelineSchedule make_pipeline_schedule(int pp, int virtual_stages, int num_micro);

// One line per step of `rank`: "F m3", "B c1 m3" (the chunk only when V > 1), a batch as
// "send_fwd m3 to 2 + recv_bwd m1 from 2".
std::string describe(const PipelineSchedule& schedule, int rank);
std::string describe(const PipeAction& action, int virtual_stages);

}  // namespace tessera
