#include "tessera/data/bpe_merge.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <queue>

namespace tessera::data {
namespace {

uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

std::array<char32_t, 256> byte_level_alphabet() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> printable{};
  for (int b = 0x21; b <= 0x7E; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? char32_t(b) : next++;
  return map;
}

// ---- MergeTable ------------------------------------------------------------------------------

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Merge{0, 0});
  mask_ = cap - 1;
}

void MergeTable::set(int32_t a, int32_t b, Merge m) {
  const uint64_t key = pack(a, b);
  size_t i = bpe_detail::mix64(key) & mask_;
  while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
  keys_[i] = key;
  values_[i] = m;
}

const MergeTable::Merge* MergeTable::find(int32_t a, int32_t b) const {
  if (keys_.empty()) return nullptr;
  const uint64_t key = pack(a, b);
  for (size_t i = bpe_detail::mix64(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return &values_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

// ---- the merge loop --------------------------------------------------------------------------

void bpe_merge_rounds(const MergeTable& merges, std::vector<int32_t>& word) {
  while (word.size() > 1) {
    int32_t best_rank = INT32_MAX, first = 0, second = 0, merged = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const MergeTable::Merge* m = merges.find(word[i], word[i + 1]);
      if (m && m->rank < best_rank) {
        best_rank = m->rank;
        first = word[i];
        second = word[i + 1];
        merged = m->merged;
      }
    }
    if (best_rank == INT32_MAX) break;
    size_t w = 0, n = word.size();
    for (size_t r = 0; r < n;) {
      if (r + 1 < n && word[r] == first && word[r + 1] == second) {
        word[w++] = merged;
        r += 2;
      } else {
        word[w++] = word[r++];
      }
    }
    word.resize(w);
  }
}

// The same rounds with a heap of candidate pairs: each round takes every occurrence of the
// lowest-ranked pair and merges them left to right, skipping overlaps.
void bpe_merge_heap(const MergeTable& merges, std::vector<int32_t>& word) {
  const size_t n = word.size();
  if (n < 2) return;
  std::vector<int32_t> sym(word), prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank, pos, first, second;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const MergeTable::Merge* m = merges.find(sym[pos], sym[next[pos]]))
      heap.push(Cand{m->rank, pos, sym[pos], sym[next[pos]]});
  };
  auto valid = [&](const Cand& c) {
    return alive[c.pos] && next[c.pos] >= 0 && sym[c.pos] == c.first && sym[next[c.pos]] == c.second;
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  std::vector<Cand> round;
  std::vector<int32_t> merged_at;
  while (!heap.empty()) {
    Cand top = heap.top();
    heap.pop();
    if (!valid(top)) continue;
    round.assign(1, top);
    while (!heap.empty() && heap.top().rank == top.rank) {
      round.push_back(heap.top());
      heap.pop();
    }
    std::sort(round.begin(), round.end(), [](const Cand& a, const Cand& b) { return a.pos < b.pos; });
    const int32_t merged = merges.find(top.first, top.second)->merged;
    merged_at.clear();
    for (const Cand& c : round) {
      if (!valid(c)) continue;  // overlapped by the previous merge of this round
      int32_t right = next[c.pos];
      sym[c.pos] = merged;
      alive[right] = 0;
      next[c.pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = c.pos;
      merged_at.push_back(c.pos);
    }
    for (int32_t pos : merged_at) {
      if (!alive[pos]) continue;
      push(prev[pos]);
      push(pos);
    }
  }
  word.clear();
  for (int32_t i = 0; i >= 0; i = next[i]) word.push_back(sym[i]);
}

void bpe_merge(const MergeTable& merges, std::vector<int32_t>& word) {
  if (word.size() > kHeapThreshold) bpe_merge_heap(merges, word);
  else bpe_merge_rounds(merges, word);
}

// ---- PretokenCache ---------------------------------------------------------------------------

PretokenCache::PretokenCache(const std::array<int32_t, 256>& byte_ids) : byte_ids_(byte_ids) {
  slots_.assign(kInitialSlots, Slot{});
}

void PretokenCache::insert(const Key& key, const std::vector<int32_t>& ids) {
  const bool long_key = key.bytes.size() > 8;  // a short key is all in its slot
  if (size_ >= kMaxEntries || keys_.size() + key.bytes.size() > kMaxKeyBytes) clear();
  if (2 * (size_ + 1) > slots_.size()) grow();
  Slot s;
  s.prefix = key.prefix;
  s.check = static_cast<uint32_t>(key.hash >> 32);
  s.key_len = static_cast<uint32_t>(key.bytes.size());
  s.key_off = static_cast<uint32_t>(keys_.size());
  s.ids_len = static_cast<uint32_t>(ids.size());
  if (long_key) keys_.append(key.bytes);
  if (ids.size() <= kInlineIds) {
    std::copy(ids.begin(), ids.end(), s.ids);
  } else {
    s.ids[0] = static_cast<int32_t>(ids_.size());
    ids_.insert(ids_.end(), ids.begin(), ids.end());
  }
  place(s, key.hash);
  ++size_;
}

void PretokenCache::place(const Slot& s, uint64_t hash) {
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].key_len != 0) i = (i + 1) & mask;
  slots_[i] = s;
}

void PretokenCache::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  for (const Slot& s : old)
    if (s.key_len != 0) place(s, hash_of(s.prefix, s.key_len, keys_.data() + s.key_off));
}

void PretokenCache::clear() {
  slots_.assign(kInitialSlots, Slot{});
  keys_.clear();
  ids_.clear();
  size_ = 0;
}

}  // namespace tessera::data
