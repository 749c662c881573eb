#include "tessera/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>

#include "tessera/comm/ordered_sum.h"
#include "tessera/core/error.h"
#include "tessera/device/device.h"
#include "tessera/ops/ops.h"

namespace tessera {

namespace {

// Elements [begin, end) of a flat buffer tensor.
Tensor flat_range(const Tensor& buffer, int64_t begin, int64_t end) {
  return Tensor(buffer.handle, buffer.offset + static_cast<size_t>(begin) * dtype_size(buffer.dtype), buffer.dtype,
                {end - begin}, buffer.device);
}

}  // namespace

DataParallelBuckets::DataParallelBuckets(const GradBufferLayout& layout, Tensor grad_buffer, Tensor param_buffer,
                                         Communicator& dp, const DataParallelOptions& options, Device& device,
                                         Communicator* expert_dp)
    : layout_(layout), dp_(dp), options_(options), deterministic_(device.deterministic_mode()) {
  TESSERA_CHECK(grad_buffer.dtype == DType::F32 && grad_buffer.numel() == layout.numel &&
                    param_buffer.numel() == layout.numel,
                "data parallelism: the buffers do not match their layout");
  TESSERA_CHECK(!options.distributed_optimizer || layout.data_parallel == dp.size(),
                "data parallelism: the buffer was laid out for another data-parallel size");
  for (const GradBufferLayout::Bucket& lb : layout.buckets)
    TESSERA_CHECK(!lb.expert || (expert_dp && (!options.distributed_optimizer ||
                                               layout.expert_data_parallel == expert_dp->size())),
                  "data parallelism: the experts' buckets need the expert data-parallel group they were laid out for");
  TESSERA_CHECK(!options.overlap_param_gather || options.distributed_optimizer,
                "--overlap-param-gather needs the distributed optimizer");
  Tensor shard_all;
  if (options.distributed_optimizer) {
    int64_t shard_numel = 0;
    for (size_t bi = 0; bi < layout.buckets.size(); ++bi) shard_numel += layout.buckets[bi].numel() / layout.group_size(bi);
    shard_ = Buffer(device, static_cast<size_t>(shard_numel) * sizeof(float));
    shard_all = tensor_at(shard_, 0, DType::F32, {shard_numel});
  }
  int64_t shard_at = 0;
  for (size_t bi = 0; bi < layout.buckets.size(); ++bi) {
    const GradBufferLayout::Bucket& lb = layout.buckets[bi];
    Bucket b;
    b.grads = flat_range(grad_buffer, lb.start, lb.end);
    b.params = flat_range(param_buffer, lb.start, lb.end);
    b.group = lb.expert ? expert_dp : &dp;
    for (size_t p = lb.first_param; p < lb.end_param; ++p) b.num_params += layout.params[p].bucket == bi;
    b.pending = b.num_params;
    if (options.distributed_optimizer) {
      const int group_size = b.group->size();
      TESSERA_CHECK(lb.numel() % group_size == 0, "a bucket's size is not a multiple of the data-parallel size");
      const int64_t own_begin = layout.owned_begin(bi, b.group->rank()), own_end = layout.owned_end(bi, b.group->rank());
      b.owned_begin = own_begin;
      b.shard = flat_range(shard_all, shard_at, shard_at + (own_end - own_begin));
      for (size_t p = lb.first_param; p < lb.end_param; ++p) {
        const GradBufferLayout::Param& lp = layout.params[p];
        if (lp.bucket != bi) continue;  // the other kind's (expert parallelism)
        const int64_t lo = std::max(lp.start, own_begin), hi = std::min(lp.start + lp.numel, own_end);
        if (lo >= hi) continue;
        const int64_t in_shard = shard_at - own_begin;  // shard position of buffer element 0
        owned_.push_back({p, lo - lp.start, hi - lp.start, flat_range(shard_all, in_shard + lo, in_shard + hi),
                          flat_range(param_buffer, lo, hi)});
      }
      shard_at += own_end - own_begin;
    }
    buckets_.push_back(std::move(b));
  }
  // Pieces in registration order, as the optimizer lists parameters.
  std::stable_sort(owned_.begin(), owned_.end(),
                   [](const OwnedPiece& a, const OwnedPiece& b) { return a.param < b.param; });
}

DataParallelBuckets::~DataParallelBuckets() {
  for (Bucket& b : buckets_)
    for (std::unique_ptr<Work>* work : {&b.reduce, &b.gather}) {
      if (!*work) continue;
      try {
        (*work)->wait();
      } catch (const std::exception&) {
        // Unwinding from the failure that stopped the step: that error is the one to report.
      }
    }
}

// Megatron scales before the sum (gradient_scaling_factor = 1/DP), so the reduction adds
// averages and the result needs no second pass.
void DataParallelBuckets::launch_reduce(Bucket& b) {
  wait_gather(b);  // the gather reads its source from the shard this reduction writes
  if (deterministic_) return reduce_in_canonical_order(b);
  ops::scale_inplace(b.grads, 1.0f / static_cast<float>(dp_.size()));
  b.reduce = options_.distributed_optimizer ? b.group->reduce_scatter_async(b.shard, b.grads, ReduceOp::Sum)
                                            : b.group->all_reduce_async(b.grads, ReduceOp::Sum);
}

// --deterministic-mode: every element summed over the group's ranks in one order that does not
// depend on the layout (comm/ordered_sum.h), synchronously, then scaled: the sum first, so the
// result's bits do not depend on where the sum was split even when 1/DP is not a power of two.
void DataParallelBuckets::reduce_in_canonical_order(Bucket& b) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options_.distributed_optimizer) ordered_reduce_scatter_sum(*b.group, b.shard, b.grads);
  else ordered_all_reduce_sum(*b.group, b.grads);
  ops::scale_inplace(options_.distributed_optimizer ? b.shard : b.grads, 1.0f / static_cast<float>(dp_.size()));
  exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.reduce = std::make_unique<comm_detail::FinishedWork>();
}

void DataParallelBuckets::mark_ready(size_t first, size_t end) {
  if (!options_.overlap_grad_reduce) return;
  for (size_t i = first; i < end; ++i) {
    Bucket& b = buckets_[layout_.params[i].bucket];
    TESSERA_CHECK(b.pending > 0, "a parameter was reported ready twice in one step");
    if (--b.pending == 0) launch_reduce(b);
  }
}

void DataParallelBuckets::finish() {
  for (Bucket& b : buckets_)
    if (!b.reduce) launch_reduce(b);  // not overlapped, or not reported ready
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    wait_exposed(*b.reduce);
    b.reduce.reset();
    b.pending = b.num_params;
  }
}

// The owned range of the parameter buffer is copied into the shard (free once the optimizer
// has read the gradients), so the gather's input never aliases its output. Buckets are
// gathered in the order the forward reads them, the last bucket (the first layers) first,
// as Megatron dispatches them: the group runs its collectives one after another, so the
// forward's first wait then covers one bucket, not all of them.
void DataParallelBuckets::gather_params() {
  TESSERA_CHECK(options_.distributed_optimizer, "gather_params without the distributed optimizer");
  for (size_t bi = buckets_.size(); bi-- > 0;) {
    Bucket& b = buckets_[bi];
    const int64_t n = b.shard.numel();
    const Tensor source(b.shard.handle, b.shard.offset, b.params.dtype, {n}, b.shard.device);
    const int64_t own = b.owned_begin - layout_.buckets[bi].start;
    copy_tensor(source, flat_range(b.params, own, own + n));
    b.gather = b.group->all_gather_async(b.params, source);
    if (!options_.overlap_param_gather) wait_gather(b);
  }
}

void DataParallelBuckets::gather_grads() {
  TESSERA_CHECK(options_.distributed_optimizer, "gather_grads without the distributed optimizer");
  for (Bucket& b : buckets_) wait_exposed(*b.group->all_gather_async(b.grads, b.shard));
}

void DataParallelBuckets::wait_gather(Bucket& b) {
  if (!b.gather) return;
  wait_exposed(*b.gather);
  b.gather.reset();
}

// Every wait of a step passes here; launching only queues the call.
void DataParallelBuckets::wait_exposed(Work& work) {
  const auto t0 = std::chrono::steady_clock::now();
  work.wait();
  exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DataParallelBuckets::wait_params(size_t first, size_t end) {
  if (first >= end) return;
  for (size_t p = first; p < end; ++p) wait_gather(buckets_[layout_.params[p].bucket]);
}

// The shard is laid out as the owned ranges of the buckets in order, so a piece's position
// in it is its gradient's.
void DataParallelBuckets::gather_to_host(float* buffer, const std::vector<Tensor>& pieces) {
  TESSERA_CHECK(pieces.size() == owned_.size(), "gather_to_host: one tensor per owned piece");
  std::vector<float> shard(shard_.bytes() / sizeof(float), 0.0f);
  for (size_t j = 0; j < owned_.size(); ++j)
    copy_to_host(shard.data() + owned_[j].grad.offset / sizeof(float), pieces[j].bytes(), pieces[j]);
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const GradBufferLayout::Bucket& lb = layout_.buckets[bi];
    b.group->all_gather(Tensor(buffer + lb.start, DType::F32, {lb.numel()}, nullptr),
                   Tensor(shard.data() + b.shard.offset / sizeof(float), DType::F32, {b.shard.numel()}, nullptr));
  }
}

void DataParallelBuckets::scatter_from_host(const std::vector<Tensor>& pieces, const float* buffer) const {
  TESSERA_CHECK(pieces.size() == owned_.size(), "scatter_from_host: one tensor per owned piece");
  for (size_t j = 0; j < owned_.size(); ++j) {
    const OwnedPiece& p = owned_[j];
    copy_from_host(pieces[j], buffer + layout_.params[p.param].start + p.begin, pieces[j].bytes());
  }
}

}  // namespace tessera
