// The Gloo backend: collectives on CPU tensors over TCP (Debian's libgloo).
//
// A process creates its world communicator from the job's store:
//
//   auto store = std::shared_ptr<Store>(connect_tcp_store(host, port, token, timeout));
//   GlooOptions opt;
//   opt.timeout = std::chrono::minutes(args.distributed_timeout_minutes);
//   opt.master_addr = id.master_addr;  opt.master_port = id.master_port;
//   opt.key_prefix = id.key_prefix;    // keys of this run and restart attempt
//   auto world = create_gloo_communicator(store, id.rank, id.world_size, opt);
//
// The network interface follows net_interface.h's rule (GLOO_SOCKET_IFNAME, else the route
// to MASTER_ADDR) and is logged once per process. Every rank connects to every other rank of
// a group (Gloo's full mesh) through addresses exchanged in the store under
// "<key_prefix>gloo/<group path>/". split() builds each subgroup as its own Gloo context on
// the same transport device. Algorithms: all_reduce, all_gather, broadcast and barrier are
// Gloo's own (ring all-reduce); reduce_scatter is a ring over Gloo's unbound buffers. send and
// recv post on Gloo's unbound buffers, which are non-blocking: each message gets its own
// buffer and the slot of its number on its pair and direction (both ends count), so the k-th
// send meets the k-th recv. Asynchronous all-reduces run in order on one background thread
// per communicator.
//
// A timeout names the call, its sequence number on the group, the group and the ranks that
// had not reached the call: each rank that times out records that in the store and waits a
// few seconds for the others' records; the ranks without one are named.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/comm/net_interface.h"
#include "tessera/comm/store.h"

namespace tessera {

struct GlooOptions {
  // Bounds connecting and every collective (--distributed-timeout-minutes; Megatron's
  // default is 10 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // For choosing the interface by the route to MASTER_ADDR; empty for a single process.
  std::string master_addr;
  int master_port = 0;
  // GLOO_SOCKET_IFNAME; unset reads the environment variable.
  std::optional<std::string> socket_ifname;
  // Prefix of every store key (e.g. launch::WorkerIdentity::key_prefix).
  std::string key_prefix;
};

std::unique_ptr<Communicator> create_gloo_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                       const GlooOptions& options);

// The interface the options choose (what create_gloo_communicator logs).
InterfaceChoice gloo_interface(const GlooOptions& options);

}  // namespace tessera
