// The few pieces of the protobuf wire format that TensorBoard's Event message needs, written by
// hand so tessera does not depend on protoc or libprotobuf for three messages.
// Wire format (protobuf.dev/programming-guides/encoding): every field is a varint key
// `(field_number << 3) | wire_type` followed by its payload; wire types used here:
//   0 varint (int64: two's complement, so a negative number takes 10 bytes),
//   1 fixed 64-bit little-endian (double), 2 length-delimited (string, bytes, sub-message),
//   5 fixed 32-bit little-endian (float).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::metrics::pb {

enum class WireType : uint32_t { Varint = 0, Fixed64 = 1, LengthDelimited = 2, Fixed32 = 5 };

inline void append_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void append_key(std::string& out, uint32_t field, WireType type) {
  append_varint(out, (uint64_t{field} << 3) | static_cast<uint32_t>(type));
}

// Little-endian by shifts, so the bytes are right whatever the host's byte order.
inline void append_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline void append_double(std::string& out, uint32_t field, double v) {
  append_key(out, field, WireType::Fixed64);
  append_le(out, std::bit_cast<uint64_t>(v), 8);
}

inline void append_float(std::string& out, uint32_t field, float v) {
  append_key(out, field, WireType::Fixed32);
  append_le(out, std::bit_cast<uint32_t>(v), 4);
}

inline void append_int64(std::string& out, uint32_t field, int64_t v) {
  append_key(out, field, WireType::Varint);
  append_varint(out, static_cast<uint64_t>(v));
}

// A string, bytes or an already encoded sub-message.
inline void append_bytes(std::string& out, uint32_t field, std::string_view v) {
  append_key(out, field, WireType::LengthDelimited);
  append_varint(out, v.size());
  out.append(v);
}

}  // namespace tessera::metrics::pb
