// A whole file mapped read-only, for the readers that parse in place: safetensors, the zip
// container of torch checkpoints, the indexed dataset's .idx/.bin and the .npy caches.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace tessera {

class MappedFile {
 public:
  // Maps `path`; an Error names the file when it is missing, unreadable or not a regular
  // file. An empty file maps to nothing (bytes() is empty).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  // Open as long as the map: a copy_file_range from it reads the very file that was validated,
  // even if the path has been replaced since.
  int fd() const { return fd_; }

  // Hands back the mapped pages under bytes [offset, offset + length) once they have been
  // copied (a later read faults them in again from the page cache), so that a reader copying
  // a big file piece by piece stays resident by one piece. Whole pages: a neighbour's page
  // dropped too is only read again.
  void drop_pages(uint64_t offset, uint64_t length) const;

 private:
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tessera
