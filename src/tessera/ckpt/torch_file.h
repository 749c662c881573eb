// PyTorch's checkpoint files (torch.save / torch.load, the zip format): `<archive>/data.pkl`
// (a pickle, read by the restricted reader of pickle.h), `<archive>/data/<key>` (one raw
// little-endian storage per key) and `<archive>/version`.
//
// Reading executes nothing: tensors are records whose extent (offset, shape, strides) is
// checked against the bytes their storage really has before any element is read. Writing
// produces what torch.load of PyTorch 1.13 and later accepts: pickle protocol 2, storages
// stored 64-byte aligned, format version 3.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/ckpt/pickle.h"
#include "tessera/ckpt/zip_archive.h"

namespace tessera {

// Bytes per element of a storage type ("FloatStorage": 4); 0 for an unknown one.
size_t storage_element_size(const std::string& storage_type);

class TorchFile {
 public:
  // Maps and parses `path`; errors name the file.
  static TorchFile open(const std::string& path);
  static TorchFile from_bytes(std::string label, std::vector<uint8_t> bytes);
  // A torch.save payload inside memory that `owner` keeps alive (zip::Reader::from_view).
  static TorchFile from_view(std::string label, std::span<const uint8_t> bytes, std::shared_ptr<const void> owner);

  const std::string& path() const { return zip_.label(); }
  const pickle::Value& root() const { return *doc_.root; }
  // The parsed tree, for a reader that rewrites it before use (megatron_grouped_experts.h).
  pickle::Document& document() { return doc_; }
  // The tensor's elements, row-major, as float (Float, Half, BFloat16, Double storages) or
  // int64 (Long, Int, Short, Char, Byte, Bool). Errors name the file and `what`.
  std::vector<float> f32(const pickle::TensorRef& t, const std::string& what) const;
  std::vector<int64_t> i64(const pickle::TensorRef& t, const std::string& what) const;
  // Checks the tensor's storage (present, CRC-32, the tensor inside it) without converting.
  void check(const pickle::TensorRef& t, const std::string& what) const { storage_for(t, what); }

 private:
  TorchFile(zip::Reader zip);
  // The storage's bytes, CRC-checked; its extent checked for `t`.
  std::span<const uint8_t> storage_for(const pickle::TensorRef& t, const std::string& what) const;
  template <class Out>
  std::vector<Out> convert(const pickle::TensorRef& t, const std::string& what) const;

  zip::Reader zip_;
  std::string archive_;  // the folder every entry is in
  pickle::Document doc_;
  mutable std::map<std::string, std::vector<uint8_t>> inflated_;  // deflated storages, by key
  mutable std::map<std::string, bool> crc_checked_;
};

// A storage to write: `data/<key>`.
struct TorchStorageBytes {
  std::string key;
  std::vector<uint8_t> bytes;
};

// A storage to write whose bytes are made only when the file reaches it (and dropped after),
// so that a file is written with one storage's bytes in memory at a time.
struct TorchStorageSource {
  std::string key;
  std::function<std::vector<uint8_t>()> bytes;
};

// Writes the file through `append`: `root` pickled (protocol 2) into `<archive>/data.pkl`, the
// storages in order, the version record.
void write_torch_file(const zip::StoredWriter::Append& append, const std::string& archive, const pickle::Value& root,
                      const std::vector<TorchStorageSource>& storages);

// The whole file's bytes.
std::vector<uint8_t> torch_file_bytes(const std::string& archive, const pickle::Value& root,
                                      const std::vector<TorchStorageBytes>& storages);

}  // namespace tessera
