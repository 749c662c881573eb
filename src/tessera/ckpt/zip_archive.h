// The zip container PyTorch's torch.save writes (and torch.load reads): entries stored
// (method 0) or deflated (method 8, via zlib), ZIP64 records for archives past 4 GiB.
//
// The reader treats the bytes as hostile: every offset and size of the end record, the
// central directory and the local headers is bounds-checked before use, an entry's CRC-32 is
// checked when it is read, and a deflated entry may not claim more than deflate can produce
// from its compressed size (no zip bombs). Any problem is a tessera::Error naming the archive
// and the entry. The writer stores every entry uncompressed with its data aligned to 64
// bytes, as PyTorch's writer does (so torch can map tensors in place).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/file_bytes.h"

namespace tessera::zip {

struct Entry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0, size = 0;
  uint64_t data_offset = 0;  // of the (compressed) data in the archive
};

class Reader {
 public:
  // Maps `path` read-only and reads its directory.
  static Reader open(const std::string& path);
  // An archive in memory; `label` names it in errors.
  static Reader from_bytes(std::string label, std::vector<uint8_t> bytes);
  // An archive lying in memory that `owner` keeps alive (one torch.save payload inside a
  // mapped torch_dist .distcp file): read in place, nothing copied.
  static Reader from_view(std::string label, std::span<const uint8_t> bytes, std::shared_ptr<const void> owner);

  const std::string& label() const { return label_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(const std::string& name) const;
  // The entry's bytes, inflated if needed, CRC-checked.
  std::vector<uint8_t> read(const Entry& e) const;
  // A stored entry's bytes in place (CRC-checked on first use by the caller through
  // check_crc); an Error for a deflated one.
  std::span<const uint8_t> stored(const Entry& e) const;
  void check_crc(const Entry& e, std::span<const uint8_t> data) const;

 private:
  Reader(std::string label, FileBytes file);
  void parse();
  std::string label_;
  FileBytes file_;
  const uint8_t* data_ = nullptr;  // file_'s bytes, as the parser reads them
  uint64_t size_ = 0;
  std::vector<Entry> entries_;
};

struct WriteEntry {
  std::string name;
  std::span<const uint8_t> data;
};

// Writes an archive through `append` one entry at a time, so that only the entry being added
// and the central directory are in memory: every entry stored, its data 64-byte aligned, ZIP64
// records where a size or offset needs them.
class StoredWriter {
 public:
  using Append = std::function<void(std::span<const uint8_t>)>;
  explicit StoredWriter(Append append) : append_(std::move(append)) {}
  void add(const std::string& name, std::span<const uint8_t> data);
  void finish();  // the central directory and the end records

 private:
  Append append_;
  uint64_t offset_ = 0, count_ = 0;
  std::vector<uint8_t> directory_;
};

// The archive's bytes (a StoredWriter into memory).
std::vector<uint8_t> write_stored(const std::vector<WriteEntry>& entries);

}  // namespace tessera::zip
