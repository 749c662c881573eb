// Megatron's `.idx` format (megatron/core/datasets/indexed_dataset.py's _IndexReader and
// _IndexWriter; the layout is in docs/data.md), parsed and validated without trusting a
// byte of it: every count and pointer is checked against the file sizes before use, so a
// truncated or corrupt file is an Error naming the file and the problem, never a crash or an
// out-of-bounds read. The .idx arrays are not aligned (they start at byte 34): read them with
// the accessors, which use memcpy.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace tessera::data {

// dtype codes of the .idx header (offset 17).
enum class IndexDType : uint8_t {
  UInt8 = 1, Int8 = 2, Int16 = 3, Int32 = 4, Int64 = 5, Float64 = 6, Float32 = 7, UInt16 = 8,
};

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderSize = 34;

bool is_valid_dtype_code(uint8_t code);
size_t dtype_size(IndexDType dtype);
std::string_view dtype_name(IndexDType dtype);  // numpy's name, e.g. "uint16"
// Megatron's DType.optimal_dtype: uint16 when the (unpadded) vocab size is < 65500, else int32.
IndexDType optimal_dtype(int64_t vocab_size);

// A validated view of an .idx file's bytes (it does not own them).
struct IndexView {
  IndexDType dtype = IndexDType::UInt16;
  uint64_t sequence_count = 0;        // S
  uint64_t document_index_count = 0;  // D = documents + 1
  const unsigned char* lengths = nullptr;   // int32[S]
  const unsigned char* pointers = nullptr;  // int64[S]
  const unsigned char* documents = nullptr; // int64[D]
  const unsigned char* modes = nullptr;     // int8[S] or null
  bool contiguous = true;     // pointer[i] is the running sum of length * itemsize
  uint64_t data_bytes = 0;    // bytes of .bin covered by sequences (max of pointer + size)

  uint64_t document_count() const { return document_index_count - 1; }
  int32_t length(uint64_t i) const { return load<int32_t>(lengths, i); }
  int64_t pointer(uint64_t i) const { return load<int64_t>(pointers, i); }
  int64_t document_index(uint64_t i) const { return load<int64_t>(documents, i); }

 private:
  template <class T>
  static T load(const unsigned char* base, uint64_t i) {
    T v;
    std::memcpy(&v, base + i * sizeof(T), sizeof(T));
    return v;
  }
};

struct IndexParseOptions {
  bool multimodal = false;  // expect the int8 modes array after the document indices
};

// Validates `idx` (the bytes of `idx_name`) against a .bin file of `bin_size` bytes.
// Checks: header size, magic, version, dtype code, that the arrays fit the file exactly,
// lengths >= 0, every pointer aligned to the item size with its sequence inside the .bin,
// document indices starting at 0, non-decreasing and ending at S. Throws tessera::Error.
IndexView parse_index(std::span<const unsigned char> idx, uint64_t bin_size, const std::string& idx_name,
                      const std::string& bin_name, IndexParseOptions options = {});

}  // namespace tessera::data
