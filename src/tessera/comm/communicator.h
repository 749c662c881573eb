// The Communicator: collectives over a group of ranks, the only way ranks exchange tensors.
// Backends: gloo/ (host memory over TCP) and in_process/ (ranks as threads, for unit tests),
// each a GroupCommunicator over its own Transport (group_communicator.h); nccl/ (CUDA), a
// GroupCommunicator over a Gloo transport with NCCL's DeviceTransport beside it for GPU
// tensors. Calls are collective over the group: every member calls
// them in the same order. Asynchronous variants return a Work handle to wait on.
//
// Semantics shared by every backend (tests/unit/comm hold them to it):
// - Tensors live on any device, or on none (host memory). Reductions take f32, i32 and i64;
//   the data-moving calls (all_gather, broadcast, send/recv) take any dtype.
// - Ordering (stream-ordered): a call sees the values that the work issued before it on the
//   tensor's device produced (ops run in issue order on the device's default stream), and
//   work issued after a synchronous call, or after Work::wait(), sees its result.
//   * Host memory, and device tensors on a backend without a native collective library
//     (the host-staged path: device -> pinned host -> transport -> device): the calls run
//     on the host, and wait() blocks the host. Inline on the CPU. This path serves every
//     device under Gloo and in-process ranks (--device opencl and strict under launch).
//   * A native device library (NCCL, HCCL) runs the call on a communication stream that
//     waits on an event recorded on the compute stream; wait() makes the compute stream wait
//     for the call's event and returns without blocking the host.
// - Control scalars (the log's losses, the grad-norm slots, exit agreement) are host tensors
//   (no device) and always work: a native device backend carries them over a host group on
//   the same store, so they never round-trip through device memory.
// - Every call is bounded by the backend's timeout (Gloo: --distributed-timeout-minutes; a
//   native library has its own connect and execution timeouts); a timeout is a
//   tessera::Error naming the call, the group (its name and world ranks) and, where it can
//   be known, the ranks that had not arrived. After a timeout or a lost peer the
//   communicator is broken: the job is expected to exit.
// - An asynchronous call must keep its tensor alive and untouched until Work::wait()
//   returns, and its result is defined only once wait() has returned; a later synchronous
//   call on the same communicator first waits for the asynchronous collectives issued
//   before it.
// - Backends are created from the job's store by create_communicator (backend.h); a native
//   library's opaque unique id, of whatever size it has, travels through the store
//   (unique_id.h); sub-groups come from a parent and rank lists (split).
//
// Point-to-point (send/recv are not collective: only the two ranks take part):
// - Messages are matched per ordered pair: the k-th send from rank a to rank b fills the
//   k-th recv that b posted from a (FIFO per pair and direction). Both ends give tensors
//   of the same size in bytes.
// - send_async/recv_async post at once and return; any number may be outstanding, to the
//   same or different peers. They do not wait for earlier asynchronous collectives.
// - A send completes only once its recv has been posted (a rendezvous, as Gloo's transport
//   does). So a blocking send (send_async + wait) on both sides of a pair deadlocks until
//   the timeout, while posting everything first and then waiting never does: rank 0 posts
//   send(to 1) + recv(from 1), rank 1 posts send(to 0) + recv(from 0), both wait
//   (Megatron's batch_isend_irecv).
// - Work::wait() waits at most the timeout; the error names the call, the message's number
//   on its pair and the peer that did not post its side. A Work destroyed without wait()
//   waits in its destructor (ignoring errors), so the transport never writes to freed memory.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/tensor.h"

namespace tessera {

enum class ReduceOp { Sum, Max };

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;   // rank within this group
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;  // "gloo", "in-process", ...
  // "world", or the name given to split ("tp", "dp", ...), for messages.
  virtual std::string group_name() const = 0;
  // The world rank of each member, in group-rank order.
  virtual std::vector<int> world_ranks() const = 0;

  virtual void all_reduce(Tensor t, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> all_reduce_async(Tensor t, ReduceOp op) = 0;
  // out: [size * n] gathered in rank order from every rank's in: [n].
  virtual void all_gather(Tensor out, Tensor in) = 0;
  // in: [size * n] reduced; this rank receives its chunk out: [n].
  virtual void reduce_scatter(Tensor out, Tensor in, ReduceOp op) = 0;
  // Asynchronous all_gather and reduce_scatter (the distributed optimizer's buckets), under
  // all_reduce_async's rules; out and in on the same device. A backend that does not
  // override them runs the synchronous call and returns finished work (correct, not overlapped).
  virtual std::unique_ptr<Work> all_gather_async(Tensor out, Tensor in);
  virtual std::unique_ptr<Work> reduce_scatter_async(Tensor out, Tensor in, ReduceOp op);
  virtual void broadcast(Tensor t, int root) = 0;
  // Point-to-point; dst/src are ranks of this group other than this one.
  virtual void send(Tensor t, int dst) = 0;
  virtual void recv(Tensor t, int src) = 0;
  virtual std::unique_ptr<Work> send_async(Tensor t, int dst) = 0;
  virtual std::unique_ptr<Work> recv_async(Tensor t, int src) = 0;
  virtual void barrier() = 0;
  // A communicator over a subset of this group's ranks (listed in group-rank order).
  // Collective: every rank of this group calls it with the same list of lists (Megatron's
  // group construction), and gets the communicator of the subgroup it belongs to, or nullptr
  // when it is in none. A rank may appear in at most one list. `name` labels the subgroups in
  // messages ("dp" gives "dp" for every subgroup).
  virtual std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups,
                                              const std::string& name = "") = 0;
};

namespace comm_detail {
class FinishedWork final : public Work {
 public:
  void wait() override {}
};
}  // namespace comm_detail

inline std::unique_ptr<Work> Communicator::all_gather_async(Tensor out, Tensor in) {
  all_gather(out, in);
  return std::make_unique<comm_detail::FinishedWork>();
}

inline std::unique_ptr<Work> Communicator::reduce_scatter_async(Tensor out, Tensor in, ReduceOp op) {
  reduce_scatter(out, in, op);
  return std::make_unique<comm_detail::FinishedWork>();
}

}  // namespace tessera
