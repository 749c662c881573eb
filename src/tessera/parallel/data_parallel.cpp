#include "tessera/parallel/data_parallel.h"

#include "tessera/core/error.h"
#include "tessera/ops/ops.h"

namespace tessera {

GradBuckets::GradBuckets(std::vector<Tensor> grads, Communicator& dp, int64_t bucket_elements, bool overlap)
    : grads_(std::move(grads)), dp_(dp), overlap_(overlap), bucket_of_(grads_.size()) {
  auto close = [&](size_t first, size_t end) {
    // Parameters [first, end) are adjacent in the slab: the bucket is the byte range from
    // the first one's start to the last one's end, in the same device buffer.
    const Tensor& head = grads_[first];
    const size_t lo = head.offset, hi = grads_[end - 1].offset + grads_[end - 1].bytes();
    for (size_t i = first; i < end; ++i) {
      TESSERA_CHECK(grads_[i].handle == head.handle && grads_[i].offset >= lo && grads_[i].offset + grads_[i].bytes() <= hi,
                    "gradients are not laid out in registration order in one slab");
      bucket_of_[i] = buckets_.size();
    }
    const int64_t n = static_cast<int64_t>((hi - lo) / sizeof(float));
    buckets_.push_back({first, end, Tensor(head.handle, lo, DType::F32, {n}, head.device), 0, nullptr});
  };
  // Backward produces the last parameters first, so buckets are cut from the end.
  size_t end = grads_.size();
  int64_t elements = 0;
  for (size_t i = grads_.size(); i-- > 0;) {
    elements += grads_[i].numel();
    if (elements >= bucket_elements || i == 0) {
      close(i, end);
      end = i;
      elements = 0;
    }
  }
  for (Bucket& b : buckets_) b.pending = b.end_param - b.first_param;
}

void GradBuckets::launch(Bucket& b) { b.work = dp_.all_reduce_async(b.flat, ReduceOp::Sum); }

void GradBuckets::mark_ready(size_t first, size_t end) {
  if (!overlap_) return;
  for (size_t i = first; i < end; ++i) {
    Bucket& b = buckets_[bucket_of_[i]];
    TESSERA_CHECK(b.pending > 0, "a parameter was reported ready twice in one step");
    if (--b.pending == 0) launch(b);
  }
}

void GradBuckets::finish() {
  for (Bucket& b : buckets_) {
    if (!b.work) launch(b);  // not overlapped, or not reported ready
  }
  const float scale = 1.0f / static_cast<float>(dp_.size());
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
    ops::scale_inplace(b.flat, scale);
    b.pending = b.end_param - b.first_param;
  }
}

}  // namespace tessera
