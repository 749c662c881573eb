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

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// GPT-2's byte-to-unicode map: printable Latin-1 bytes map to themselves, the others to
// U+0100 and up, in byte order.
std::array<char32_t, 256> byte_level_alphabet();

// 64-bit hash of a byte string; never 0 (0 marks an empty slot).
uint64_t hash_bytes(const char* p, size_t n);

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
class PretokenCache {
 public:
  PretokenCache();
  // The cached ids of `key` (hash h), or nullptr; `count` receives their number.
  const int32_t* find(std::string_view key, uint64_t h, uint32_t& count) const;
  void insert(std::string_view key, uint64_t h, const int32_t* ids, uint32_t count);

 private:
  struct Slot {
    uint64_t hash = 0;
    uint64_t prefix = 0;  // the key's first 8 bytes: most hits never touch the key arena
    uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  static constexpr size_t kInitialSlots = 1 << 14;
  static constexpr size_t kMaxEntries = 1 << 20;
  static constexpr size_t kMaxKeyBytes = size_t{64} << 20;

  void place(const Slot& s);
  void grow();
  void clear();

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t size_ = 0;
};

}  // namespace tessera::data
