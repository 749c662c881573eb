// The communication that brackets a tensor-parallel region (Megatron's mappings.py), as
// explicit forward/backward pairs. A region is entered before a column-parallel linear
// (every rank needs the full input) and left after a row-parallel one (every rank holds a
// partial sum of the output):
//
//                          forward                    backward
//   without sequence parallelism (activations outside the region are whole on every rank)
//     enter  (copy_to)     identity                   all-reduce of the input gradient
//     leave  (reduce_from) all-reduce of the output   identity
//   with --sequence-parallel (outside the region each rank holds a slice of the sequence)
//     enter  (gather)      all-gather along sequence  reduce-scatter along sequence
//     leave  (reduce_scatter) reduce-scatter          all-gather
//   scatter (after the embedding, SP only): keep own slice / all-gather
//
// Activations are [B,T,C] with the sequence in the middle, so a rank's slice is not
// contiguous; the gathers stage through a rank-major buffer owned here.
//
// Conventions as in ops.h: forward writes its output; backward ACCUMULATES into the input
// gradient. Where the two sides are the same tensor (no sequence parallelism) the caller
// passes the same tensor for both and the ops work in place.
#pragma once

#include "tessera/comm/communicator.h"
#include "tessera/core/tensor.h"
#include "tessera/device/buffer.h"

namespace tessera {

class Device;

class TensorParallelRegion {
 public:
  // tp: the tensor-parallel group (null for one rank: every op is then the identity).
  // max_elements: the largest whole [B,T,C] tensor passed through (staging size);
  // activations: their dtype (16-bit ones are reduced through an f32 staging buffer).
  TensorParallelRegion(Communicator* tp, bool sequence_parallel, Device& device, int64_t max_elements,
                       DType activations);

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // Sequence length of the activations outside the region.
  int64_t local_seq(int64_t T) const { return sequence_parallel_ ? T / size_ : T; }
  // First sequence position this rank holds outside the region.
  int64_t seq_offset(int64_t T) const { return sequence_parallel_ ? rank_ * (T / size_) : 0; }

  // whole [B,T,C] <- outside [B,T/TP,C] (SP) or the same tensor.
  void enter_forward(Tensor whole, Tensor outside);
  void enter_backward(Tensor d_outside, Tensor d_whole);
  // outside <- sum over ranks of partial [B,T,C].
  void leave_forward(Tensor outside, Tensor partial);
  void leave_backward(Tensor d_partial, Tensor d_outside);
  // SP only: outside <- own slice of whole.
  void scatter_forward(Tensor outside, Tensor whole);
  void scatter_backward(Tensor d_whole, Tensor d_outside);

  // Sum (or max) over the group, in place (the vocabulary-parallel loss, replicated
  // gradients); a 16-bit tensor is reduced in f32 and rounded once.
  void all_reduce(Tensor t, ReduceOp op);

 private:
  void gather_sequence(Tensor whole, Tensor outside, bool accumulate);
  void reduce_scatter_sequence(Tensor outside, Tensor whole, bool accumulate);

  Communicator* tp_;
  bool sequence_parallel_;
  int size_, rank_;
  Buffer staging_;   // rank-major [TP][B][T/TP][C]
  Buffer slice_;     // one rank's slice, for accumulating backwards
};

}  // namespace tessera
