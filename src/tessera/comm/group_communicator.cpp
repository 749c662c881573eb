#include "tessera/comm/group_communicator.h"

#include <cstdio>
#include <cstring>

#include "tessera/device/device.h"

namespace tessera::comm_detail {

using std::chrono::milliseconds;

std::string Call::where(const Group& g) const {
  return what + " (call " + std::to_string(seq) + " on " + g.text() + ", this is world rank " +
         std::to_string(g.world_ranks[g.rank]) + ")";
}

namespace {

std::string seconds_text(milliseconds timeout) {
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g s", static_cast<double>(timeout.count()) / 1000.0);
  return secs;
}

const char* const kCollectiveTimeoutHint =
    "a rank that does not reach a collective is stuck elsewhere or has failed: look at its output; raise "
    "--distributed-timeout-minutes only if it is merely slow";

}  // namespace

Error collective_timeout(const std::string& where, milliseconds timeout, const std::string& detail) {
  return runtime_error(where + " timed out after " + seconds_text(timeout) + detail, kCollectiveTimeoutHint);
}

Error p2p_timeout(const P2PText& text, milliseconds timeout, const std::string& detail) {
  return runtime_error(text.what + " " + text.where + " timed out after " + seconds_text(timeout) + ": " +
                           text.absent + detail,
                       kP2PTimeoutHint);
}

Group SplitPlan::subgroup(const Group& parent, int index, int parent_rank) const {
  Group g{parent.backend, name, {}, 0, parent.timeout};
  const std::vector<int>& members = groups[index];
  for (size_t i = 0; i < members.size(); ++i) {
    g.world_ranks.push_back(parent.world_ranks[members[i]]);
    if (members[i] == parent_rank) g.rank = static_cast<int>(i);
  }
  return g;
}

// ---- host staging ---------------------------------------------------------------------------------

StagingBuffer::~StagingBuffer() {
  if (data_) device_->free_pinned(data_, bytes_);
}

void* StagingBuffer::reserve(Device& device, size_t bytes) {
  if (device_ == &device && bytes_ >= bytes) return data_;
  if (data_) device_->free_pinned(data_, bytes_);
  data_ = nullptr;  // allocate_pinned may throw: never free twice
  data_ = device.allocate_pinned(bytes);
  device_ = &device;
  bytes_ = bytes;
  return data_;
}

namespace {

// Whether the transport may use the tensor's memory in place; otherwise it goes through a
// host copy (the host-staged path: device -> pinned host -> transport -> device).
bool host_addressable(const Tensor& t) { return t.device == nullptr || t.device->is_host(); }

// Host memory holding t's bytes: t itself, or `stage` filled from the device when `load`.
// The synchronous device copy is ordered after the work already issued on the device's
// stream, so a collective sees the values the preceding ops produced.
char* host_bytes(const Tensor& t, StagingBuffer& stage, bool load) {
  if (host_addressable(t)) return t.host<char>();
  auto* p = static_cast<char*>(stage.reserve(*t.device, t.bytes()));
  if (load && t.bytes()) copy_to_host(p, t.bytes(), t);
  return p;
}

// Puts a result computed in host memory `p` back into a staged t.
void unstage(const Tensor& t, const void* p) {
  if (!host_addressable(t) && t.bytes()) copy_from_host(t, p, t.bytes());
}

void check_memory(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.numel() == 0 || t.handle != nullptr, std::string(op) + ": the tensor has no memory");
}

// An asynchronous call on a staged tensor: the transport's Work, then the copy of the result
// into the tensor, on the thread that waits (device calls stay on the caller's thread).
class StagedWork final : public Work {
 public:
  StagedWork(std::shared_ptr<StagingBuffer> stage, std::unique_ptr<Work> inner, Tensor result, const void* host)
      : stage_(std::move(stage)), inner_(std::move(inner)), result_(std::move(result)), host_(host) {}

  void wait() override {
    inner_->wait();
    if (copied_) return;
    copied_ = true;
    if (!result_.empty()) unstage(result_, host_);
  }

 private:
  std::shared_ptr<StagingBuffer> stage_;  // first: outlives inner_, which may wait in its destructor
  std::unique_ptr<Work> inner_;
  Tensor result_;  // empty for a send
  const void* host_;
  bool copied_ = false;
};

}  // namespace

// ---- the communicator -----------------------------------------------------------------------------

GroupCommunicator::GroupCommunicator(std::unique_ptr<Transport> transport, std::unique_ptr<DeviceTransport> device)
    : transport_(std::move(transport)), device_(std::move(device)) {}

GroupCommunicator::~GroupCommunicator() = default;

void GroupCommunicator::all_reduce(Tensor t, ReduceOp op) {
  if (!on_device(t)) queue_.drain();
  check_memory(t, "all_reduce");
  check_reducible(t, "all_reduce");
  const Call c = next_call(call_text(std::string("all_reduce(") + reduce_op_name(op) + ")", t));
  if (on_device(t)) {
    if (t.bytes()) device_->all_reduce(t, op, c)->wait();
    return;
  }
  if (size() == 1 || t.bytes() == 0) return;
  char* p = host_bytes(t, stage_in_, /*load=*/true);
  transport_->all_reduce(p, static_cast<size_t>(t.numel()), t.dtype, op, c);
  unstage(t, p);
}

std::unique_ptr<Work> GroupCommunicator::all_reduce_async(Tensor t, ReduceOp op) {
  check_memory(t, "all_reduce_async");
  check_reducible(t, "all_reduce_async");
  const Call c = next_call(call_text(std::string("all_reduce_async(") + reduce_op_name(op) + ")", t));
  if (on_device(t)) {
    if (t.bytes() == 0) return std::make_unique<FinishedWork>();
    return device_->all_reduce(t, op, c);
  }
  if (size() == 1 || t.bytes() == 0) return queue_.submit(c.what, [] {});
  // Each call stages into its own buffer: several may be queued at once (gradient buckets).
  std::shared_ptr<StagingBuffer> stage = idle_stage();
  char* p = host_bytes(t, *stage, /*load=*/true);
  const size_t n = static_cast<size_t>(t.numel());
  auto work = queue_.submit(c.what, [this, stage, p, n, dtype = t.dtype, op, c] {
    transport_->all_reduce(p, n, dtype, op, c);
  });
  if (host_addressable(t)) return work;
  return std::make_unique<StagedWork>(std::move(stage), std::move(work), t, p);
}

namespace {

void check_gather(const Tensor& out, const Tensor& in, int size, const char* op) {
  check_memory(out, op);
  check_memory(in, op);
  check_same_dtype(out, in, op);
  TESSERA_CHECK(out.numel() == in.numel() * size, std::string(op) + ": out has " + std::to_string(out.numel()) +
                                                      " elements, expected size x in = " +
                                                      std::to_string(in.numel() * size));
}

void check_scatter(const Tensor& out, const Tensor& in, int size, const char* op) {
  check_memory(out, op);
  check_memory(in, op);
  check_same_dtype(out, in, op);
  check_reducible(in, op);
  TESSERA_CHECK(in.numel() == out.numel() * size, std::string(op) + ": in has " + std::to_string(in.numel()) +
                                                      " elements, expected size x out = " +
                                                      std::to_string(out.numel() * size));
}

}  // namespace

void GroupCommunicator::all_gather(Tensor out, Tensor in) {
  if (!on_device(in)) queue_.drain();
  check_gather(out, in, size(), "all_gather");
  const Call c = next_call(call_text("all_gather", in));
  if (on_device(in)) return device_call(c, out, in, [&] { return device_->all_gather(out, in, c); })->wait();
  if (in.bytes() == 0) return;
  const char* src = host_bytes(in, stage_in_, /*load=*/true);
  char* dst = host_bytes(out, stage_out_, /*load=*/false);
  if (size() == 1) std::memmove(dst, src, in.bytes());
  else transport_->all_gather(dst, src, in.bytes(), c);
  unstage(out, dst);
}

void GroupCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp op) {
  if (!on_device(in)) queue_.drain();
  check_scatter(out, in, size(), "reduce_scatter");
  const Call c = next_call(call_text(std::string("reduce_scatter(") + reduce_op_name(op) + ")", in));
  if (on_device(in)) {
    return device_call(c, out, in, [&] { return device_->reduce_scatter(out, in, op, c); })->wait();
  }
  if (out.bytes() == 0) return;
  const char* src = host_bytes(in, stage_in_, /*load=*/true);
  char* dst = host_bytes(out, stage_out_, /*load=*/false);
  if (size() == 1) std::memmove(dst, src, out.bytes());
  else transport_->reduce_scatter(dst, src, static_cast<size_t>(out.numel()), in.dtype, op, c);
  unstage(out, dst);
}

std::unique_ptr<Work> GroupCommunicator::post_pair(const Call& c, const Tensor& out, const Tensor& in,
                                                   std::function<void(char* dst, const char* src)> run) {
  if (out.bytes() == 0) return queue_.submit(c.what, [] {});
  const bool staged = !host_addressable(in) || !host_addressable(out);
  TESSERA_CHECK(!staged || (in.device == out.device && in.device), c.what + ": out and in are on different devices");
  std::shared_ptr<StagingBuffer> stage = idle_stage();
  char* src = host_addressable(in) ? in.host<char>() : nullptr;
  char* dst = host_addressable(out) ? out.host<char>() : nullptr;
  if (staged) {
    src = static_cast<char*>(stage->reserve(*in.device, in.bytes() + out.bytes()));
    dst = src + in.bytes();
    if (in.bytes()) copy_to_host(src, in.bytes(), in);
  }
  auto work = queue_.submit(c.what, [stage, src, dst, run = std::move(run)] { run(dst, src); });
  if (!staged) return work;
  return std::make_unique<StagedWork>(std::move(stage), std::move(work), out, dst);
}

std::unique_ptr<Work> GroupCommunicator::all_gather_async(Tensor out, Tensor in) {
  check_gather(out, in, size(), "all_gather_async");
  const Call c = next_call(call_text("all_gather_async", in));
  if (on_device(in)) return device_call(c, out, in, [&] { return device_->all_gather(out, in, c); });
  const size_t bytes = in.bytes();
  return post_pair(c, out, in, [this, bytes, c](char* dst, const char* src) {
    if (size() == 1) std::memmove(dst, src, bytes);
    else transport_->all_gather(dst, src, bytes, c);
  });
}

std::unique_ptr<Work> GroupCommunicator::reduce_scatter_async(Tensor out, Tensor in, ReduceOp op) {
  check_scatter(out, in, size(), "reduce_scatter_async");
  const Call c = next_call(call_text(std::string("reduce_scatter_async(") + reduce_op_name(op) + ")", in));
  if (on_device(in)) return device_call(c, out, in, [&] { return device_->reduce_scatter(out, in, op, c); });
  const size_t n = static_cast<size_t>(out.numel()), bytes = out.bytes();
  return post_pair(c, out, in, [this, n, bytes, dtype = in.dtype, op, c](char* dst, const char* src) {
    if (size() == 1) std::memmove(dst, src, bytes);
    else transport_->reduce_scatter(dst, src, n, dtype, op, c);
  });
}

void GroupCommunicator::broadcast(Tensor t, int root) {
  if (!on_device(t)) queue_.drain();
  check_memory(t, "broadcast");
  TESSERA_CHECK(root >= 0 && root < size(),
                "broadcast: root " + std::to_string(root) + " is not a rank of " + group().text());
  const Call c = next_call(call_text("broadcast(root " + std::to_string(root) + ")", t));
  if (on_device(t)) {
    if (t.bytes()) device_->broadcast(t, root, c)->wait();
    return;
  }
  if (size() == 1 || t.bytes() == 0) return;
  // Only the root's bytes matter: the others need not copy theirs off the device.
  char* p = host_bytes(t, stage_in_, /*load=*/rank() == root);
  transport_->broadcast(p, t.bytes(), root, c);
  if (rank() != root) unstage(t, p);
}

void GroupCommunicator::send(Tensor t, int dst) {
  if (!on_device(t)) queue_.drain();
  post_p2p(t, dst, /*is_send=*/true, "send")->wait();
}

void GroupCommunicator::recv(Tensor t, int src) {
  if (!on_device(t)) queue_.drain();
  post_p2p(t, src, /*is_send=*/false, "recv")->wait();
}

std::unique_ptr<Work> GroupCommunicator::send_async(Tensor t, int dst) { return post_p2p(t, dst, true, "send_async"); }
std::unique_ptr<Work> GroupCommunicator::recv_async(Tensor t, int src) { return post_p2p(t, src, false, "recv_async"); }

void GroupCommunicator::barrier() {
  queue_.drain();
  if (device_) device_->flush();
  const Call c = next_call("barrier");
  if (size() > 1) transport_->barrier(c);
}

std::unique_ptr<Communicator> GroupCommunicator::split(const std::vector<std::vector<int>>& groups,
                                                       const std::string& name) {
  queue_.drain();
  SplitPlan plan;
  plan.groups = groups;
  plan.mine = find_split_group(groups, size(), rank());
  plan.seq = splits_++;
  plan.name = name.empty() ? group().name + "/split" + std::to_string(plan.seq) : name;
  if (device_) device_->flush();
  std::unique_ptr<Transport> host = transport_->split(plan);
  // Every rank of the parent splits the device library's communicator, those in no list too.
  std::unique_ptr<DeviceTransport> device = device_ ? device_->split(plan, host ? &host->group() : nullptr) : nullptr;
  if (!host) return nullptr;
  return std::make_unique<GroupCommunicator>(std::move(host), std::move(device));
}

// An asynchronous all_gather / reduce_scatter on the device transport: nothing to move for
// zero bytes, and out and in on its one device.
std::unique_ptr<Work> GroupCommunicator::device_call(const Call& c, const Tensor& out, const Tensor& in,
                                                     const std::function<std::unique_ptr<Work>()>& run) {
  TESSERA_CHECK(on_device(out), c.what + ": out and in are on different devices");
  if (in.bytes() == 0 || out.bytes() == 0) return std::make_unique<FinishedWork>();
  return run();
}

// p2p calls take no collective number: only two ranks make them, and the collective
// numbers must stay equal on every rank. Messages are numbered per pair and direction.
std::unique_ptr<Work> GroupCommunicator::post_p2p(const Tensor& t, int peer, bool is_send, const char* op) {
  check_memory(t, op);
  TESSERA_CHECK(peer >= 0 && peer < size() && peer != rank(),
                std::string(op) + ": bad " + (is_send ? "destination" : "source") + " rank " +
                    std::to_string(peer) + " in " + group().text());
  if (sent_to_.empty()) sent_to_.assign(size(), 0), received_from_.assign(size(), 0);
  const uint64_t k = is_send ? sent_to_[peer]++ : received_from_[peer]++;
  const P2PText text = p2p_text(op, t, is_send, k, group().name, group().world_ranks, rank(), peer);
  if (on_device(t)) return device_->post(t, peer, is_send, text);
  if (host_addressable(t)) return transport_->post(t.host<char>(), t.bytes(), peer, is_send, k, text);
  // A staged message has its own buffer: any number may be outstanding.
  std::shared_ptr<StagingBuffer> stage = idle_stage();
  char* p = host_bytes(t, *stage, /*load=*/is_send);
  auto work = transport_->post(p, t.bytes(), peer, is_send, k, text);
  return std::make_unique<StagedWork>(std::move(stage), std::move(work), is_send ? Tensor() : t, p);
}

// A staging buffer no outstanding call holds. Pinned allocations are slow (an OpenCL mapped
// buffer, cudaMallocHost), so each step's buckets and messages reuse the previous step's.
// Only this thread hands out references; other threads only drop theirs, so a count of one
// stays one.
std::shared_ptr<StagingBuffer> GroupCommunicator::idle_stage() {
  for (const auto& s : async_stages_)
    if (s.use_count() == 1) return s;
  return async_stages_.emplace_back(std::make_shared<StagingBuffer>());
}

}  // namespace tessera::comm_detail
