// Two "hosts" built inside the test: network namespaces A and B joined by a veth pair
// (10.231.<x>.1 in A, .2 in B; nothing is added to the test's own namespace, so traffic stays
// inside them). Rank 0 runs in A and serves the store as under torchrun (MASTER_PORT + 1),
// rank 1 runs in B; MASTER_ADDR is A's address. A 2-process all-reduce crosses the veth with
// GLOO_SOCKET_IFNAME set to each side's veth name, and again with it unset, so that each
// rank finds its interface from the route to MASTER_ADDR (in A the route runs through
// loopback but its source address is the veth's). Needs root and `ip netns`; skips with a
// message otherwise. Namespaces are named with the pid and always removed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

#include "tessera/comm/gloo/gloo_communicator.h"
#include "tessera/comm/local_ranks.h"
#include "tessera/comm/store.h"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

class TwoHosts {
 public:
  TwoHosts() {
    const std::string id = std::to_string(::getpid());
    ns_a = "tsr" + id + "a";
    ns_b = "tsr" + id + "b";
    veth_a = "tsv" + id + "a";
    veth_b = "tsv" + id + "b";
    subnet = "10.231." + std::to_string(::getpid() % 250) + ".";
    addr_a = subnet + "1";
    addr_b = subnet + "2";
    const std::string steps[] = {
        "ip netns add " + ns_a,
        "ip netns add " + ns_b,
        "ip -n " + ns_a + " link set lo up",
        "ip -n " + ns_b + " link set lo up",
        "ip -n " + ns_a + " link add " + veth_a + " type veth peer name " + veth_b + " netns " + ns_b,
        "ip -n " + ns_a + " addr add " + addr_a + "/24 dev " + veth_a,
        "ip -n " + ns_b + " addr add " + addr_b + "/24 dev " + veth_b,
        "ip -n " + ns_a + " link set " + veth_a + " up",
        "ip -n " + ns_b + " link set " + veth_b + " up",
    };
    for (const auto& s : steps)
      if (sh(s) != 0) {
        failed_step = s;
        return;
      }
    ok = true;
  }
  ~TwoHosts() {
    sh("ip netns del " + ns_a);  // removes the veth pair with it
    sh("ip netns del " + ns_b);
  }
  bool ok = false;
  std::string failed_step;
  std::string ns_a, ns_b, veth_a, veth_b, subnet, addr_a, addr_b;
};

void enter_namespace(const std::string& name) {
  int fd = ::open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) throw std::runtime_error("cannot enter network namespace " + name);
  ::close(fd);
}

// Rank 0 in A, rank 1 in B; returns every rank's output when something failed.
void all_reduce_across(const TwoHosts& h, bool set_ifname) {
  LocalRanksOptions o;
  o.world_size = 2;
  o.timeout = 30s;
  o.serve_store = false;  // rank 0 serves it inside A, as under torchrun
  o.master_addr = h.addr_a;
  o.child_setup = [&](int rank) {
    enter_namespace(rank == 0 ? h.ns_a : h.ns_b);
    ::setenv("MASTER_PORT", "29500", 1);
    if (set_ifname) ::setenv("GLOO_SOCKET_IFNAME", rank == 0 ? h.veth_a.c_str() : h.veth_b.c_str(), 1);
    else ::unsetenv("GLOO_SOCKET_IFNAME");
  };
  auto results = run_local_ranks(o, [&](int rank) {
    const std::string token = std::getenv("TESSERA_JOB_TOKEN");
    std::unique_ptr<TcpStoreServer> server;
    if (rank == 0) server = std::make_unique<TcpStoreServer>(29501, token);
    std::shared_ptr<Store> store(connect_tcp_store(h.addr_a, 29501, token, 15s));
    GlooOptions g;
    g.timeout = 15s;
    g.master_addr = h.addr_a;
    g.master_port = 29500;
    const InterfaceChoice iface = gloo_interface(g);
    const std::string want = rank == 0 ? h.veth_a : h.veth_b;
    if (iface.name != want) throw std::runtime_error("chose " + iface.name + " (" + iface.reason + "), want " + want);
    auto c = create_gloo_communicator(store, rank, 2, g);
    std::vector<float> x(300000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((rank + 1) * (i % 11));
    c->all_reduce(Tensor(x.data(), DType::F32, {int64_t(x.size())}, nullptr), ReduceOp::Sum);
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != float(3 * (i % 11))) throw std::runtime_error("wrong sum at " + std::to_string(i));
    c->barrier();  // rank 0 keeps serving the store until rank 1 is done with it
    std::printf("rank %d: %s (%s), %s\n", rank, iface.name.c_str(), iface.ipv4.c_str(), iface.reason.c_str());
    return 0;
  });
  EXPECT_EQ(describe_failures(results), "");
  EXPECT_NE(results[0].output.find(h.addr_a), std::string::npos) << results[0].output;
  EXPECT_NE(results[1].output.find(h.addr_b), std::string::npos) << results[1].output;
  std::printf("%s%s", results[0].output.c_str(), results[1].output.c_str());
}

}  // namespace

TEST(GlooNetns, AllReduceAcrossTwoNamespacesWithSocketIfname) {
  TwoHosts h;
  if (!h.ok) GTEST_SKIP() << "cannot build network namespaces here (needs root and `ip netns`): " << h.failed_step;
  all_reduce_across(h, /*set_ifname=*/true);
}

TEST(GlooNetns, AllReduceAcrossTwoNamespacesWithInterfaceFromTheRoute) {
  TwoHosts h;
  if (!h.ok) GTEST_SKIP() << "cannot build network namespaces here (needs root and `ip netns`): " << h.failed_step;
  all_reduce_across(h, /*set_ifname=*/false);
}
