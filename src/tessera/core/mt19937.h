// MT19937 exactly as numpy's legacy `numpy.random.RandomState` uses it: the dataset shuffles
// of Megatron's GPT dataset (megatron/core/datasets/gpt_dataset.py) are drawn from
// `RandomState(seed)`, so the same draws here give the same document and shuffle indices,
// bit for bit.
//
//   seeding      RandomState(int seed) = init_genrand(seed) (numpy's mt19937_seed), the same
//                state as std::mt19937(seed); seeds outside [0, 2^32) are numpy's ValueError.
//   next_uint32  the tempered 32-bit output (numpy's mt19937_next32).
//   next_uint64  (first << 32) | second, as numpy's mt19937_next64.
//   random_sample numpy's next_double: (a >> 5, b >> 6) -> (a * 2^26 + b) / 2^53.
//   random_interval(max) numpy's random_interval: uniform in [0, max] by masked rejection
//                (32-bit draws while max <= 2^32 - 1, else 64-bit draws).
//   shuffle      RandomState.shuffle of a 1-D array: Fisher-Yates from the end, j =
//                random_interval(i) for i = n-1 down to 1; independent of the element type.
//   permutation  RandomState.permutation(n): arange(n) (int64) shuffled.
// Verified against numpy 1.24 by tests/unit/data/gpt_dataset_test.cpp and
// tests/reference/data/gpt_dataset_reference.py.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace tessera {

class Mt19937RandomState {
 public:
  static constexpr int kStateSize = 624;

  explicit Mt19937RandomState(uint32_t seed);
  void seed(uint32_t seed);
  // CPython's random.seed(n) for an int n: init_by_array over |n|'s 32-bit words, least
  // significant first (Modules/_randommodule.c random_seed / init_by_array).
  void seed_by_array(std::span<const uint32_t> words);

  // The state as getstate() functions show it: the 624 words and the next word's position.
  const std::array<uint32_t, kStateSize>& key() const { return key_; }
  int position() const { return pos_; }

  uint32_t next_uint32();
  uint64_t next_uint64();
  double random_sample();
  uint64_t random_interval(uint64_t max);

  template <class T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size(); i-- > 1;) {
      size_t j = static_cast<size_t>(random_interval(i));
      std::swap(values[i], values[j]);
    }
  }
  template <class T>
  void shuffle(std::vector<T>& values) {
    shuffle(std::span<T>(values));
  }
  std::vector<int64_t> permutation(int64_t n);

 private:
  void generate();
  std::array<uint32_t, kStateSize> key_{};
  int pos_ = kStateSize;
};

}  // namespace tessera
