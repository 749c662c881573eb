// TFRecord framing, the container of TensorBoard event files (tensorflow's
// core/lib/io/record_writer.cc). Each record is
//   uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// CRC-32C (Castagnoli) comes from Intel's ISA-L (Debian libisal-dev).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::metrics {

// Standard CRC-32C of `data` (crc32c("123456789") == 0xE3069283).
uint32_t crc32c(std::string_view data);

// TFRecord's mask, which keeps a CRC of data that itself contains CRCs well distributed:
// rotate right by 15 bits and add a constant.
constexpr uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
uint32_t masked_crc32c(std::string_view data);

// `data` framed as one record, ready to append to a file.
std::string frame_tfrecord(std::string_view data);

}  // namespace tessera::metrics
