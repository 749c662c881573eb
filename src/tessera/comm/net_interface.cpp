#include "tessera/comm/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "tessera/comm/socket_util.h"
#include "tessera/core/error.h"

namespace tessera {

using comm_detail::errno_text;
using comm_detail::Fd;

std::vector<NetInterface> list_net_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  auto find = [&out](const char* name) -> NetInterface& {
    for (auto& i : out)
      if (i.name == name) return i;
    out.push_back(NetInterface{name, {}, {}, false, false});
    return out.back();
  };
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_name) continue;
    NetInterface& i = find(a->ifa_name);
    i.up = i.up || (a->ifa_flags & IFF_UP);
    i.loopback = i.loopback || (a->ifa_flags & IFF_LOOPBACK);
    if (!a->ifa_addr) continue;
    char text[INET6_ADDRSTRLEN];
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
      i.ipv4.push_back(text);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, text, sizeof(text));
      i.ipv6.push_back(text);
    }
  }
  ::freeifaddrs(list);
  return out;
}

std::string describe_net_interfaces(const std::vector<NetInterface>& interfaces) {
  std::string s;
  for (const auto& i : interfaces) {
    if (!s.empty()) s += "; ";
    s += i.name + " ";
    std::string addrs;
    for (const auto& a : i.ipv4) addrs += (addrs.empty() ? "" : ", ") + a;
    for (const auto& a : i.ipv6) addrs += (addrs.empty() ? "" : ", ") + a;
    s += addrs.empty() ? "no address" : addrs;
    s += i.up ? " (up)" : " (down)";
  }
  return s.empty() ? "none found" : s;
}

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string item = s.substr(start, comma - start);
    // Trim blanks that a shell variable may carry.
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.pop_back();
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.erase(0, 1);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// The local source address of the route to host:port (IPv4).
std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0)
    throw usage_error("cannot choose a network interface: MASTER_ADDR '" + host + "' has no IPv4 address (" +
                          gai_strerror(gai) + ")",
                      "set MASTER_ADDR to node 0's IPv4 address, or set GLOO_SOCKET_IFNAME to the interface "
                      "that reaches the other nodes");
  std::string error;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      error = errno_text(errno);
      continue;
    }
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      error = errno_text(errno);
      continue;
    }
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
    ::freeaddrinfo(res);
    return text;
  }
  if (res) ::freeaddrinfo(res);
  throw usage_error("cannot choose a network interface: there is no route to MASTER_ADDR " + host + ":" +
                        std::to_string(port) + " (" + error + ")",
                    "check `ip route get <MASTER_ADDR>`, or set GLOO_SOCKET_IFNAME to the interface that reaches "
                    "the other nodes");
}

}  // namespace

InterfaceChoice choose_interface(const std::string& socket_ifname, const std::string& master_addr, int master_port) {
  const auto interfaces = list_net_interfaces();
  if (!socket_ifname.empty()) {
    const auto names = split_commas(socket_ifname);
    if (names.empty())
      throw usage_error("GLOO_SOCKET_IFNAME='" + socket_ifname + "' names no interface",
                        "unset it, or set it to one of: " + describe_net_interfaces(interfaces));
    InterfaceChoice choice;
    for (const auto& name : names) {
      const NetInterface* found = nullptr;
      for (const auto& i : interfaces)
        if (i.name == name) found = &i;
      if (!found)
        throw usage_error("GLOO_SOCKET_IFNAME names '" + name + "', which is not an interface of this machine",
                          "this machine's interfaces and addresses: " + describe_net_interfaces(interfaces));
      if (found->ipv4.empty())
        throw usage_error("GLOO_SOCKET_IFNAME names '" + name + "', which has no IPv4 address",
                          "this machine's interfaces and addresses: " + describe_net_interfaces(interfaces));
      if (choice.name.empty()) choice = {name, found->ipv4.front(), "GLOO_SOCKET_IFNAME=" + socket_ifname};
    }
    return choice;
  }
  if (master_addr.empty()) return {"lo", "127.0.0.1", "a single process (no MASTER_ADDR)"};
  const std::string source = route_source_address(master_addr, master_port > 0 ? master_port : 29500);
  const std::string reason = "the route to MASTER_ADDR " + master_addr + ":" + std::to_string(master_port);
  for (const auto& i : interfaces)
    for (const auto& a : i.ipv4)
      if (a == source) return {i.name, source, reason};
  // The source address belongs to no listed interface (unusual: a VRF or a policy route);
  // binding to the address itself still works.
  return {"?", source, reason};
}

}  // namespace tessera
