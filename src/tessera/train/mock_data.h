// --mock-data: synthetic documents shaped like Megatron's mock dataset (megatron.md §4.11):
// 100,000 documents of length 1..4095, each the tokens 1..len-1 followed by EOD, with ids
// reduced modulo the vocabulary so small vocabularies work. Lengths come from the
// counter-based RNG (not numpy's draws). Documents are concatenated and cut into samples of
// seq_length + 1 tokens that overlap by one token, as Megatron's sample index does.
#pragma once

#include <vector>

#include "tessera/train/sample_source.h"

namespace tessera {

class MockSamples final : public SampleSource {
 public:
  MockSamples(int seq_length, int vocab_size, uint32_t seed);
  void fill(int64_t index, int32_t* tokens) override;

 private:
  int32_t token_at(int64_t position) const;
  int seq_length_;
  int vocab_size_;
  std::vector<int64_t> doc_start_;  // prefix sums; last entry = total tokens
};

}  // namespace tessera
