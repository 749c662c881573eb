#include "tessera/data/utf8.h"

#include <simdjson.h>

#include <bit>
#include <cstdint>
#include <cstring>

namespace tessera::data::utf8 {
namespace {

// Length of the well-formed sequence starting at s[i], or the length of its maximal ill-formed
// subpart as a negative number (at least -1). Table 3-7 of the Unicode standard.
int sequence_length(const unsigned char* p, size_t n) {
  unsigned char b = p[0];
  if (b < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;
    unsigned char c = p[k];
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -k;
  }
  return need + 1;
}

}  // namespace

size_t find_invalid(std::string_view s) {
  if (simdjson::validate_utf8(s.data(), s.size())) return npos;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    int len = sequence_length(p + i, s.size() - i);
    if (len < 0) return i;
    i += static_cast<size_t>(len);
  }
  return npos;  // unreachable when the validators agree
}

bool is_valid(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

size_t count_code_points(std::string_view s) {
  // Every byte but a continuation byte (10xxxxxx) starts a code point; eight bytes at a time,
  // a continuation byte is one whose top bit is set and whose next bit is not.
  constexpr uint64_t kTopBits = 0x8080808080808080ull;
  size_t continuation = 0, i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    continuation += static_cast<size_t>(std::popcount(w & ~(w << 1) & kTopBits));
  }
  for (; i < s.size(); ++i) continuation += (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
  return s.size() - continuation;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string decode_with_replacement(std::string_view bytes) {
  if (is_valid(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    int len = sequence_length(p + i, bytes.size() - i);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal ill-formed subpart
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

}  // namespace tessera::data::utf8
