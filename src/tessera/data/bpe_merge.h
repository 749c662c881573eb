// The byte-level BPE core that GPT-2's tokenizer and Hugging Face's byte-level BPE share:
// GPT-2's byte-to-unicode alphabet, the merge table, the merge loop itself, and a bounded
// cache of merged pre-tokens.
//
// The merge loop is GPT-2's (megatron/training/tokenizer/gpt2_tokenization.py bpe()): each
// round merges every non-overlapping occurrence of the lowest-ranked pair, left to right.
// Hugging Face's BPE (tokenizers' `Word::merge_all`) pops one (rank, position) at a time
// instead; the two give the same result because a merge never recreates its own pair (the
// merged symbol is longer than either part), so the occurrences of one pair are merged left
// to right in both.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// GPT-2's byte-to-unicode map: printable Latin-1 bytes map to themselves, the others to
// U+0100 and up, in byte order.
std::array<char32_t, 256> byte_level_alphabet();

namespace bpe_detail {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

inline uint64_t load64(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

inline uint64_t load32(const char* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// The first min(n, 8) bytes at p as one little-endian word, zero-padded, reading only those
// bytes. Built from fixed-size loads: copying a variable number of bytes into a word and then
// reading it stalls on store forwarding, which cost about a third of each cache hit.
inline uint64_t load_prefix(const char* p, size_t n) {
  static_assert(std::endian::native == std::endian::little);
  if (n >= 8) return load64(p);
  if (n >= 4) return load32(p) | (load32(p + n - 4) << (8 * (n - 4)));  // two overlapping halves
  if (n == 0) return 0;
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint64_t{u[0]} | (uint64_t{u[n / 2]} << (8 * (n / 2))) | (uint64_t{u[n - 1]} << (8 * (n - 1)));
}

inline uint64_t hash_seed(size_t n) { return 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull); }

// The hash of bytes past their first 8, continuing from h (the hash of the first 8).
inline uint64_t hash_tail(uint64_t h, const char* p, size_t n) {
  for (; n > 8; p += 8, n -= 8) h = mix64(h ^ load64(p));
  return mix64(h ^ load64(p + n - 8));  // the last 8 bytes, overlapping the previous word
}

}  // namespace bpe_detail

// 64-bit hash of a byte string; never 0.
inline uint64_t hash_bytes(const char* p, size_t n) {
  const uint64_t h = bpe_detail::mix64(bpe_detail::hash_seed(n) ^ bpe_detail::load_prefix(p, n));
  return (n <= 8 ? h : bpe_detail::hash_tail(h, p + 8, n - 8)) | 1;
}

// Merge ranks keyed by the pair of symbol ids; open addressing, linear probing.
class MergeTable {
 public:
  struct Merge {
    int32_t rank;    // the merge's line: lower merges first
    int32_t merged;  // the symbol the pair becomes
  };
  void reserve(size_t n);
  void set(int32_t a, int32_t b, Merge m);  // a pair set twice keeps the later merge (Python dict)
  const Merge* find(int32_t a, int32_t b) const;

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t mask_ = 0;
};

// Merges the symbols of `word` in place: the round-based loop for short words, the same
// rounds driven by a heap (O(n log n)) for words longer than kHeapThreshold symbols.
void bpe_merge(const MergeTable& merges, std::vector<int32_t>& word);
inline constexpr size_t kHeapThreshold = 64;
// The two algorithms on their own, for tests.
void bpe_merge_rounds(const MergeTable& merges, std::vector<int32_t>& word);
void bpe_merge_heap(const MergeTable& merges, std::vector<int32_t>& word);

// Token ids per pre-token, keyed by its bytes. Bounded: cleared when full. Not thread-safe;
// one per tokenizer clone.
//
// Built for the hit, which is most pre-tokens of real text: a slot holds the key's first 8
// bytes and up to two ids itself, so a short pre-token's hit reads one cache line of the table
// and nothing else; a batch of pre-tokens has all its slots fetched before the first lookup,
// so their memory latencies overlap instead of adding up.
class PretokenCache {
 public:
  // byte_ids: the token of each single byte, which is a one-byte pre-token's only token.
  explicit PretokenCache(const std::array<int32_t, 256>& byte_ids);

  // Appends the ids of each piece, in order, to `out`: the cached ones, or those that
  // merge(piece, ids) appends to its empty `ids`, which are then cached (an empty piece has
  // none). The pieces must stay valid until this returns.
  template <class Merge>
  void append_ids(std::span<const std::string_view> pieces, std::vector<int32_t>& out, Merge&& merge) {
    while (!pieces.empty()) {
      const size_t n = std::min(pieces.size(), kBatch);
      Key keys[kBatch];
      for (size_t i = 0; i < n; ++i) {
        if (pieces[i].size() < 2) continue;
        keys[i] = key_of(pieces[i]);
        __builtin_prefetch(&slots_[keys[i].hash & (slots_.size() - 1)]);
      }
      for (size_t i = 0; i < n; ++i) {
        if (pieces[i].size() > 1) append_one(keys[i], out, merge);
        else if (pieces[i].size() == 1) out.push_back(byte_ids_[static_cast<unsigned char>(pieces[i][0])]);
      }
      pieces = pieces.subspan(n);
    }
  }
  template <class Merge>
  void append_ids(std::string_view piece, std::vector<int32_t>& out, Merge&& merge) {
    append_ids(std::span<const std::string_view>(&piece, 1), out, merge);
  }

  static constexpr size_t kBatch = 16;             // pieces whose lookups overlap
  static constexpr size_t kMaxEntries = 1 << 20;   // then the cache is cleared
  static constexpr size_t kMaxKeyLength = 64 << 10;  // a longer piece is merged each time: keeping
                                                     // it would only evict the others

 private:
  static constexpr uint32_t kInlineIds = 2;
  struct Slot {
    uint64_t prefix = 0;   // the key's first 8 bytes, zero-padded
    uint32_t check = 0;    // the hash's upper half (its lower bits pick the slot)
    uint32_t key_len = 0;  // 0: an empty slot (keys are never empty)
    uint32_t key_off = 0;  // a key longer than 8 bytes: where it is in keys_
    uint32_t ids_len = 0;
    int32_t ids[kInlineIds] = {};  // the ids, or ids[0]: their offset in ids_ when there are more
  };
  static_assert(sizeof(Slot) == 32);
  struct Key {
    std::string_view bytes;
    uint64_t prefix, hash;
  };
  static constexpr size_t kInitialSlots = 1 << 14;
  static constexpr size_t kMaxKeyBytes = size_t{64} << 20;  // the key arena's bound (then cleared)

  // hash_bytes() of the `len` bytes at `key`, given their first 8 as a word (only a longer key
  // is read).
  static uint64_t hash_of(uint64_t prefix, size_t len, const char* key) {
    const uint64_t h = bpe_detail::mix64(bpe_detail::hash_seed(len) ^ prefix);
    return len <= 8 ? h : bpe_detail::hash_tail(h, key + 8, len - 8);
  }
  static Key key_of(std::string_view bytes) {
    const uint64_t prefix = bpe_detail::load_prefix(bytes.data(), bytes.size());
    return Key{bytes, prefix, hash_of(prefix, bytes.size(), bytes.data())};
  }

  const Slot* find(const Key& key) const {
    const size_t mask = slots_.size() - 1;
    const uint32_t check = static_cast<uint32_t>(key.hash >> 32), len = static_cast<uint32_t>(key.bytes.size());
    for (size_t i = key.hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key_len == 0) return nullptr;
      if (s.check == check && s.key_len == len && s.prefix == key.prefix &&
          (len <= 8 || std::memcmp(keys_.data() + s.key_off + 8, key.bytes.data() + 8, len - 8) == 0))
        return &s;
    }
  }

  template <class Merge>
  void append_one(const Key& key, std::vector<int32_t>& out, Merge& merge) {
    if (const Slot* s = find(key)) {
      if (s->ids_len <= kInlineIds) {
        for (uint32_t i = 0; i < s->ids_len; ++i) out.push_back(s->ids[i]);
      } else {
        const int32_t* ids = ids_.data() + static_cast<uint32_t>(s->ids[0]);
        out.insert(out.end(), ids, ids + s->ids_len);
      }
      return;
    }
    merged_.clear();
    merge(key.bytes, merged_);
    if (key.bytes.size() <= kMaxKeyLength) insert(key, merged_);
    out.insert(out.end(), merged_.begin(), merged_.end());
  }

  void insert(const Key& key, const std::vector<int32_t>& ids);
  void place(const Slot& s, uint64_t hash);
  void grow();
  void clear();

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  std::vector<int32_t> merged_;  // scratch for a miss
  std::array<int32_t, 256> byte_ids_;
  size_t size_ = 0;
};

}  // namespace tessera::data
