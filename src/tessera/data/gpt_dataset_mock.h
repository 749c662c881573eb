// --mock-data exactly as Megatron's MockGPTLowLevelDataset (megatron/core/datasets/
// gpt_dataset.py): 100,000 sequences whose lengths are
// numpy.random.default_rng(0).integers(1, 4096, size=100000, dtype=int32), sequence i being
// the tokens 1, 2, ..., len-1 followed by EOD.
//
// numpy's Generator is reproduced here bit for bit: SeedSequence(seed) -> generate_state(4,
// uint64) -> PCG64 (128-bit LCG, XSL-RR output, 32-bit draws taken low half first from a
// buffered 64-bit draw) -> Lemire's bounded integers for int32 (`integers` with
// endpoint=False). Checked against numpy 1.24 in the tests.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/data/gpt_dataset.h"

namespace tessera::data {

// numpy.random.PCG64(SeedSequence(seed)) for an integer seed that fits in 128 bits (here: 64).
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t seed);
  uint64_t next_uint64();
  uint32_t next_uint32();
  // Generator.integers(low, high, dtype=int32) for one value: uniform in [low, high).
  int32_t integers_int32(int32_t low, int32_t high);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.random.default_rng(seed).integers(low, high, size=n, dtype=numpy.int32).
std::vector<int32_t> numpy_default_rng_integers_int32(uint64_t seed, int32_t low, int32_t high, int64_t n);

class MockLowLevelDataset final : public LowLevelDataset {
 public:
  static constexpr int64_t kSize = 100000;
  static constexpr int32_t kMaxSequenceLength = 4096;
  static constexpr uint64_t kSeed = 0;

  explicit MockLowLevelDataset(int64_t eod_id);
  uint64_t sequence_count() const override { return lengths_.size(); }
  int32_t sequence_length(uint64_t i) const override { return lengths_[i]; }
  void read_tokens(uint64_t i, uint64_t offset, uint64_t count, int32_t* out) const override;
  std::optional<std::string> path_prefix() const override { return std::nullopt; }

 private:
  std::vector<int32_t> lengths_;
  int64_t eod_id_;
};

}  // namespace tessera::data
