// Data parallelism over a rank's gradient and parameter buffers (Megatron's
// DistributedDataParallel and, with --use-distributed-optimizer, the DistributedOptimizer's
// buffer traffic: megatron/core/distributed/param_and_grad_buffer.py). The buffers are laid
// out by parallel/grad_buffer_layout.h and cut into its buckets.
//
// Per step:
//  - each bucket of the gradient buffer is scaled by 1/DP and summed over the group, as
//    soon as backward reports all its parameters ready (--overlap-grad-reduce) or after
//    backward: an all-reduce, or with the distributed optimizer a reduce-scatter whose result
//    (this rank's owned range of the bucket) lands in the gradient shard;
//  - with the distributed optimizer the optimizer updates the owned ranges of the parameters
//    (owned_pieces()), and gather_params() all-gathers every bucket's parameters from their
//    owners; with --overlap-param-gather the gathers run in the background and the next
//    forward waits for a bucket only when it reads one of its parameters (wait_params).
// Under expert parallelism the experts' buckets (GradBufferLayout::Bucket::expert) are summed
// over the expert data-parallel group instead, still scaled by 1/DP (Megatron's
// expert_gradient_scaling_factor: an expert's gradient already gathers the tokens of every EP
// rank), and owned over that group with the distributed optimizer.
// In --deterministic-mode every bucket is summed in the canonical order of comm/ordered_sum.h
// over the group ranks (the data-parallel source index; expert DP groups hold consecutive
// blocks of it), synchronously, and scaled after the sum, so a layout's reduced gradients do
// not depend on how it split the sum (docs/distributed.md, Expert parallelism).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/core/tensor.h"
#include "tessera/device/buffer.h"
#include "tessera/parallel/grad_buffer_layout.h"

namespace tessera {

class Device;

struct DataParallelOptions {
  bool overlap_grad_reduce = false;
  bool distributed_optimizer = false;
  bool overlap_param_gather = false;  // needs the distributed optimizer
};

class DataParallelBuckets {
 public:
  // grad_buffer: F32 [layout.numel], every parameter's gradient at its layout position;
  // param_buffer: [layout.numel] of the parameters' dtype, likewise (read and written only
  // with the distributed optimizer). expert_dp: the expert data-parallel group, needed when
  // the layout has experts' buckets.
  DataParallelBuckets(const GradBufferLayout& layout, Tensor grad_buffer, Tensor param_buffer, Communicator& dp,
                      const DataParallelOptions& options, Device& device, Communicator* expert_dp = nullptr);
  // Waits for the collectives still running (an overlapped gather after the last step):
  // they write into the buffers.
  ~DataParallelBuckets();
  DataParallelBuckets(const DataParallelBuckets&) = delete;
  DataParallelBuckets& operator=(const DataParallelBuckets&) = delete;

  // Backward will not touch the gradients of parameters [first, end) again in this step.
  void mark_ready(size_t first, size_t end);
  // Completes every bucket's reduction (averaged over the group).
  void finish();
  size_t num_buckets() const { return buckets_.size(); }

  // ---- the distributed optimizer ----
  // A parameter's elements [begin, end) (flat, within the parameter) that this rank owns:
  // their reduced gradient (in the shard) and their values (in the parameter buffer).
  struct OwnedPiece {
    size_t param;
    int64_t begin, end;
    Tensor grad, value;
  };
  const std::vector<OwnedPiece>& owned_pieces() const { return owned_; }
  // After the optimizer updated the owned pieces: every rank receives every bucket's
  // parameters (at once, or in the background with overlap_param_gather).
  void gather_params();
  // --deterministic-mode's gradient norm: every rank receives every bucket's reduced
  // gradients from their owners into the gradient buffer, which then holds the bits the
  // all-reduce without the distributed optimizer leaves there (the same canonical sum).
  void gather_grads();
  // Parameters [first, end) are about to be read: waits for their buckets' gathers.
  void wait_params(size_t first, size_t end);
  void wait_all_params() { wait_params(0, layout_.params.size()); }
  // Checkpoints: per-piece values (one f32 tensor per owned piece, in owned_pieces() order,
  // such as an Adam moment) as the whole buffer in host memory, buffer: f32 [layout().numel]
  // (collective over the group; every rank receives the whole buffer, zeros in the padding;
  // Megatron's distrib_optim.pt is written from it); and back, each piece from its range of
  // a whole buffer.
  void gather_to_host(float* buffer, const std::vector<Tensor>& pieces);
  void scatter_from_host(const std::vector<Tensor>& pieces, const float* buffer) const;
  // Seconds the caller has spent blocked on this group's reductions and gathers since
  // construction: all of their time when they run synchronously, only what the overlaps
  // leave exposed otherwise (the benchmark's measure of how much they hide).
  double exposed_seconds() const { return exposed_seconds_; }
  // Bytes of the reduced-gradient shard this rank holds (1/DP of the buffer; 1/expert DP of
  // the experts' buckets).
  size_t shard_bytes() const { return shard_.bytes(); }
  const GradBufferLayout& layout() const { return layout_; }

 private:
  struct Bucket {
    Tensor grads;      // the bucket's range of the gradient buffer
    Tensor params;     // the bucket's range of the parameter buffer
    Tensor shard;      // this rank's reduced range (distributed optimizer)
    size_t num_params = 0;  // parameters it holds
    size_t pending = 0;  // parameters not yet ready this step
    Communicator* group = nullptr;  // dp, or expert_dp for the experts' buckets
    int64_t owned_begin = 0;        // this rank's owned range's start in the buffer
    std::unique_ptr<Work> reduce, gather;
  };
  void launch_reduce(Bucket& b);
  void reduce_in_canonical_order(Bucket& b);
  void wait_gather(Bucket& b);
  void wait_exposed(Work& work);

  GradBufferLayout layout_;
  Communicator& dp_;
  DataParallelOptions options_;
  bool deterministic_;  // the device's --deterministic-mode: sums in the canonical order
  Buffer shard_;  // F32, the owned range of every bucket in bucket order
  std::vector<Bucket> buckets_;
  std::vector<OwnedPiece> owned_;
  double exposed_seconds_ = 0;
};

}  // namespace tessera
