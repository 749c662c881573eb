// Where training samples come from: sample i is seq_length + 1 token ids (inputs are the
// first seq_length, labels the last seq_length), as Megatron's GPT dataset returns them.
#pragma once

#include <cstdint>

namespace tessera {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual void fill(int64_t index, int32_t* tokens) = 0;  // writes seq_length + 1 ids
};

}  // namespace tessera
