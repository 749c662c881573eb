#include "tessera/core/mapped_file.h"

// Depends only on core/error.cpp, so that fuzz targets can compile the readers with it alone.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "tessera/core/error.h"

namespace tessera {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_io_error(path, "cannot open", errno);
  struct stat st{};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw_io_error(path, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw runtime_error(path + " is not a regular file", "give the path of a file, not of a folder or a device");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ == 0) return;  // mmap refuses a zero length
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd_);
    throw_io_error(path, "cannot map", err);
  }
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  std::swap(path_, other.path_);
  std::swap(fd_, other.fd_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  return *this;  // `other` unmaps what this held
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::drop_pages(uint64_t offset, uint64_t length) const {
  TESSERA_CHECK(offset <= size_ && length <= size_ - offset, "drop_pages past the end of " + path_);
  if (!data_) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = offset / page * page;  // the map starts on a page boundary
  const uint64_t end = std::min((offset + length + page - 1) / page * page, (size_ + page - 1) / page * page);
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_ + begin), end - begin, MADV_DONTNEED);
}

}  // namespace tessera
