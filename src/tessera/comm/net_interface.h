// Which network interface a process's collectives use.
//
// The rule (the two-server guide's GLOO_SOCKET_IFNAME, without its traps):
//   1. GLOO_SOCKET_IFNAME set: a comma list as PyTorch reads it. Every name must exist and have
//      an IPv4 address (else an Error listing this machine's interfaces and addresses); the
//      first one is used (PyTorch opens one Gloo device per name; one is enough for us).
//   2. unset: the interface that owns the source address of the route to MASTER_ADDR (a UDP
//      socket connected to MASTER_ADDR:MASTER_PORT, then getsockname; no packet is sent). On
//      node 0 that route runs through the loopback device but its source address is node 0's
//      own address, which belongs to the real interface. This host's own name is never
//      resolved (that often lands on 127.0.1.1 or the wrong NIC).
//   3. no MASTER_ADDR (a single process): the loopback interface.
#pragma once

#include <string>
#include <vector>

namespace tessera {

struct NetInterface {
  std::string name;
  std::vector<std::string> ipv4;  // dotted quads
  std::vector<std::string> ipv6;
  bool up = false;
  bool loopback = false;
};

// This machine's interfaces, in the order getifaddrs(3) reports them.
std::vector<NetInterface> list_net_interfaces();
// "lo 127.0.0.1 (up); eth0 192.0.2.2, fd00::2 (up); ifb0 no address (down)"
std::string describe_net_interfaces(const std::vector<NetInterface>& interfaces);

struct InterfaceChoice {
  std::string name;  // interface name
  std::string ipv4;  // the address Gloo binds to
  std::string reason;  // "GLOO_SOCKET_IFNAME=eth0", "the route to MASTER_ADDR 10.0.0.1:29500", ...
};

// Applies the rule above. `socket_ifname` is GLOO_SOCKET_IFNAME's value ("" when unset).
// Throws tessera::Error (usage) for a bad name, listing the interfaces.
InterfaceChoice choose_interface(const std::string& socket_ifname, const std::string& master_addr, int master_port);

}  // namespace tessera
