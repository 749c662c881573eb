#include "tessera/parallel/grad_buffer_layout.h"

#include <algorithm>
#include <numeric>

#include "tessera/core/error.h"

namespace tessera {

namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Lays out the parameters `order` (registration indices, descending) from the layout's end,
// in buckets of one kind.
void lay_out(GradBufferLayout& layout, const std::vector<size_t>& order, const std::vector<int64_t>& numels,
             const GradBufferOptions& o, const std::vector<bool>& own_bucket, const std::vector<int>& chunks,
             bool expert) {
  auto chunk = [&](size_t i) { return chunks.empty() ? 0 : chunks[i]; };
  const int dp = expert ? o.expert_data_parallel : o.data_parallel;
  const int64_t param_align = o.distributed_optimizer ? 64 : o.dense_alignment;
  const int64_t bucket_align = o.distributed_optimizer ? std::lcm(int64_t{dp}, int64_t{128}) : 1;
  const bool split_shared = o.distributed_optimizer && !own_bucket.empty();
  int64_t bucket_start = layout.numel, param_start = layout.numel, param_end = layout.numel;
  size_t open = 0;           // parameters in the open bucket
  size_t bucket_end_param = 0;  // one past the open bucket's first-placed (highest) registration index
  // Closes the open bucket at `end` (its last parameter's end), padded; the next starts there.
  auto close = [&](size_t first_param, int64_t end) {
    GradBufferLayout::Bucket b;
    b.start = bucket_start;
    b.numel_unpadded = end - bucket_start;
    b.end = round_up(end, bucket_align);
    b.first_param = first_param;
    b.end_param = bucket_end_param;
    b.expert = expert;
    layout.buckets.push_back(b);
    bucket_start = param_start = b.end;
    open = 0;
  };
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    // A new chunk's buffer: the open bucket (the later chunk's) ends at its last parameter.
    if (open > 0 && chunk(i) != chunk(order[k - 1])) close(order[k - 1], param_start);
    const bool alone = split_shared && own_bucket[i];
    param_start = round_up(param_start, param_align);
    // The open bucket ends where this parameter would start (Megatron's padded start).
    if (alone && open > 0) close(order[k - 1], param_start);
    if (open == 0) bucket_end_param = i + 1;
    param_end = param_start + numels[i];
    layout.params[i] = {param_start, numels[i], layout.buckets.size()};
    ++open;
    if (alone || (chunk(i) == 0 && param_end - bucket_start >= o.bucket_size))
      close(i, param_end);
    else
      param_start = param_end;
  }
  if (open > 0) close(order.back(), param_end);
  layout.numel = layout.buckets.empty() ? 0 : layout.buckets.back().end;
}

}  // namespace

GradBufferLayout build_grad_buffer_layout(const std::vector<int64_t>& numels, const GradBufferOptions& o,
                                          const std::vector<bool>& own_bucket, const std::vector<int>& chunks,
                                          const std::vector<bool>& expert) {
  TESSERA_CHECK(o.data_parallel >= 1 && o.expert_data_parallel >= 1 && o.bucket_size >= 1,
                "grad buffer: bad data-parallel size or bucket size");
  TESSERA_CHECK(own_bucket.empty() || own_bucket.size() == numels.size(),
                "grad buffer: one own_bucket flag per parameter");
  TESSERA_CHECK(expert.empty() || expert.size() == numels.size(), "grad buffer: one expert flag per parameter");
  TESSERA_CHECK(chunks.empty() || (chunks.size() == numels.size() && std::is_sorted(chunks.begin(), chunks.end())),
                "grad buffer: one non-decreasing chunk index per parameter");
  GradBufferLayout layout;
  layout.data_parallel = o.data_parallel;
  layout.expert_data_parallel = o.expert_data_parallel;
  layout.params.resize(numels.size());
  std::vector<size_t> dense, experts;
  for (size_t i = numels.size(); i-- > 0;) (!expert.empty() && expert[i] ? experts : dense).push_back(i);
  lay_out(layout, dense, numels, o, own_bucket, chunks, false);
  lay_out(layout, experts, numels, o, own_bucket, chunks, true);
  return layout;
}

}  // namespace tessera
