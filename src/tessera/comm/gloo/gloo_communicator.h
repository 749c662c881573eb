// The Gloo backend: collectives on host memory over TCP (Debian's libgloo); device tensors
// reach it through the host-staged path of GroupCommunicator.
//
// Code outside comm/ goes through create_communicator (backend.h); inside, a process creates
// its world communicator from the job's store:
//
//   auto store = std::shared_ptr<Store>(connect_tcp_store(host, port, token, timeout));
//   GlooOptions opt;                                 // CommOptions (backend.h)
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

#include <memory>

#include "tessera/comm/backend.h"
#include "tessera/comm/group_communicator.h"
#include "tessera/comm/net_interface.h"

namespace tessera {

// The factory's options; `backend` is not read here.
using GlooOptions = CommOptions;

std::unique_ptr<Communicator> create_gloo_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                       const GlooOptions& options);

// The same group as a bare Transport: a native device library's communicator (NCCL, HCCL)
// hands it to its GroupCommunicator base as the host group that carries host tensors.
std::unique_ptr<comm_detail::Transport> create_gloo_transport(std::shared_ptr<Store> store, int rank,
                                                              int world_size, const GlooOptions& options);

// The interface the options choose (what create_gloo_communicator logs).
InterfaceChoice gloo_interface(const GlooOptions& options);

}  // namespace tessera
