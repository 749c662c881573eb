// The bytes a reader parses in place: a mapped file, a buffer it owns, or a view into memory
// that someone else keeps alive. The safetensors and zip readers hold one, so that each reads
// from a path, from memory or from inside another mapped file through the same code.
// Header-only, like mapped_file.cpp it needs nothing beyond core/error.cpp, so that the fuzz
// targets can compile the readers with their sources alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/mapped_file.h"

namespace tessera {

class FileBytes {
 public:
  FileBytes() = default;

  // Maps `path` read-only (an Error names it when it cannot be mapped).
  static FileBytes map(const std::string& path) {
    auto h = std::make_shared<Holder>();
    const MappedFile& m = h->map.emplace(path);
    return FileBytes(std::move(h), m.bytes());
  }
  // Takes `bytes` over; they stay where they are (moving a vector keeps its buffer).
  static FileBytes own(std::vector<uint8_t> bytes) {
    auto h = std::make_shared<Holder>();
    h->owned = std::move(bytes);
    return FileBytes(h, h->owned);
  }
  // Reads `bytes` in place, nothing copied; `owner` keeps them alive.
  static FileBytes view(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner) {
    auto h = std::make_shared<Holder>();
    h->owner = std::move(owner);
    return FileBytes(std::move(h), bytes);
  }

  std::span<const uint8_t> bytes() const { return bytes_; }
  const uint8_t* data() const { return bytes_.data(); }
  uint64_t size() const { return bytes_.size(); }

  // MappedFile::drop_pages for a mapped file; in memory there is nothing to hand back.
  void drop_pages(uint64_t offset, uint64_t length) const {
    if (holder_ && holder_->map) holder_->map->drop_pages(offset, length);
  }

 private:
  // Shared, so that copies of a reader read the same bytes without mapping or copying again.
  struct Holder {
    std::optional<MappedFile> map;
    std::vector<uint8_t> owned;
    std::shared_ptr<const void> owner;
  };
  FileBytes(std::shared_ptr<const Holder> holder, std::span<const uint8_t> bytes)
      : holder_(std::move(holder)), bytes_(bytes) {}

  std::shared_ptr<const Holder> holder_;
  std::span<const uint8_t> bytes_;
};

}  // namespace tessera
