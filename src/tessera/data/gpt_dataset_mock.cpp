#include "tessera/data/gpt_dataset_mock.h"

#include <array>

#include "tessera/core/error.h"

namespace tessera::data {

namespace {

using u128 = unsigned __int128;

// numpy.random.SeedSequence(entropy) with no spawn key, pool size 4 (bit_generator.pyx).
class SeedSequence {
 public:
  explicit SeedSequence(uint64_t entropy) {
    std::vector<uint32_t> words;
    if (entropy == 0) words.push_back(0);
    while (entropy > 0) {
      words.push_back(static_cast<uint32_t>(entropy & 0xffffffffu));
      entropy >>= 32;
    }
    mix_entropy(words);
  }

  std::vector<uint32_t> generate_state32(size_t n_words) const {
    uint32_t hash_const = kInitB;
    std::vector<uint32_t> state(n_words);
    for (size_t i = 0; i < n_words; ++i) {
      uint32_t v = pool_[i % kPoolSize];
      v ^= hash_const;
      hash_const *= kMultB;
      v *= hash_const;
      v ^= v >> kXShift;
      state[i] = v;
    }
    return state;
  }

 private:
  static constexpr size_t kPoolSize = 4;
  static constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u;
  static constexpr uint32_t kInitB = 0x8b51f9ddu, kMultB = 0x58f38dedu;
  static constexpr uint32_t kMixMultL = 0xca01f9ddu, kMixMultR = 0x4973f715u;
  static constexpr int kXShift = 16;

  static uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    value ^= value >> kXShift;
    return value;
  }
  static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = kMixMultL * x - kMixMultR * y;
    r ^= r >> kXShift;
    return r;
  }
  void mix_entropy(const std::vector<uint32_t>& entropy) {
    uint32_t hash_const = kInitA;
    for (size_t i = 0; i < kPoolSize; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
    for (size_t src = 0; src < kPoolSize; ++src)
      for (size_t dst = 0; dst < kPoolSize; ++dst)
        if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
    for (size_t src = kPoolSize; src < entropy.size(); ++src)
      for (size_t dst = 0; dst < kPoolSize; ++dst) pool_[dst] = mix(pool_[dst], hashmix(entropy[src], hash_const));
  }
  std::array<uint32_t, kPoolSize> pool_{};
};

constexpr u128 kPcgMultiplier = (static_cast<u128>(0x2360ed051fc65da4ULL) << 64) | 0x4385df649fccf645ULL;

}  // namespace

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  std::vector<uint32_t> w = SeedSequence(seed).generate_state32(8);
  auto u64 = [&](int i) { return static_cast<uint64_t>(w[2 * i]) | (static_cast<uint64_t>(w[2 * i + 1]) << 32); };
  u128 initstate = (static_cast<u128>(u64(0)) << 64) | u64(1);
  u128 initseq = (static_cast<u128>(u64(2)) << 64) | u64(3);
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMultiplier + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMultiplier + inc_;
}

uint64_t NumpyPcg64::next_uint64() {
  state_ = state_ * kPcgMultiplier + inc_;
  uint64_t hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
  unsigned rot = static_cast<unsigned>(hi >> 58);
  uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

int32_t NumpyPcg64::integers_int32(int32_t low, int32_t high) {
  TESSERA_CHECK(high > low, "integers: empty range");
  uint32_t rng = static_cast<uint32_t>(static_cast<int64_t>(high) - 1 - low);  // closed interval width
  if (rng == 0) return low;
  if (rng == 0xffffffffu) return static_cast<int32_t>(static_cast<uint32_t>(low) + next_uint32());
  // buffered_bounded_lemire_uint32
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(next_uint32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m & 0xffffffffu);
  if (leftover < rng_excl) {
    const uint32_t threshold = (0xffffffffu - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(next_uint32()) * rng_excl;
      leftover = static_cast<uint32_t>(m & 0xffffffffu);
    }
  }
  return static_cast<int32_t>(static_cast<uint32_t>(low) + static_cast<uint32_t>(m >> 32));
}

std::vector<int32_t> numpy_default_rng_integers_int32(uint64_t seed, int32_t low, int32_t high, int64_t n) {
  NumpyPcg64 rng(seed);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& v : out) v = rng.integers_int32(low, high);
  return out;
}

MockLowLevelDataset::MockLowLevelDataset(int64_t eod_id)
    : lengths_(numpy_default_rng_integers_int32(kSeed, 1, kMaxSequenceLength, kSize)), eod_id_(eod_id) {}

void MockLowLevelDataset::read_tokens(uint64_t i, uint64_t offset, uint64_t count, int32_t* out) const {
  int64_t len = lengths_.at(i);
  TESSERA_CHECK(offset + count <= static_cast<uint64_t>(len), "mock read past the end of a sequence");
  for (uint64_t k = 0; k < count; ++k) {
    int64_t j = static_cast<int64_t>(offset + k);
    out[k] = static_cast<int32_t>(j == len - 1 ? eod_id_ : j + 1);
  }
}

}  // namespace tessera::data
