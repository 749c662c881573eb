// UTF-8 helpers for the tokenizers and the JSON readers. Text inside tessera is UTF-8 bytes in
// std::string / std::string_view; "valid" means well-formed UTF-8 as Unicode defines it (no
// surrogates, no overlongs, nothing above U+10FFFF).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::data::utf8 {

inline constexpr size_t npos = static_cast<size_t>(-1);

// Offset of the first byte that does not belong to a well-formed sequence, or npos.
size_t find_invalid(std::string_view s);
bool is_valid(std::string_view s);
size_t count_code_points(std::string_view s);

// Decodes the code point starting at p[0] of *valid* UTF-8 and stores its byte length.
inline char32_t decode_valid(const unsigned char* p, size_t& len) {
  unsigned char b = p[0];
  if (b < 0x80) { len = 1; return b; }
  if (b < 0xE0) { len = 2; return (char32_t(b & 0x1F) << 6) | (p[1] & 0x3F); }
  if (b < 0xF0) {
    len = 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  len = 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

// Appends the UTF-8 encoding of code point c (c must be a scalar value).
void append(std::string& out, char32_t c);

// Python's bytes.decode('utf-8', errors='replace'): each maximal ill-formed subpart becomes
// one U+FFFD, as CPython does.
std::string decode_with_replacement(std::string_view bytes);

}  // namespace tessera::data::utf8
