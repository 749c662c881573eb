#include "tessera/train/mock_data.h"

#include <algorithm>

#include "tessera/core/rng.h"

namespace tessera {

namespace {
constexpr int kMockDocuments = 100000;
constexpr int kMaxDocumentLength = 4095;
}  // namespace

MockSamples::MockSamples(int seq_length, int vocab_size, uint32_t seed)
    : seq_length_(seq_length), vocab_size_(vocab_size) {
  doc_start_.reserve(kMockDocuments + 1);
  int64_t total = 0;
  for (uint32_t d = 0; d < kMockDocuments; ++d) {
    doc_start_.push_back(total);
    Philox4x32 r = philox4x32(seed, static_cast<uint32_t>(RngStream::MockData), {d, 0, 0, 0});
    total += 1 + r[0] % kMaxDocumentLength;
  }
  doc_start_.push_back(total);
}

int32_t MockSamples::token_at(int64_t position) const {
  position %= doc_start_.back();
  auto it = std::upper_bound(doc_start_.begin(), doc_start_.end(), position) - 1;
  const int64_t offset = position - *it, length = *(it + 1) - *it;
  const int32_t eod = vocab_size_ - 1;
  if (offset == length - 1) return eod;
  return static_cast<int32_t>((offset + 1) % eod);
}

void MockSamples::fill(int64_t index, int32_t* tokens) {
  const int64_t start = index * seq_length_;
  for (int t = 0; t <= seq_length_; ++t) tokens[t] = token_at(start + t);
}

}  // namespace tessera
