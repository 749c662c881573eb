// Small POSIX socket helpers shared by the store and the interface lookup (internal to comm/).
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::comm_detail {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

std::string errno_text(int err);
// "10.0.0.1:29500" for an IPv4/IPv6 socket address.
std::string sockaddr_text(const sockaddr* sa);

enum class IoStatus { Ok, Closed, Timeout, Error };

// Writes all of `len` bytes (MSG_NOSIGNAL); Error sets *err to errno.
IoStatus send_all(int fd, const void* data, size_t len, int* err);
// Reads exactly `len` bytes, waiting at most until `deadline` (Clock::time_point::max(): forever).
IoStatus recv_all(int fd, void* data, size_t len, Clock::time_point deadline, int* err);

}  // namespace tessera::comm_detail
