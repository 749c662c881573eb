#include "tessera/core/mt19937.h"

#include <algorithm>
#include <numeric>

namespace tessera {

namespace {
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfU;
constexpr uint32_t kUpperMask = 0x80000000U;
constexpr uint32_t kLowerMask = 0x7fffffffU;
}  // namespace

Mt19937RandomState::Mt19937RandomState(uint32_t s) { seed(s); }

void Mt19937RandomState::seed(uint32_t s) {
  for (int i = 0; i < kStateSize; ++i) {
    key_[i] = s;
    s = 1812433253U * (s ^ (s >> 30)) + static_cast<uint32_t>(i + 1);
  }
  pos_ = kStateSize;
}

void Mt19937RandomState::seed_by_array(std::span<const uint32_t> words) {
  seed(19650218U);
  const size_t n = std::max<size_t>(words.size(), 1);
  auto word = [&](size_t j) { return words.empty() ? 0U : words[j]; };
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kStateSize, n); k > 0; --k) {
    key_[i] = (key_[i] ^ ((key_[i - 1] ^ (key_[i - 1] >> 30)) * 1664525U)) + word(j) + static_cast<uint32_t>(j);
    if (++i >= kStateSize) {
      key_[0] = key_[kStateSize - 1];
      i = 1;
    }
    if (++j >= n) j = 0;
  }
  for (int k = kStateSize - 1; k > 0; --k) {
    key_[i] = (key_[i] ^ ((key_[i - 1] ^ (key_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
    if (++i >= kStateSize) {
      key_[0] = key_[kStateSize - 1];
      i = 1;
    }
  }
  key_[0] = 0x80000000U;  // non-zero initial state
  pos_ = kStateSize;
}

void Mt19937RandomState::generate() {
  int i = 0;
  for (; i < kStateSize - kM; ++i) {
    uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
    key_[i] = key_[i + kM] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  }
  for (; i < kStateSize - 1; ++i) {
    uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
    key_[i] = key_[i + (kM - kStateSize)] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  }
  uint32_t y = (key_[kStateSize - 1] & kUpperMask) | (key_[0] & kLowerMask);
  key_[kStateSize - 1] = key_[kM - 1] ^ (y >> 1) ^ ((y & 1U) ? kMatrixA : 0U);
  pos_ = 0;
}

uint32_t Mt19937RandomState::next_uint32() {
  if (pos_ == kStateSize) generate();
  uint32_t y = key_[pos_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= (y >> 18);
  return y;
}

uint64_t Mt19937RandomState::next_uint64() {
  uint64_t first = next_uint32();
  uint64_t second = next_uint32();
  return (first << 32) | second;
}

double Mt19937RandomState::random_sample() {
  int32_t a = static_cast<int32_t>(next_uint32() >> 5);
  int32_t b = static_cast<int32_t>(next_uint32() >> 6);
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

uint64_t Mt19937RandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

std::vector<int64_t> Mt19937RandomState::permutation(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n < 0 ? 0 : n));
  std::iota(out.begin(), out.end(), int64_t{0});
  shuffle(out);
  return out;
}

}  // namespace tessera
