// TCP ports for unit tests that must know a port before anything binds it: the same registry
// as tests/integration/ports.py (its docstring says why a claimed port cannot be taken by
// another test, a port-0 bind or an outgoing connection). A test that only needs *a* server
// binds port 0 instead (TcpStoreServer(0, ...)).
//
//   int port = tessera::test_ports::claim();   // one port, this process's until it exits
//   int port = tessera::test_ports::claim(2);  // port and port + 1
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera::test_ports {

inline std::string registry() {
  const char* dir = std::getenv("TESSERA_TEST_PORTS_DIR");
  return dir && *dir ? dir : "/tmp/tessera-test-ports";
}

// The process's start time in clock ticks (so that a reused pid is not its owner); "" when gone.
inline std::string process_start_time(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 0; i < 20 && rest >> field; ++i) {
  }
  return rest ? field : "";
}

inline bool held(int port) {
  std::ifstream f(registry() + "/" + std::to_string(port));
  long pid = 0;
  std::string started;
  return f >> pid >> started && process_start_time(pid) == started;
}

// SO_REUSEADDR as tessera's store sets it: a port in TIME_WAIT is free to it, a listener is not.
inline bool bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// [first, last] below the kernel's ephemeral range, as ports.py's claimable_range.
inline std::pair<int, int> claimable_range() {
  constexpr int kFirst = 20000;
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768, high = 60999;
  f >> low >> high;
  if (low - kFirst >= 1000) return {kFirst, low - 1};
  if (65535 - high >= 1000) return {high + 1, 65535};
  throw std::runtime_error("the ephemeral port range leaves no room for test ports");
}

// The first of `count` consecutive ports no other test holds and nothing listens on.
inline int claim(int count = 1) {
  const std::string dir = registry();
  ::mkdir(dir.c_str(), 0777);
  const auto [first, last] = claimable_range();
  int lock = ::open((dir + "/lock").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + dir + "/lock");
  const std::string owner = std::to_string(::getpid()) + " " + process_start_time(::getpid());
  const int span = last - first + 2 - count;
  const int start = static_cast<int>(std::random_device{}() % static_cast<unsigned>(span));
  for (int i = 0; i < span; ++i) {
    const int port = first + (start + i) % span;
    bool free = true;
    for (int p = port; p < port + count && free; ++p) free = !held(p) && bindable(p);
    if (!free) continue;
    for (int p = port; p < port + count; ++p) std::ofstream(dir + "/" + std::to_string(p)) << owner;
    ::close(lock);
    return port;
  }
  ::close(lock);
  throw std::runtime_error("no free consecutive test ports (claims in " + dir + ")");
}

}  // namespace tessera::test_ports
