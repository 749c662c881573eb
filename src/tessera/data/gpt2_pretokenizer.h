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

#include <cstdint>
#include <string_view>
#include <vector>

#include "tessera/data/utf8.h"

namespace tessera::data {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };

// Class of every code point 0..0x10FFFF (surrogates are Other); built on first use.
const CharClass* gpt2_char_classes();

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
      while (j < n && class_at(j, len) == k) j += len;
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
