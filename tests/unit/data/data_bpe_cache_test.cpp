// The BPE core's hashing and pre-token cache (bpe_merge.h) and utf8::count_code_points against
// obvious references: the word loads equal a zero-padded copy, the cache returns exactly what
// its merge function computes (through growth, clearing when full, keys too long to keep, empty
// and one-byte pieces, batches of every size) and merges each cached key once.
#include <gtest/gtest.h>

#include <cstring>
#include <unordered_map>
#include <random>
#include <string>
#include <vector>

#include "tessera/data/bpe_merge.h"
#include "tessera/data/utf8.h"

namespace td = tessera::data;

namespace {

std::string random_bytes(std::mt19937_64& rng, size_t n, int alphabet = 256) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() % alphabet);
  return s;
}

std::array<int32_t, 256> byte_ids() {
  std::array<int32_t, 256> ids{};
  for (int b = 0; b < 256; ++b) ids[b] = 1000 + b;
  return ids;
}

// A stand-in for BPE: 1 to 4 ids that depend on every byte of the piece.
std::vector<int32_t> fake_merge(std::string_view piece) {
  const uint64_t h = td::hash_bytes(piece.data(), piece.size());
  std::vector<int32_t> ids;
  for (size_t k = 0; k <= piece.size() % 4; ++k) ids.push_back(static_cast<int32_t>((h >> (8 * k)) & 0xFFFFF));
  return ids;
}

// The cache's answer for `pieces` (one batch call) next to the reference, counting merges.
struct Checker {
  td::PretokenCache cache{byte_ids()};
  std::unordered_map<std::string, int> merges;  // merge calls per piece

  void check(const std::vector<std::string>& pieces) {
    std::vector<std::string_view> views(pieces.begin(), pieces.end());
    std::vector<int32_t> got{-1}, want{-1};  // appended to, never replaced
    cache.append_ids(views, got, [&](std::string_view p, std::vector<int32_t>& ids) {
      ASSERT_TRUE(ids.empty());
      ++merges[std::string(p)];
      ids = fake_merge(p);
    });
    for (const std::string& p : pieces) {
      if (p.size() == 1) want.push_back(1000 + static_cast<unsigned char>(p[0]));
      else if (!p.empty()) for (int32_t id : fake_merge(p)) want.push_back(id);
    }
    ASSERT_EQ(got, want);
  }
};

}  // namespace

TEST(DataBpeCache, LoadPrefixIsTheZeroPaddedFirstEightBytes) {
  std::mt19937_64 rng(1);
  for (size_t n = 0; n <= 20; ++n) {
    for (int rep = 0; rep < 50; ++rep) {
      const std::string s = random_bytes(rng, n);
      uint64_t want = 0;
      std::memcpy(&want, s.data(), std::min<size_t>(n, 8));
      ASSERT_EQ(td::bpe_detail::load_prefix(s.data(), n), want) << "length " << n;
    }
  }
}

TEST(DataBpeCache, HashBytesSeesEveryByteAndTheLength) {
  std::mt19937_64 rng(2);
  for (size_t n = 0; n <= 40; ++n) {
    std::string s = random_bytes(rng, n);
    const uint64_t h = td::hash_bytes(s.data(), n);
    EXPECT_NE(h, 0u);
    const std::string copy = "xyz" + s;  // another address, the same bytes
    EXPECT_EQ(td::hash_bytes(copy.data() + 3, n), h);
    for (size_t i = 0; i < n; ++i) {
      std::string t = s;
      t[i] = static_cast<char>(t[i] ^ 0x01);
      EXPECT_NE(td::hash_bytes(t.data(), n), h) << "length " << n << ", byte " << i;
    }
    const std::string zero_padded = s + '\0';
    EXPECT_NE(td::hash_bytes(zero_padded.data(), n + 1), h) << "length " << n;
  }
}

TEST(DataBpeCache, ReturnsWhatMergeComputesAndMergesEachKeyOnce) {
  std::mt19937_64 rng(3);
  Checker c;
  // Short pieces over a small alphabet repeat; lengths 0..24 cover one-byte, in-slot (<= 8 bytes)
  // and arena keys, and 1..4 ids both inline and out of the slot. Over 40,000 distinct keys make
  // the table grow twice.
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::string> pieces(rng() % 70);  // batches of 0..69: partial and several full ones
    for (auto& p : pieces) p = random_bytes(rng, rng() % 25, round % 2 ? 4 : 256);
    c.check(pieces);
  }
  const size_t distinct = c.merges.size();
  EXPECT_GT(distinct, 40000u);
  for (const auto& [piece, calls] : c.merges) {
    EXPECT_GE(piece.size(), 2u);
    EXPECT_EQ(calls, 1) << "merged again: a key of " << piece.size() << " bytes";
  }
  // Everything seen so far is a hit now.
  std::vector<std::string> again;
  for (const auto& [piece, calls] : c.merges) again.push_back(piece);
  c.check(again);
  for (const auto& [piece, calls] : c.merges) ASSERT_EQ(calls, 1);
}

TEST(DataBpeCache, StaysRightWhenFullAndForKeysTooLongToKeep) {
  Checker c;
  // More distinct keys than the cache holds: it clears and refills, answers stay right.
  std::vector<std::string> pieces;
  for (size_t i = 0; i < td::PretokenCache::kMaxEntries + 1000; ++i) pieces.push_back("k" + std::to_string(i));
  c.check(pieces);
  c.check({"k0", "k1", "k" + std::to_string(td::PretokenCache::kMaxEntries + 999)});
  EXPECT_EQ(c.merges["k0"], 2);  // cleared, merged again
  EXPECT_EQ(c.merges["k" + std::to_string(td::PretokenCache::kMaxEntries + 999)], 1);  // kept after clearing
  // A key longer than kMaxKeyLength is merged each time and never evicts the rest.
  const std::string huge(td::PretokenCache::kMaxKeyLength + 1, 'a');
  c.check({huge, "k1", huge, "k1"});
  EXPECT_EQ(c.merges[huge], 2);
  EXPECT_EQ(c.merges["k1"], 2);
}

TEST(DataBpeCache, CountCodePointsCountsAllButContinuationBytes) {
  std::mt19937_64 rng(4);
  for (size_t n = 0; n <= 100; ++n) {
    const std::string s = random_bytes(rng, n);  // mostly invalid UTF-8: counted all the same
    size_t want = 0;
    for (unsigned char b : s) want += (b & 0xC0) != 0x80;
    ASSERT_EQ(td::utf8::count_code_points(s), want) << "length " << n;
  }
  EXPECT_EQ(td::utf8::count_code_points("a\u00e9\u4e2d\U0001F600 x"), 6u);
}
