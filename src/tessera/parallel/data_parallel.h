// Data parallelism's gradient reduction (Megatron's DistributedDataParallel): the gradient
// slab is cut into buckets of contiguous parameters, in reverse registration order (the
// order backward produces them). Each bucket is summed across the data-parallel group in
// one all-reduce over its slab range and scaled by 1/DP. With overlap, a bucket's
// all-reduce starts as soon as backward reports all its parameters ready; otherwise all
// buckets are reduced after backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/tensor.h"

namespace tessera {

class GradBuckets {
 public:
  // grads: every parameter's gradient, in registration order, inside one slab (views may
  // have alignment gaps between them, which are zero and reduce to zero).
  // bucket_elements: a bucket closes once it holds at least this many elements.
  GradBuckets(std::vector<Tensor> grads, Communicator& dp, int64_t bucket_elements, bool overlap);

  // Backward will not touch the gradients of parameters [first, end) again in this step.
  void mark_ready(size_t first, size_t end);
  // Completes the reduction of every bucket and averages over the group.
  void finish();
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    size_t first_param, end_param;  // parameters [first, end)
    Tensor flat;                    // the slab range covering them, f32 [n]
    size_t pending;                 // parameters not yet ready this step
    std::unique_ptr<Work> work;
  };
  void launch(Bucket& b);

  std::vector<Tensor> grads_;
  Communicator& dp_;
  bool overlap_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
};

}  // namespace tessera
