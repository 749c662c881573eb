// What every Communicator backend shares (internal to comm/): one GroupCommunicator class
// does the group's bookkeeping (names and world ranks, call numbers, argument checks, split,
// the queue that runs asynchronous all-reduces in issue order, p2p message numbers) and the
// host-staged path for tensors of a device the transport cannot address; a backend supplies
// only transports: a Transport, the primitives that move bytes between the ranks of one
// group in host memory, and for a native device library (NCCL, HCCL) a DeviceTransport
// beside it, which takes the tensors of its device, stream-ordered.
//
//   class GlooTransport final : public Transport { ...primitives on host memory... };
//   std::unique_ptr<Communicator> world = std::make_unique<GroupCommunicator>(std::move(t));
//   // NCCL: the host group carries host tensors (the control scalars) and barriers.
//   world = std::make_unique<GroupCommunicator>(create_gloo_transport(...), std::move(nccl));
//
// The host primitives see memory the transport addresses (host memory for Gloo and
// in-process), arguments already checked, more than one rank and at least one byte. The
// device transport's calls see checked arguments and at least one byte, one rank included.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/async_queue.h"
#include "tessera/comm/collective_util.h"
#include "tessera/comm/communicator.h"

namespace tessera::comm_detail {

// One group as seen from one of its ranks.
struct Group {
  std::string backend;           // "gloo", "in-process"
  std::string name;              // "world", or the name given to split
  std::vector<int> world_ranks;  // of each member, in group-rank order
  int rank = 0;                  // this rank's index in world_ranks
  std::chrono::milliseconds timeout{0};

  int size() const { return static_cast<int>(world_ranks.size()); }
  // "group 'dp' (world ranks 0, 2)"
  std::string text() const { return group_text(name, world_ranks); }
};

// One collective call, for the transport's tags and messages.
struct Call {
  std::string what;  // "all_reduce(sum) of 1024 f32"
  uint64_t seq = 0;  // 1, 2, ... per group; equal on every rank for the same call

  // "all_reduce(sum) of 1024 f32 (call 2 on group 'world' (world ranks 0, 1), this is world rank 0)"
  std::string where(const Group& g) const;
};

// What a timeout says, the same in every backend: "<where> timed out after 1.5 s<detail>",
// with the hint for collectives or for p2p.
Error collective_timeout(const std::string& where, std::chrono::milliseconds timeout, const std::string& detail);
Error p2p_timeout(const P2PText& text, std::chrono::milliseconds timeout, const std::string& detail = "");

// A split as every rank of the parent group computed it.
struct SplitPlan {
  std::vector<std::vector<int>> groups;  // parent group ranks, as passed to split
  int mine = -1;                         // the index of the list holding this rank, or -1
  int seq = 0;                           // split number on the parent: 0, 1, ...
  std::string name;                      // the subgroups' name

  // The subgroup `index` as seen from its member `parent_rank` (any member when the
  // transport builds all of them).
  Group subgroup(const Group& parent, int index, int parent_rank) const;
};

class Transport {
 public:
  explicit Transport(Group group) : group_(std::move(group)) {}
  virtual ~Transport() = default;
  const Group& group() const { return group_; }

  // In place; `count` elements of a reducible dtype.
  virtual void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, const Call& call) = 0;
  // out: size x bytes, in rank order.
  virtual void all_gather(void* out, const void* in, size_t bytes, const Call& call) = 0;
  // in: size x count elements; out: this rank's count, reduced.
  virtual void reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op,
                              const Call& call) = 0;
  virtual void broadcast(void* data, size_t bytes, int root, const Call& call) = 0;
  virtual void barrier(const Call& call) = 0;
  // Posts message number `message` (from 0, per pair and direction) to or from group rank
  // `peer` (communicator.h's p2p rules); the Work waits at most the timeout, and waits in
  // its destructor when never waited.
  virtual std::unique_ptr<Work> post(void* data, size_t bytes, int peer, bool is_send, uint64_t message,
                                     const P2PText& text) = 0;
  // Collective over the parent: the transport of this rank's subgroup, or nullptr.
  virtual std::unique_ptr<Transport> split(const SplitPlan& plan) = 0;

 private:
  Group group_;
};

// A native device library's collectives on the memory of its device (NCCL on CUDA, HCCL on
// an Ascend backend), stream-ordered as communicator.h says: each call runs after the work
// issued so far on the device's compute stream, and the returned Work's wait() orders the
// compute stream after the call without blocking the host. GroupCommunicator gives it the
// tensors it `addresses`, numbered and checked; everything else goes to the host Transport
// beside it, which is the same group (the same ranks, the same store).
class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  // The communicator's backend name: "nccl".
  virtual const char* backend() const = 0;
  // Whether t lives on this transport's device (then every call on t comes here).
  virtual bool addresses(const Tensor& t) const = 0;

  virtual std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op, const Call& call) = 0;
  virtual std::unique_ptr<Work> all_gather(const Tensor& out, const Tensor& in, const Call& call) = 0;
  virtual std::unique_ptr<Work> reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op,
                                               const Call& call) = 0;
  virtual std::unique_ptr<Work> broadcast(const Tensor& t, int root, const Call& call) = 0;
  // A send or receive with group rank `peer`. A library that needs matching calls grouped
  // (NCCL) may hold it until flush() or the Work's wait() (Megatron's batch_isend_irecv),
  // so posting everything first and then waiting never deadlocks.
  virtual std::unique_ptr<Work> post(const Tensor& t, int peer, bool is_send, const P2PText& text) = 0;
  // Launches what post() holds.
  virtual void flush() = 0;
  // Collective over every rank of the parent (ncclCommSplit is called by all of them):
  // the transport of this rank's subgroup `sub`, or nullptr when sub is null (in no list).
  virtual std::unique_ptr<DeviceTransport> split(const SplitPlan& plan, const Group* sub) = 0;
};

// Host memory for a tensor the transport cannot address, kept between calls and grown on
// demand (pinned through the tensor's device, as the async copies want).
class StagingBuffer {
 public:
  StagingBuffer() = default;
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  // At least `bytes` of host memory pinned for `device`.
  void* reserve(Device& device, size_t bytes);

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class GroupCommunicator : public Communicator {
 public:
  // `device`: a native library's transport for its device's tensors, or null (host and
  // host-staged tensors only).
  explicit GroupCommunicator(std::unique_ptr<Transport> transport, std::unique_ptr<DeviceTransport> device = nullptr);
  ~GroupCommunicator() override;

  int rank() const override { return group().rank; }
  int size() const override { return group().size(); }
  std::string backend_name() const override { return device_ ? device_->backend() : group().backend; }
  std::string group_name() const override { return group().name; }
  std::vector<int> world_ranks() const override { return group().world_ranks; }

  void all_reduce(Tensor t, ReduceOp op) override;
  std::unique_ptr<Work> all_reduce_async(Tensor t, ReduceOp op) override;
  void all_gather(Tensor out, Tensor in) override;
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(Tensor out, Tensor in) override;
  std::unique_ptr<Work> reduce_scatter_async(Tensor out, Tensor in, ReduceOp op) override;
  void broadcast(Tensor t, int root) override;
  void send(Tensor t, int dst) override;
  void recv(Tensor t, int src) override;
  std::unique_ptr<Work> send_async(Tensor t, int dst) override;
  std::unique_ptr<Work> recv_async(Tensor t, int src) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups,
                                      const std::string& name = "") override;

 protected:
  const Group& group() const { return transport_->group(); }
  Call next_call(std::string what) { return Call{std::move(what), ++seq_}; }

 private:
  // Whether t goes to the device transport.
  bool on_device(const Tensor& t) const { return device_ && t.device && device_->addresses(t); }
  std::unique_ptr<Work> post_p2p(const Tensor& t, int peer, bool is_send, const char* op);
  // The asynchronous all_gather / reduce_scatter: `in` staged (loaded) and `out` staged
  // behind it in one buffer when they are device memory; run(dst, src) on the queue.
  std::unique_ptr<Work> post_pair(const Call& c, const Tensor& out, const Tensor& in,
                                  std::function<void(char* dst, const char* src)> run);
  std::shared_ptr<StagingBuffer> idle_stage();
  std::unique_ptr<Work> device_call(const Call& c, const Tensor& out, const Tensor& in,
                                    const std::function<std::unique_ptr<Work>()>& run);

  std::unique_ptr<Transport> transport_;
  std::unique_ptr<DeviceTransport> device_;
  uint64_t seq_ = 0;
  int splits_ = 0;
  std::vector<uint64_t> sent_to_, received_from_;  // p2p messages posted, per peer
  StagingBuffer stage_in_, stage_out_;             // the synchronous calls' host copies
  std::vector<std::shared_ptr<StagingBuffer>> async_stages_;  // the asynchronous calls', reused
  AsyncQueue queue_;  // last: destroyed first, while the transport is alive
};

}  // namespace tessera::comm_detail
