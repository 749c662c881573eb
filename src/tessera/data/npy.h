// numpy `.npy` files, as Megatron's dataset cache stores its index arrays (numpy.save in
// megatron/core/datasets/gpt_dataset.py).
//
// write_npy writes the bytes numpy.save writes (format 1.0: magic, u16 header length, the
// header dict padded with spaces and '\n' to a multiple of 64 bytes, then the C-order data),
// through an AtomicFile (temporary name, fsync, rename), so a reader never sees a half file.
// read_npy maps a file read-only (zero copy) after validating magic, version (1.0, 2.0, 3.0),
// the header dict and that the data size equals the shape; a truncated or corrupt file is a
// tessera::Error naming the file and the problem. Little-endian integer dtypes only.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

enum class NpyDType : uint8_t { Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64 };

std::string_view npy_descr(NpyDType dtype);  // "<i4", "|u1", ...
size_t npy_itemsize(NpyDType dtype);
template <class T>
constexpr NpyDType npy_dtype_of();

// The header bytes numpy.save writes for a C-order array of `dtype` and `shape`.
std::string npy_header(NpyDType dtype, std::span<const int64_t> shape);

// An n-d integer array: in memory (owned) or a read-only map of a .npy file.
class NpyArray {
 public:
  NpyArray() = default;
  template <class T>
  static NpyArray from_vector(std::vector<T> values, std::vector<int64_t> shape);
  template <class T>
  static NpyArray from_vector(std::vector<T> values) {
    int64_t n = static_cast<int64_t>(values.size());
    return from_vector(std::move(values), {n});
  }

  NpyDType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  uint64_t size() const { return size_; }  // elements
  bool empty() const { return size_ == 0; }
  const void* data() const { return data_; }
  std::span<const unsigned char> bytes() const {
    return {static_cast<const unsigned char*>(data_), size_ * npy_itemsize(dtype_)};
  }
  // Element i of the flattened array, widened (uint64 values above INT64_MAX wrap).
  int64_t at(uint64_t i) const {
    const auto* p = static_cast<const unsigned char*>(data_) + i * npy_itemsize(dtype_);
    switch (dtype_) {
      case NpyDType::Int8: return static_cast<int8_t>(*p);
      case NpyDType::UInt8: return *p;
      case NpyDType::Int16: return load<int16_t>(p);
      case NpyDType::UInt16: return load<uint16_t>(p);
      case NpyDType::Int32: return load<int32_t>(p);
      case NpyDType::UInt32: return load<uint32_t>(p);
      case NpyDType::Int64: return load<int64_t>(p);
      case NpyDType::UInt64: return static_cast<int64_t>(load<uint64_t>(p));
    }
    return 0;
  }
  std::vector<int64_t> to_int64() const;
  // The path it was mapped from ("" when in memory).
  const std::string& path() const { return path_; }

 private:
  friend NpyArray read_npy(const std::string& path);
  template <class T>
  static T load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  std::shared_ptr<const void> owner_;
  const void* data_ = nullptr;
  NpyDType dtype_ = NpyDType::Int64;
  std::vector<int64_t> shape_;
  uint64_t size_ = 0;
  std::string path_;
};

// Writes `array` to `path` atomically, byte-identical to numpy.save.
void write_npy(const std::string& path, const NpyArray& array);
// Maps and validates a .npy file (see the top of this file).
NpyArray read_npy(const std::string& path);

// ---- implementation details -------------------------------------------------------------

template <class T>
constexpr NpyDType npy_dtype_of() {
  if constexpr (std::is_same_v<T, int8_t>) return NpyDType::Int8;
  else if constexpr (std::is_same_v<T, uint8_t>) return NpyDType::UInt8;
  else if constexpr (std::is_same_v<T, int16_t>) return NpyDType::Int16;
  else if constexpr (std::is_same_v<T, uint16_t>) return NpyDType::UInt16;
  else if constexpr (std::is_same_v<T, int32_t>) return NpyDType::Int32;
  else if constexpr (std::is_same_v<T, uint32_t>) return NpyDType::UInt32;
  else if constexpr (std::is_same_v<T, int64_t>) return NpyDType::Int64;
  else {
    static_assert(std::is_same_v<T, uint64_t>, "unsupported npy element type");
    return NpyDType::UInt64;
  }
}

template <class T>
NpyArray NpyArray::from_vector(std::vector<T> values, std::vector<int64_t> shape) {
  NpyArray a;
  auto holder = std::make_shared<std::vector<T>>(std::move(values));
  a.data_ = holder->data();
  a.size_ = holder->size();
  a.owner_ = std::move(holder);
  a.dtype_ = npy_dtype_of<T>();
  a.shape_ = std::move(shape);
  return a;
}

}  // namespace tessera::data
