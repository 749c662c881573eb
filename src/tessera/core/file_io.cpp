#include "tessera/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/core/error.h"

namespace tessera {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw runtime_error("cannot read " + path + ": " + errno_text());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

SyncedFileWriter::SyncedFileWriter(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
  if (fd_ < 0) throw runtime_error("cannot write " + path + ": " + errno_text(), "check that the folder is writable");
}

SyncedFileWriter::~SyncedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SyncedFileWriter::append(std::span<const char> bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw runtime_error("writing " + path_ + " failed: " + errno_text(), "check free disk space");
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void SyncedFileWriter::finish() {
  if (::fsync(fd_) != 0) throw runtime_error("fsync of " + path_ + " failed: " + errno_text(), "check the disk");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw runtime_error("closing " + path_ + " failed: " + errno_text());
}

void write_file_synced(const std::string& path, std::span<const char> bytes) {
  SyncedFileWriter file(path);
  file.append(bytes);
  file.finish();
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw runtime_error("cannot open folder " + path + " to sync it: " + errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw runtime_error("fsync of folder " + path + " failed: " + errno_text(), "check the disk");
}

void write_file_atomic(const std::string& path, std::span<const char> bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_file_synced(tmp, bytes);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw runtime_error("cannot rename " + tmp + " to " + path + ": " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

void check_folder_writable(const std::string& dir, const std::string& flag) {
  namespace fs = std::filesystem;
  const std::string hint = "pass " + flag + " a folder this process can create files in";
  fs::path at = fs::absolute(fs::path(dir)).lexically_normal();
  if (!at.has_filename()) at = at.parent_path();  // "ckpt/" -> "ckpt"
  for (;;) {
    std::error_code ec;
    const fs::file_status st = fs::status(at, ec);
    if (st.type() == fs::file_type::directory) break;
    if (st.type() != fs::file_type::not_found)  // a file, or a path it cannot look through
      throw usage_error(flag + " " + dir + ": " + at.string() +
                            (ec ? " cannot be read: " + ec.message() : " is a file, not a folder"),
                        hint);
    at = at.parent_path();
  }
  std::string probe = (at / ".tessera-write-check-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    throw usage_error(flag + " " + dir + ": cannot create files in " + at.string() + ": " + errno_text(), hint);
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace tessera
