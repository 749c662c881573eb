#include "tessera/data/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "tessera/core/error.h"
#include "tessera/core/log.h"

namespace tessera::data {
namespace {

constexpr size_t kBufferSize = 1 << 20;

// Temporary files to unlink on SIGINT/SIGTERM. A fixed table so that the handler stays
// async-signal-safe: state 0 free, 1 being filled, 2 live.
constexpr int kSlots = 256;
struct TempSlot {
  std::atomic<int> state{0};
  char path[4096];
};
TempSlot g_slots[kSlots];

int register_temp(const std::string& path) {
  if (path.size() >= sizeof(g_slots[0].path)) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(2);
      return i;
    }
  }
  return -1;
}

void unregister_temp(int slot) {
  if (slot >= 0) g_slots[slot].state.store(0);
}

extern "C" void cleanup_and_die(int sig) {
  for (auto& slot : g_slots)
    if (slot.state.load() == 2) ::unlink(slot.path);
  // SA_RESETHAND restored the default action: die of the signal, as the caller expects.
  ::raise(sig);
}

void write_all(int fd, const char* data, size_t size, const std::string& name) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error(name, "cannot write", errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself already happened
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string read_file(const std::string& path, std::string_view what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io_error(path, "cannot open " + std::string(what), errno);
  struct stat st{};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw_io_error(path, "cannot read " + std::string(what), EISDIR);
  }
  std::string out;
  if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw_io_error(path, "cannot read " + std::string(what), err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void install_temp_file_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa{};
    sa.sa_handler = cleanup_and_die;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  });
}

SignalBlock::SignalBlock() {
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &block, &saved_);
}

SignalBlock::~SignalBlock() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

std::string parent_dir(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// ---- AtomicFile -------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  slot_ = register_temp(temp_path_);
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    int err = errno;
    unregister_temp(slot_);
    struct stat st{};
    std::string dir = parent_dir(path_);
    if (::stat(dir.c_str(), &st) != 0)
      throw runtime_error("cannot write " + path_ + ": folder " + dir + " does not exist",
                          "create the folder first (mkdir -p " + dir + ")");
    throw_io_error(path_, "cannot create", err);
  }
  buffer_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
  unregister_temp(slot_);
}

void AtomicFile::write(const void* data, size_t size) {
  written_ += size;
  if (buffer_.size() + size > kBufferSize) {
    flush();
    if (size >= kBufferSize) {
      write_all(fd_, static_cast<const char*>(data), size, path_);
      return;
    }
  }
  buffer_.append(static_cast<const char*>(data), size);
}

void AtomicFile::flush() {
  TESSERA_CHECK(fd_ >= 0, "AtomicFile used after commit");
  if (!buffer_.empty()) write_all(fd_, buffer_.data(), buffer_.size(), path_);
  buffer_.clear();
}

void AtomicFile::sync() {
  flush();
  if (::fsync(fd_) != 0) throw_io_error(path_, "cannot sync", errno);
  synced_ = true;
}

void AtomicFile::commit() {
  if (!synced_) sync();
  if (::close(fd_) != 0) {
    int err = errno;
    fd_ = -1;
    ::unlink(temp_path_.c_str());
    throw_io_error(path_, "cannot close", err);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(temp_path_.c_str());
    unregister_temp(slot_);
    slot_ = -1;
    throw_io_error(path_, "cannot rename " + temp_path_ + " to", err);
  }
  unregister_temp(slot_);
  slot_ = -1;
  fsync_dir(parent_dir(path_));
}

// ---- ScratchFile ------------------------------------------------------------------------

ScratchFile::ScratchFile(const std::string& dir) : dir_(dir) {
#ifdef O_TMPFILE
  fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
  if (fd_ < 0) {
    std::string tmpl = dir + "/.tessera-scratch-XXXXXX";
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ < 0) throw_io_error(dir, "cannot create a scratch file in", errno);
    ::unlink(tmpl.c_str());
  }
}

ScratchFile::ScratchFile(ScratchFile&& other) noexcept
    : dir_(std::move(other.dir_)), fd_(other.fd_), written_(other.written_),
      buffer_(std::move(other.buffer_)) {
  other.fd_ = -1;
}

ScratchFile::~ScratchFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ScratchFile::write(const void* data, size_t size) {
  written_ += size;
  if (buffer_.size() + size > kBufferSize) {
    flush();
    if (size >= kBufferSize) {
      write_all(fd_, static_cast<const char*>(data), size, "scratch file in " + dir_);
      return;
    }
  }
  if (buffer_.capacity() < kBufferSize) buffer_.reserve(kBufferSize);
  buffer_.append(static_cast<const char*>(data), size);
}

void ScratchFile::flush() {
  if (!buffer_.empty()) write_all(fd_, buffer_.data(), buffer_.size(), "scratch file in " + dir_);
  buffer_.clear();
}

void ScratchFile::read_at(void* out, size_t size, uint64_t offset) const {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_io_error("scratch file in " + dir_, "cannot read", n < 0 ? errno : EIO);
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void copy_file_bytes(int in_fd, uint64_t in_offset, uint64_t size, AtomicFile& out,
                     const std::string& in_name) {
  out.flush();
  loff_t off = static_cast<loff_t>(in_offset);
  uint64_t left = size;
  bool kernel = true;
  while (left > 0 && kernel) {
    ssize_t n = ::copy_file_range(in_fd, &off, out.fd(), nullptr, left, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) {
        kernel = false;
        break;
      }
      throw_io_error(out.path(), "cannot copy " + in_name + " into", errno);
    }
    if (n == 0) throw runtime_error(in_name + " is shorter than expected (changed while reading?)");
    left -= static_cast<uint64_t>(n);
    out.note_external_write(static_cast<uint64_t>(n));
  }
  std::string buf(std::min<uint64_t>(left, kBufferSize), '\0');
  while (left > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    ssize_t n = ::pread(in_fd, buf.data(), want, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error(in_name, "cannot read", errno);
    if (n == 0) throw runtime_error(in_name + " is shorter than expected (changed while reading?)");
    out.write(buf.data(), static_cast<size_t>(n));
    off += n;
    left -= static_cast<uint64_t>(n);
  }
}

}  // namespace tessera::data
