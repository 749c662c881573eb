// safetensors I/O (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header, then the data section. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section) and may
// hold "__metadata__": {string: string}.
//
// The reader treats the file as hostile: every header value is bounds-checked before use (header
// length against the file size, dtype, shape product and byte size without overflow, offsets
// inside the data section), and any problem is a tessera::Error naming the file and the tensor.
// Nothing in a file is ever executed. The writer pads the header with spaces to a multiple of 8
// bytes, as the reference implementation does, and replaces the target atomically (temp file,
// fsync, rename).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/file_bytes.h"
#include "tessera/core/tensor.h"

namespace tessera::safetensors {

// Largest header the reader accepts (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype_name;       // as in the file: "F32", "BF16", ...
  std::optional<DType> dtype;   // empty for format dtypes tessera has no type for (F64, BOOL, ...)
  size_t element_size = 0;      // bytes per element of dtype_name
  Shape shape;
  uint64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte range within the data section; end - begin == numel * size
};

// "F32" -> DType::F32 etc.; empty for names tessera does not map.
std::optional<DType> dtype_from_name(std::string_view name);
// DType::F32 -> "F32" etc.
std::string_view dtype_to_name(DType t);

class Reader {
 public:
  // Maps `path` read-only and validates its header. Throws tessera::Error on any problem.
  static Reader open(const std::string& path);
  // Validates an in-memory file; `label` names it in errors.
  static Reader from_bytes(std::string label, std::vector<uint8_t> bytes);

  const std::string& path() const { return label_; }
  // Tensors in data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo* find(const std::string& name) const;
  // Throws an Error naming the file when `name` is absent.
  const TensorInfo& at(const std::string& name) const;

  // The raw little-endian bytes of a tensor (always inside the file; may be unaligned).
  std::span<const uint8_t> bytes(const TensorInfo& t) const;
  // Hands back the mapped pages under a tensor's bytes once they are copied (a later bytes()
  // reads them again from the page cache), so that a load that copies a file tensor by
  // tensor stays resident by one tensor, not by the file. A no-op for an in-memory file.
  void drop_pages(const TensorInfo& t) const;
  // The tensor converted to float: F32 as is, F16 and BF16 widened. Other dtypes throw.
  std::vector<float> read_f32(const TensorInfo& t) const;
  std::vector<float> read_f32(const std::string& name) const { return read_f32(at(name)); }
  // The tensor widened to int64: I32, I64, U16 and U8 only; other dtypes throw.
  std::vector<int64_t> read_i64(const TensorInfo& t) const;
  std::vector<int64_t> read_i64(const std::string& name) const { return read_i64(at(name)); }

 private:
  Reader(std::string label, FileBytes file);
  void parse();

  std::string label_;
  FileBytes file_;
  uint64_t data_offset_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: `data` must hold numel(shape) * dtype_size(dtype) bytes.
struct WriteEntry {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};

// The complete file contents for `entries` (in the given order, data contiguous).
// Throws tessera::Error on duplicate or reserved names and negative dimensions.
std::vector<uint8_t> serialize(const std::vector<WriteEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});
// The 8-byte length and the padded JSON header alone (entries' data is not read): the
// caller appends each tensor's bytes in the entries' order, e.g. copied from a device.
std::vector<uint8_t> serialize_header(const std::vector<WriteEntry>& entries,
                                      const std::map<std::string, std::string>& metadata = {});
// Writes serialize(...) to `path` atomically: `path`.tmp.<pid>, fsync, rename, fsync of the
// directory. Throws tessera::Error naming the file on any I/O failure.
void write(const std::string& path, const std::vector<WriteEntry>& entries,
           const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera::safetensors
