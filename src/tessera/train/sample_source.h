// Where training samples come from: sample i is seq_length + 1 token ids (inputs are the
// first seq_length, labels the last seq_length), as Megatron's GPT dataset returns them.
#pragma once

#include <cstdint>

#include "tessera/data/gpt_dataset.h"

namespace tessera {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual void fill(int64_t index, int32_t* tokens) = 0;  // writes seq_length + 1 ids
};

// The splits to read samples from (valid and test may be absent), and how loss masks and
// position ids follow from a sample's tokens (gpt_dataset.py's _get_ltor_masks_and_position_ids).
struct DataSources {
  SampleSource* train = nullptr;
  SampleSource* valid = nullptr;
  SampleSource* test = nullptr;
  data::LtorOptions masks;
};

}  // namespace tessera
