#include "tessera/parallel/tensor_parallel.h"

#include "tessera/core/error.h"
#include "tessera/device/device.h"
#include "tessera/ops/ops.h"

namespace tessera {
namespace {

Tensor flat(const Buffer& b, int64_t n, DType t = DType::F32) { return tensor_at(b, 0, t, {n}); }

bool is_16bit(DType t) { return t == DType::BF16 || t == DType::F16; }

void check_same(const Tensor& a, const Tensor& b, const char* what) {
  TESSERA_CHECK(a.same_memory(b), std::string(what) + ": without sequence parallelism both sides are one tensor");
}

}  // namespace

TensorParallelRegion::TensorParallelRegion(Communicator* tp, bool sequence_parallel, Device& device,
                                           int64_t max_elements, DType activations)
    : tp_(tp && tp->size() > 1 ? tp : nullptr),
      sequence_parallel_(sequence_parallel && tp_ != nullptr),
      size_(tp_ ? tp_->size() : 1),
      rank_(tp_ ? tp_->rank() : 0) {
  // f32 staging: 16-bit activations are summed in f32 (two buffers: a sequence-parallel
  // reduce-scatter widens, regroups and reduces out of place).
  if (sequence_parallel_ || (tp_ && is_16bit(activations)))
    staging_ = Buffer(device, static_cast<size_t>(max_elements) * sizeof(float));
  if (sequence_parallel_) slice_ = Buffer(device, static_cast<size_t>(max_elements) * sizeof(float));
}

// A 16-bit tensor (Megatron's bf16 activations) is widened, summed in f32 and rounded once:
// with two ranks the bits of a 16-bit sum; with more, closer than a chain of 16-bit adds.
void TensorParallelRegion::all_reduce(Tensor t, ReduceOp op) {
  if (!tp_) return;
  if (!is_16bit(t.dtype)) return tp_->all_reduce(t, op);
  Tensor wide = flat(staging_, t.numel());
  ops::convert(wide, t);
  tp_->all_reduce(wide, op);
  ops::convert(t, wide);
}

// whole [B,T,C] (= or +=) the slices of every rank, each [B,T/TP,C].
// A gather moves bytes: the staging holds the slices in their own dtype.
void TensorParallelRegion::gather_sequence(Tensor whole, Tensor outside, bool accumulate) {
  const int64_t n = whole.numel();
  Tensor staged = flat(staging_, n, outside.dtype);
  tp_->all_gather(staged, outside.view({outside.numel()}));
  if (!accumulate) {
    ops::rank_major_to_sequence(whole, staged.view(whole.shape), size_);
    return;
  }
  Tensor tmp = flat(slice_, n, outside.dtype).view(whole.shape);
  ops::rank_major_to_sequence(tmp, staged.view(whole.shape), size_);
  ops::residual_forward(whole, whole, tmp);
}

// outside [B,T/TP,C] (= or +=) this rank's slice of the sum over ranks of whole [B,T,C].
// 16-bit tensors are widened first (into slice_, before it holds the result) and the
// reduced slice is rounded once into outside.
void TensorParallelRegion::reduce_scatter_sequence(Tensor outside, Tensor whole, bool accumulate) {
  Tensor staged = flat(staging_, whole.numel());
  if (is_16bit(whole.dtype)) {
    Tensor wide = flat(slice_, whole.numel()).view(whole.shape);
    ops::convert(wide, whole);
    whole = wide;
  }
  ops::sequence_to_rank_major(staged.view(whole.shape), whole, size_);
  if (!accumulate && outside.dtype == DType::F32) {
    tp_->reduce_scatter(outside.view({outside.numel()}), staged, ReduceOp::Sum);
    return;
  }
  Tensor tmp = flat(slice_, outside.numel());
  tp_->reduce_scatter(tmp, staged, ReduceOp::Sum);
  if (accumulate) ops::residual_forward(outside, outside, tmp.view(outside.shape));
  else ops::convert(outside, tmp.view(outside.shape));
}

void TensorParallelRegion::enter_forward(Tensor whole, Tensor outside) {
  if (sequence_parallel_) return gather_sequence(whole, outside, false);
  check_same(whole, outside, "enter_forward");
}

void TensorParallelRegion::enter_backward(Tensor d_outside, Tensor d_whole) {
  if (sequence_parallel_) return reduce_scatter_sequence(d_outside, d_whole, true);
  check_same(d_outside, d_whole, "enter_backward");
  all_reduce(d_whole, ReduceOp::Sum);
}

void TensorParallelRegion::leave_forward(Tensor outside, Tensor partial) {
  if (sequence_parallel_) return reduce_scatter_sequence(outside, partial, false);
  check_same(outside, partial, "leave_forward");
  all_reduce(partial, ReduceOp::Sum);
}

void TensorParallelRegion::leave_backward(Tensor d_partial, Tensor d_outside) {
  if (sequence_parallel_) return gather_sequence(d_partial, d_outside, true);
  check_same(d_partial, d_outside, "leave_backward");
}

void TensorParallelRegion::scatter_forward(Tensor outside, Tensor whole) {
  TESSERA_CHECK(sequence_parallel_, "scatter_forward is for sequence parallelism");
  Tensor staged = flat(staging_, whole.numel(), whole.dtype);
  ops::sequence_to_rank_major(staged.view(whole.shape), whole, size_);
  const int64_t n = outside.numel();
  copy_tensor(outside, staged.slice_rows(rank_ * n, n).view(outside.shape));
}

void TensorParallelRegion::scatter_backward(Tensor d_whole, Tensor d_outside) {
  TESSERA_CHECK(sequence_parallel_, "scatter_backward is for sequence parallelism");
  gather_sequence(d_whole, d_outside, true);
}

}  // namespace tessera
