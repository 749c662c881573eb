// Prefetches the next global batch's samples on a background thread while the current one
// trains. The samples a data-parallel rank reads follow Megatron's MegatronPretrainingSampler
// (megatron/legacy/data/data_samplers.py): global indices are consumed in order from
// `consumed`, in blocks of micro_batch × dp_size, and DP rank r takes positions
// [r·mbs, (r+1)·mbs) of each block.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/train/sample_source.h"

namespace tessera {

struct SamplerLayout {
  int64_t micro_batch = 1;
  int64_t num_microbatches = 1;
  int64_t dp_size = 1;
  int64_t dp_rank = 0;
  int64_t global_batch() const { return micro_batch * num_microbatches * dp_size; }
  // Global index of sample b of micro-batch m of the batch starting at `consumed`.
  int64_t sample_index(int64_t consumed, int64_t m, int64_t b) const {
    return consumed + m * micro_batch * dp_size + dp_rank * micro_batch + b;
  }
};

class BatchLoader {
 public:
  // layout.num_microbatches is the most a batch has; with --rampup-batch-size,
  // micro_batches_at(consumed) gives the count of the batch starting at `consumed`.
  using MicroBatchCount = std::function<int64_t(int64_t consumed)>;
  BatchLoader(SampleSource& source, int seq_length, SamplerLayout layout, MicroBatchCount micro_batches_at = nullptr);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // This rank's samples of the global batch that starts at `consumed`, as
  // [micro-batches * micro_batch, seq_length + 1] token ids; starts prefetching the batch
  // after it. The reference stays valid until the next call.
  const std::vector<int32_t>& global_batch(int64_t consumed);

 private:
  int64_t micro_batches_at(int64_t consumed) const;
  void fill(std::vector<int32_t>& out, int64_t consumed);
  void worker();

  SampleSource& source_;
  const int row_;
  const SamplerLayout layout_;
  const MicroBatchCount micro_batches_at_;
  std::vector<int32_t> current_, next_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t requested_ = -1;  // batch start the worker should fill into next_
  int64_t ready_ = -1;      // batch start next_ holds
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;  // a failed prefetch, reported if that batch is asked for
  int64_t error_start_ = -1;
  std::thread thread_;
};

}  // namespace tessera
