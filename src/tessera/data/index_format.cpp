#include "tessera/data/index_format.h"

#include "tessera/core/error.h"

namespace tessera::data {
namespace {

uint64_t load_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

[[noreturn]] void corrupt(const std::string& name, const std::string& problem) {
  throw runtime_error(name + ": " + problem,
                      "the file is truncated or corrupt (or not a Megatron indexed dataset); "
                      "re-create it with `tessera preprocess` or copy it again");
}

}  // namespace

bool is_valid_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

size_t dtype_size(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::UInt8: case IndexDType::Int8: return 1;
    case IndexDType::Int16: case IndexDType::UInt16: return 2;
    case IndexDType::Int32: case IndexDType::Float32: return 4;
    case IndexDType::Int64: case IndexDType::Float64: return 8;
  }
  return 0;
}

std::string_view dtype_name(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::UInt8: return "uint8";
    case IndexDType::Int8: return "int8";
    case IndexDType::Int16: return "int16";
    case IndexDType::Int32: return "int32";
    case IndexDType::Int64: return "int64";
    case IndexDType::Float64: return "float64";
    case IndexDType::Float32: return "float32";
    case IndexDType::UInt16: return "uint16";
  }
  return "?";
}

IndexDType optimal_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::UInt16 : IndexDType::Int32;
}

IndexView parse_index(std::span<const unsigned char> idx, uint64_t bin_size, const std::string& idx_name,
                      const std::string& bin_name, IndexParseOptions options) {
  const uint64_t size = idx.size();
  const unsigned char* p = idx.data();
  if (size < kIndexHeaderSize)
    corrupt(idx_name, "is " + std::to_string(size) + " bytes, shorter than the 34-byte header");
  if (std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) != 0)
    corrupt(idx_name, "does not start with the magic bytes MMIDIDX\\0\\0 of a Megatron .idx file");
  uint64_t version = load_u64(p + 9);
  if (version != kIndexVersion)
    corrupt(idx_name, "has version " + std::to_string(version) + "; only version 1 exists");
  uint8_t code = p[17];
  if (!is_valid_dtype_code(code)) corrupt(idx_name, "has unknown dtype code " + std::to_string(code));
  IndexView v;
  v.dtype = static_cast<IndexDType>(code);
  v.sequence_count = load_u64(p + 18);
  v.document_index_count = load_u64(p + 26);
  const uint64_t S = v.sequence_count, D = v.document_index_count;
  const uint64_t room = size - kIndexHeaderSize;
  const uint64_t per_sequence = options.multimodal ? 13 : 12;
  // Overflow-free: check S and D against what the file can hold before multiplying.
  if (S > room / per_sequence || D > (room - S * per_sequence) / 8)
    corrupt(idx_name, "is truncated: its header announces " + std::to_string(S) + " sequences and " +
                          std::to_string(D) + " document indices, which need more than its " +
                          std::to_string(size) + " bytes");
  const uint64_t need = kIndexHeaderSize + S * per_sequence + D * 8;
  if (size != need) {
    // A multimodal file read as a plain one carries S mode bytes at the end (Megatron ignores them).
    if (!(options.multimodal == false && size == need + S))
      corrupt(idx_name, "has " + std::to_string(size - need) + " bytes after its arrays (expected " +
                            std::to_string(need) + " bytes in all)");
  }
  if (D < 1) corrupt(idx_name, "has no document indices (there must be at least the leading 0)");
  v.lengths = p + kIndexHeaderSize;
  v.pointers = v.lengths + 4 * S;
  v.documents = v.pointers + 8 * S;
  v.modes = options.multimodal ? v.documents + 8 * D : nullptr;

  const uint64_t item = dtype_size(v.dtype);
  uint64_t running = 0;
  for (uint64_t i = 0; i < S; ++i) {
    int32_t len = v.length(i);
    int64_t ptr = v.pointer(i);
    if (len < 0) corrupt(idx_name, "sequence " + std::to_string(i) + " has negative length " + std::to_string(len));
    if (ptr < 0 || static_cast<uint64_t>(ptr) % item != 0)
      corrupt(idx_name, "sequence " + std::to_string(i) + " has pointer " + std::to_string(ptr) +
                            ", which is not a non-negative multiple of the item size " + std::to_string(item));
    uint64_t end = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * item;  // < 2^63 + 2^34
    if (static_cast<uint64_t>(ptr) > bin_size || end > bin_size)
      corrupt(idx_name, "sequence " + std::to_string(i) + " spans bytes [" + std::to_string(ptr) + ", " +
                            std::to_string(end) + ") but " + bin_name + " has only " +
                            std::to_string(bin_size) + " bytes");
    if (static_cast<uint64_t>(ptr) != running) v.contiguous = false;
    running = end;
    if (end > v.data_bytes) v.data_bytes = end;
  }
  if (v.document_index(0) != 0)
    corrupt(idx_name, "its first document index is " + std::to_string(v.document_index(0)) + ", not 0");
  int64_t prev = 0;
  for (uint64_t i = 1; i < D; ++i) {
    int64_t d = v.document_index(i);
    if (d < prev || static_cast<uint64_t>(d) > S)
      corrupt(idx_name, "document index " + std::to_string(i) + " is " + std::to_string(d) +
                            " (indices must be non-decreasing and at most the " + std::to_string(S) +
                            " sequences)");
    prev = d;
  }
  if (static_cast<uint64_t>(v.document_index(D - 1)) != S)
    corrupt(idx_name, "its last document index is " + std::to_string(v.document_index(D - 1)) +
                          " but it has " + std::to_string(S) + " sequences");
  return v;
}

}  // namespace tessera::data
