#include "tessera/comm/socket_util.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera::comm_detail {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return msg;
}

std::string sockaddr_text(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    std::string s = "[";  // built piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string
    s += host;
    s += "]:";
    s += std::to_string(port);
    return s;
  }
  return "?";
}

IoStatus send_all(int fd, const void* data, size_t len, int* err) {
  auto* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return (errno == EPIPE || errno == ECONNRESET) ? IoStatus::Closed : IoStatus::Error;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return IoStatus::Ok;
}

IoStatus recv_all(int fd, void* data, size_t len, Clock::time_point deadline, int* err) {
  auto* p = static_cast<char*>(data);
  while (len > 0) {
    int wait_ms = -1;
    if (deadline != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return IoStatus::Timeout;
      wait_ms = static_cast<int>(std::min<long long>(left, 1 << 30));
    }
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return IoStatus::Error;
    }
    if (r == 0) return IoStatus::Timeout;
    ssize_t n = ::recv(fd, p, len, 0);
    if (n == 0) return IoStatus::Closed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *err = errno;
      return errno == ECONNRESET ? IoStatus::Closed : IoStatus::Error;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return IoStatus::Ok;
}

}  // namespace tessera::comm_detail
