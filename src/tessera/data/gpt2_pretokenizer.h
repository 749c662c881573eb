// GPT-2's pre-tokenization (megatron/training/tokenizer/gpt2_tokenization.py's GPT2Tokenizer):
// the text is cut into pre-tokens by
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// applied with findall semantics (alternatives tried in order, with backtracking).
//
// gpt2_pretokenize is a hand-written scanner equivalent to that pattern; it classifies code
// points with a table built once from ICU's Unicode data (White_Space, L*, N*), which are the
// classes Python's `regex` module uses (`\s` is White_Space there). ICU 72 carries Unicode
// 15.0, the version of Debian 12's python3-regex, so the classes agree with the reference for
// every code point (tests/unit/data/data_tokenizer_test.cpp checks the whole table).
// gpt2_pretokenize_regex is the slow, obvious reference: the same pattern run by PCRE2.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "tessera/data/utf8.h"

namespace tessera::data {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };

// Class of every code point 0..0x10FFFF (surrogates are Other); built on first use.
const CharClass* gpt2_char_classes();

namespace pretokenizer_detail {

constexpr uint64_t kEachByte = 0x0101010101010101ull, kTopBits = 0x8080808080808080ull;

// Bit 7 of each byte is set where that byte of `low7` (every byte below 0x80) is in [lo, hi].
inline uint64_t bytes_in_range(uint64_t low7, unsigned lo, unsigned hi) {
  const uint64_t at_least_lo = low7 + kEachByte * (0x80 - lo);  // no byte carries: all stay below 0x100
  const uint64_t above_hi = low7 + kEachByte * (0x7F - hi);
  return at_least_lo & ~above_hi & kTopBits;
}

// Bit 7 of each byte of the 8 at p is set where that byte is ASCII of class k (not Space), as
// gpt2_char_classes() has them: letters A-Z a-z, numbers 0-9, spaces 0x09-0x0D and 0x20.
inline uint64_t ascii_class_mask(const unsigned char* p, CharClass k) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  const uint64_t ascii = ~w & kTopBits, low7 = w & ~kTopBits;
  const uint64_t letter = bytes_in_range(low7 | (kEachByte * 0x20), 'a', 'z');  // | 0x20: lower case
  const uint64_t number = bytes_in_range(low7, '0', '9');
  if (k == CharClass::Letter) return letter & ascii;
  if (k == CharClass::Number) return number & ascii;
  const uint64_t space = bytes_in_range(low7, 0x09, 0x0D) | bytes_in_range(low7, ' ', ' ');
  return ascii & ~(letter | number | space);
}

// The end of the run of ASCII bytes of class k (not Space) that starts at j, eight bytes at a
// time: a word ends without the branch per byte whose misprediction at the run's end cost
// more than the bytes. Stops early (never late) near the end of the text.
inline size_t skip_ascii_run(const unsigned char* p, size_t j, size_t n, CharClass k) {
  while (j + 8 <= n) {
    const uint64_t outside = ~ascii_class_mask(p + j, k) & kTopBits;
    if (outside) return j + static_cast<size_t>(std::countr_zero(outside)) / 8;
    j += 8;
  }
  return j;
}

}  // namespace pretokenizer_detail

// Calls emit(std::string_view piece) for each pre-token of valid UTF-8 `text`, in order.
template <class Emit>
void gpt2_pretokenize(std::string_view text, Emit&& emit) {
  const CharClass* classes = gpt2_char_classes();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  auto class_at = [&](size_t j, size_t& len) {
    if (p[j] < 0x80) {
      len = 1;
      return classes[p[j]];
    }
    return classes[utf8::decode_valid(p + j, len)];
  };
  auto piece = [&](size_t a, size_t b) { emit(std::string_view(text.data() + a, b - a)); };

  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b == '\'' && i + 1 < n) {  // 's 't 'm 'd 're 've 'll (lower case only)
      unsigned char c1 = p[i + 1];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        piece(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        unsigned char c2 = p[i + 2];
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          piece(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    size_t len;
    CharClass k = class_at(i, len);
    size_t j = i;
    if (b == ' ' && i + 1 < n) {  // the optional leading space of ` ?\p{L}+` and friends
      size_t len1;
      CharClass k1 = class_at(i + 1, len1);
      if (k1 != CharClass::Space) {
        k = k1;
        j = i + 1;
      }
    }
    if (k != CharClass::Space) {  // a run of letters, of numbers, or of anything else
      j = pretokenizer_detail::skip_ascii_run(p, j, n, k);
      while (j < n && class_at(j, len) == k) j += len;  // the rest: other code points, the last bytes
      piece(i, j);
      i = j;
      continue;
    }
    // Whitespace: `\s+(?!\S)` gives back the run's last character when a non-space follows
    // (it may then prefix the next piece); a single space before a non-space is `\s+`.
    size_t end = i, last = i;
    while (end < n && class_at(end, len) == CharClass::Space) {
      last = end;
      end += len;
    }
    if (end < n && last > i) end = last;
    piece(i, end);
    i = end;
  }
}

// The reference: Megatron's pattern through PCRE2 (with \s spelled \p{White_Space}, which is
// what Python's `regex` means by \s). Slow; for tests. Classes are PCRE2's (Unicode 14 in
// PCRE2 10.42), which differ from ICU's only for code points first assigned in Unicode 15.
std::vector<std::string_view> gpt2_pretokenize_regex(std::string_view text);

}  // namespace tessera::data
