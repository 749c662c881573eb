#include "tessera/train/batch_loader.h"

#include <utility>

namespace tessera {

BatchLoader::BatchLoader(SampleSource& source, int seq_length, SamplerLayout layout, MicroBatchCount micro_batches_at)
    : source_(source), row_(seq_length + 1), layout_(layout), micro_batches_at_(std::move(micro_batches_at)) {
  const size_t size = static_cast<size_t>(layout.num_microbatches * layout.micro_batch * row_);
  current_.resize(size);
  next_.resize(size);
  thread_ = std::thread([this] { worker(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t BatchLoader::micro_batches_at(int64_t consumed) const {
  return micro_batches_at_ ? micro_batches_at_(consumed) : layout_.num_microbatches;
}

void BatchLoader::fill(std::vector<int32_t>& out, int64_t consumed) {
  int32_t* row = out.data();
  const int64_t micro_batches = micro_batches_at(consumed);
  for (int64_t m = 0; m < micro_batches; ++m)
    for (int64_t b = 0; b < layout_.micro_batch; ++b, row += row_)
      source_.fill(layout_.sample_index(consumed, m, b), row);
}

void BatchLoader::worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || requested_ >= 0; });
    if (stop_) return;
    const int64_t start = requested_;
    requested_ = -1;
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      fill(next_, start);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    ready_ = error ? -1 : start;
    error_ = error;
    error_start_ = start;
    cv_.notify_all();
  }
}

const std::vector<int32_t>& BatchLoader::global_batch(int64_t consumed) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !busy_ && requested_ < 0; });  // the worker is idle
  if (error_ && error_start_ == consumed) std::rethrow_exception(std::exchange(error_, nullptr));
  error_ = nullptr;
  if (ready_ == consumed) {
    std::swap(current_, next_);
  } else {
    fill(current_, consumed);  // not prefetched (first batch, or a jump such as a resume)
  }
  ready_ = -1;
  requested_ = consumed + micro_batches_at(consumed) * layout_.micro_batch * layout_.dp_size;
  cv_.notify_all();
  return current_;
}

}  // namespace tessera
