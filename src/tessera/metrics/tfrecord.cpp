#include "tessera/metrics/tfrecord.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

#include "tessera/metrics/protobuf_wire.h"

namespace tessera::metrics {

uint32_t crc32c(std::string_view data) {
  // ISA-L's crc32_iscsi is the raw reflected CRC-32C register: the standard CRC starts it at
  // ~0 and inverts the result. Its length is an int, so feed long buffers in pieces.
  uint32_t crc = 0xffffffffu;
  auto* p = reinterpret_cast<unsigned char*>(const_cast<char*>(data.data()));  // not written
  size_t left = data.size();
  while (left > 0) {
    int n = static_cast<int>(std::min<size_t>(left, INT_MAX));
    crc = crc32_iscsi(p, n, crc);
    p += n;
    left -= static_cast<size_t>(n);
  }
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) { return mask_crc(crc32c(data)); }

std::string frame_tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  pb::append_le(out, data.size(), 8);
  pb::append_le(out, masked_crc32c(out), 4);  // CRC of the 8 length bytes written so far
  out.append(data);
  pb::append_le(out, masked_crc32c(data), 4);
  return out;
}

}  // namespace tessera::metrics
