#include "tessera/comm/gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "tessera/comm/async_queue.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/comm/collective_util.h"
#include "tessera/comm/gloo/gloo_context.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"

namespace tessera {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using namespace comm_detail;

// ---- plumbing -------------------------------------------------------------------------------------

namespace gloo_backend {

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  store_.wait({prefix_ + key}, timeout_);
  auto v = store_.get(prefix_ + key);
  return std::vector<char>(v.begin(), v.end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  store_.wait(full, timeout.count() > 0 ? timeout : timeout_);
}

std::shared_ptr<gloo::transport::Device> create_device(const InterfaceChoice& iface) {
  gloo::transport::tcp::attr attr;
  attr.hostname = iface.ipv4;  // a numeric address: no name resolution happens
  attr.ai_family = AF_INET;
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw runtime_error("cannot open a Gloo device on interface " + iface.name + " (" + iface.ipv4 + "): " + e.what(),
                        "this machine's interfaces and addresses: " + describe_net_interfaces(list_net_interfaces()));
  }
}

std::shared_ptr<gloo::Context> connect_context(tessera::Store& store, const std::string& prefix,
                                               const std::string& group, int rank, int size,
                                               std::shared_ptr<gloo::transport::Device> device,
                                               const InterfaceChoice& iface, milliseconds timeout) {
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  StoreAdapter adapter(store, prefix + "/", timeout);
  const std::string who = "rank " + std::to_string(rank) + " of " + group + ", listening on " + iface.name + " (" +
                          iface.ipv4 + ")";
  try {
    ctx->connectFullMesh(adapter, device);
  } catch (const Error& e) {
    throw runtime_error("Gloo could not connect " + who + ": " + e.what(), e.hint());
  } catch (const std::exception& e) {
    throw runtime_error(
        "Gloo could not connect " + who + ": " + e.what(),
        "every rank connects directly to every other rank of its group: check that the nodes reach each other "
        "on this interface (ping both ways, no firewall on TCP ports), and set GLOO_SOCKET_IFNAME on every "
        "node to the interface of the network between the nodes. This machine's interfaces: " +
            describe_net_interfaces(list_net_interfaces()));
  }
  return ctx;
}

}  // namespace gloo_backend

InterfaceChoice gloo_interface(const GlooOptions& options) {
  std::string ifname;
  if (options.socket_ifname) {
    ifname = *options.socket_ifname;
  } else if (const char* env = std::getenv("GLOO_SOCKET_IFNAME")) {
    ifname = env;
  }
  return choose_interface(ifname, options.master_addr, options.master_port);
}

namespace {

// What every communicator of one process's job shares: the store, the options and the
// transport device (created on first use: a single process never touches the network).
struct GlooShared {
  std::shared_ptr<Store> store;
  GlooOptions options;
  int world_rank = 0;
  std::once_flag device_once;
  InterfaceChoice iface;
  std::shared_ptr<gloo::transport::Device> device;

  void ensure_device() {
    std::call_once(device_once, [this] {
      iface = gloo_interface(options);
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true))
        log_info("gloo: rank %d uses interface %s (%s), chosen by %s", world_rank, iface.name.c_str(),
                 iface.ipv4.c_str(), iface.reason.c_str());
      device = gloo_backend::create_device(iface);
    });
  }
};

// Gloo's reduction functions for our dtypes.
gloo::AllreduceOptions::Func gloo_reduce_fn(DType t, ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  const bool sum = op == ReduceOp::Sum;
  switch (t) {
    case DType::F32: return sum ? static_cast<Fn>(&gloo::sum<float>) : static_cast<Fn>(&gloo::max<float>);
    case DType::I32: return sum ? static_cast<Fn>(&gloo::sum<int32_t>) : static_cast<Fn>(&gloo::max<int32_t>);
    case DType::I64: return sum ? static_cast<Fn>(&gloo::sum<int64_t>) : static_cast<Fn>(&gloo::max<int64_t>);
    default: TESSERA_CHECK(false, "gloo: no reduction for dtype " + std::string(dtype_name(t)));
  }
  return nullptr;
}

// Slots of the operations we build on unbound buffers, away from Gloo's prefixes (0x01-0x08).
constexpr uint64_t kReduceScatterSlot = 0x40ull << 56;
constexpr uint64_t kP2PSlot = 0x41ull << 56;
constexpr uint64_t kP2PSequenceMask = (1ull << 56) - 1;
constexpr auto kLateReportWindow = std::chrono::seconds(5);
constexpr size_t kSegmentBytes = 1 << 20;  // as Gloo's all-reduce

// A p2p message's texts and timeout, for its errors.
struct P2PCall {
  P2PText text;
  milliseconds timeout;

  Error translate(const std::string& gloo_message) const {
    const std::string head = text.what + " " + text.where;
    if (gloo_message.find("Timed out") != std::string::npos || gloo_message.find("timed out") != std::string::npos) {
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g s", static_cast<double>(timeout.count()) / 1000.0);
      return runtime_error(head + " timed out after " + secs + ": " + text.absent + " [gloo: " + gloo_message + "]",
                           kP2PTimeoutHint);
    }
    if (gloo_message.find("Application timeout") != std::string::npos)
      return runtime_error(head + " was cancelled: another operation of this rank on the group timed out [gloo: " +
                           gloo_message + "]");
    return runtime_error(head + " failed [gloo: " + gloo_message + "]",
                         "a peer closed its connection (it timed out, crashed or was killed) or the network "
                         "failed: the first error is usually in another rank's output");
  }
};

// One posted send or recv. Each has its own unbound buffer, as Gloo allows one pending
// operation per buffer and counts completions per buffer.
class GlooP2PWork final : public Work {
 public:
  GlooP2PWork(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send, P2PCall call)
      : buf_(std::move(buf)), is_send_(is_send), call_(std::move(call)) {}

  // Gloo's pair keeps only a weak pointer to the buffer: a send dropped after the peer's
  // recv-ready notice would stall the pair, so an unwaited Work waits here.
  ~GlooP2PWork() override {
    try {
      wait();
    } catch (...) {
    }
  }

  void wait() override {
    if (waited_) return;
    waited_ = true;
    try {
      if (is_send_) buf_->waitSend(call_.timeout);
      else buf_->waitRecv(call_.timeout);
    } catch (const gloo::Exception& e) {
      throw call_.translate(e.what());
    }
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  P2PCall call_;
  bool waited_ = false;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<GlooShared> shared, std::shared_ptr<gloo::Context> ctx, std::string prefix,
                   std::string name, std::vector<int> world_ranks, int rank)
      : shared_(std::move(shared)),
        ctx_(std::move(ctx)),
        prefix_(std::move(prefix)),
        name_(std::move(name)),
        world_ranks_(std::move(world_ranks)),
        rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string backend_name() const override { return "gloo"; }
  std::string group_name() const override { return name_; }
  std::vector<int> world_ranks() const override { return world_ranks_; }

  void all_reduce(Tensor t, ReduceOp op) override {
    queue_.drain();
    check_host(t, "all_reduce");
    check_reducible(t, "all_reduce");
    Call c = next_call(call_text(std::string("all_reduce(") + reduce_op_name(op) + ")", t));
    guarded(c, [&] { all_reduce_now(t, op, c.tag); });
  }

  std::unique_ptr<Work> all_reduce_async(Tensor t, ReduceOp op) override {
    check_host(t, "all_reduce_async");
    check_reducible(t, "all_reduce_async");
    Call c = next_call(call_text(std::string("all_reduce_async(") + reduce_op_name(op) + ")", t));
    return queue_.submit(c.what, [this, t, op, c] { guarded(c, [&] { all_reduce_now(t, op, c.tag); }); });
  }

  void all_gather(Tensor out, Tensor in) override {
    queue_.drain();
    check_host(out, "all_gather");
    check_host(in, "all_gather");
    check_same_dtype(out, in, "all_gather");
    TESSERA_CHECK(out.numel() == in.numel() * size(), "all_gather: out has " + std::to_string(out.numel()) +
                                                          " elements, expected size x in = " +
                                                          std::to_string(in.numel() * size()));
    Call c = next_call(call_text("all_gather", in));
    if (in.bytes() == 0) return;
    if (size() == 1) {
      std::memmove(cpu_memory(out), cpu_memory(in), in.bytes());
      return;
    }
    guarded(c, [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(reinterpret_cast<uint8_t*>(cpu_memory(in)), in.bytes());
      opts.setOutput(reinterpret_cast<uint8_t*>(cpu_memory(out)), out.bytes());
      opts.setTag(c.tag);
      opts.setTimeout(timeout());
      gloo::allgather(opts);
    });
  }

  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    queue_.drain();
    check_host(out, "reduce_scatter");
    check_host(in, "reduce_scatter");
    check_same_dtype(out, in, "reduce_scatter");
    check_reducible(in, "reduce_scatter");
    TESSERA_CHECK(in.numel() == out.numel() * size(), "reduce_scatter: in has " + std::to_string(in.numel()) +
                                                          " elements, expected size x out = " +
                                                          std::to_string(out.numel() * size()));
    Call c = next_call(call_text(std::string("reduce_scatter(") + reduce_op_name(op) + ")", in));
    if (out.bytes() == 0) return;
    if (size() == 1) {
      std::memmove(cpu_memory(out), cpu_memory(in), out.bytes());
      return;
    }
    guarded(c, [&] { ring_reduce_scatter(out, in, op, c.tag); });
  }

  void broadcast(Tensor t, int root) override {
    queue_.drain();
    check_host(t, "broadcast");
    TESSERA_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) + " is not a rank of " +
                                                  group_text(name_, world_ranks_));
    Call c = next_call(call_text("broadcast(root " + std::to_string(root) + ")", t));
    if (size() == 1 || t.bytes() == 0) return;
    guarded(c, [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(reinterpret_cast<uint8_t*>(cpu_memory(t)), t.bytes());
      opts.setRoot(root);
      opts.setTag(c.tag);
      opts.setTimeout(timeout());
      gloo::broadcast(opts);
    });
  }

  void send(Tensor t, int dst) override {
    queue_.drain();
    post_p2p(t, dst, /*is_send=*/true, "send")->wait();
  }

  void recv(Tensor t, int src) override {
    queue_.drain();
    post_p2p(t, src, /*is_send=*/false, "recv")->wait();
  }

  std::unique_ptr<Work> send_async(Tensor t, int dst) override { return post_p2p(t, dst, true, "send_async"); }
  std::unique_ptr<Work> recv_async(Tensor t, int src) override { return post_p2p(t, src, false, "recv_async"); }

  void barrier() override {
    queue_.drain();
    Call c = next_call("barrier");
    if (size() == 1) return;
    guarded(c, [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(c.tag);
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    });
  }

  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups, const std::string& name) override {
    queue_.drain();
    const int mine = find_split_group(groups, size(), rank_);
    const int seq = splits_++;
    if (mine < 0) return nullptr;
    const auto& members = groups[mine];
    std::vector<int> world;
    int sub_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      world.push_back(world_ranks_[members[i]]);
      if (members[i] == rank_) sub_rank = static_cast<int>(i);
    }
    const std::string sub_name = name.empty() ? name_ + "/split" + std::to_string(seq) : name;
    const std::string sub_prefix = prefix_ + "/split" + std::to_string(seq) + "/g" + std::to_string(mine);
    std::shared_ptr<gloo::Context> ctx;
    if (members.size() > 1) {
      shared_->ensure_device();
      ctx = gloo_backend::connect_context(*shared_->store, sub_prefix, "group '" + sub_name + "'", sub_rank,
                                          static_cast<int>(members.size()), shared_->device, shared_->iface,
                                          timeout());
    }
    return std::make_unique<GlooCommunicator>(shared_, std::move(ctx), sub_prefix, sub_name, std::move(world),
                                              sub_rank);
  }

 private:
  struct Call {
    std::string what;
    uint64_t seq;
    uint32_t tag;
  };

  milliseconds timeout() const { return shared_->options.timeout; }

  // Posts a send to / recv from `peer`. Message k (per pair and direction, counted by both
  // ends) travels on slot kP2PSlot + k, so the k-th send meets the k-th recv by slot, not by
  // the order of Gloo's per-slot queues. p2p calls take no collective sequence number: only
  // two ranks make them, and the collective tags must stay equal on every rank.
  std::unique_ptr<Work> post_p2p(const Tensor& t, int peer, bool is_send, const char* op) {
    check_host(t, op);
    TESSERA_CHECK(peer >= 0 && peer < size() && peer != rank_,
                  std::string(op) + ": bad " + (is_send ? "destination" : "source") + " rank " +
                      std::to_string(peer) + " in " + group_text(name_, world_ranks_));
    if (sent_to_.empty()) sent_to_.assign(size(), 0), received_from_.assign(size(), 0);
    const uint64_t k = is_send ? sent_to_[peer]++ : received_from_[peer]++;
    P2PCall call{p2p_text(op, t, is_send, k, name_, world_ranks_, rank_, peer), timeout()};
    const uint64_t slot = kP2PSlot | (k & kP2PSequenceMask);
    try {
      auto buf = ctx_->createUnboundBuffer(cpu_memory(t), t.bytes());
      if (is_send) buf->send(peer, slot);
      else buf->recv(peer, slot);
      return std::make_unique<GlooP2PWork>(std::move(buf), is_send, std::move(call));
    } catch (const gloo::Exception& e) {
      throw call.translate(e.what());
    }
  }

  Call next_call(std::string what) {
    ++seq_;
    return Call{std::move(what), seq_, static_cast<uint32_t>(seq_)};
  }

  void all_reduce_now(const Tensor& t, ReduceOp op, uint32_t tag) {
    if (size() == 1 || t.numel() == 0) return;
    gloo::AllreduceOptions opts(ctx_);
    set_typed_output(opts, t);  // in place: the output is also the input
    opts.setReduceFunction(gloo_reduce_fn(t.dtype, op));
    opts.setTag(tag);
    opts.setTimeout(timeout());
    gloo::allreduce(opts);
  }

  static void set_typed_output(gloo::AllreduceOptions& opts, const Tensor& t) {
    const size_t n = static_cast<size_t>(t.numel());
    switch (t.dtype) {
      case DType::F32: opts.setOutput(reinterpret_cast<float*>(cpu_memory(t)), n); break;
      case DType::I32: opts.setOutput(reinterpret_cast<int32_t*>(cpu_memory(t)), n); break;
      case DType::I64: opts.setOutput(reinterpret_cast<int64_t*>(cpu_memory(t)), n); break;
      default: TESSERA_CHECK(false, "all_reduce: unsupported dtype");
    }
  }

  // Ring reduce-scatter: in step s (0..n-2) rank r sends its partial reduction of chunk
  // (r - s - 1) mod n to rank r + 1 and receives chunk (r - s - 2) mod n from rank r - 1,
  // combining it with its own input; after n - 1 steps it holds the full reduction of chunk r.
  // Each step moves its chunk in segments of at most kSegmentBytes, all posted at once, and
  // reduces segment k while later segments are still arriving (as Gloo's ring all-reduce
  // does). Scratch (two partial chunks and a receive chunk) is kept between calls.
  void ring_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, uint32_t tag) {
    const int n = size();
    const size_t bytes = out.bytes();
    const size_t esize = dtype_size(in.dtype);
    const size_t segment = std::max(esize, kSegmentBytes / esize * esize);
    const size_t segments = (bytes + segment - 1) / segment;
    if (scratch_size_ < 3 * bytes) {
      scratch_.reset(new uint8_t[3 * bytes]);  // no zero-fill: every byte read is written first
      scratch_size_ = 3 * bytes;
      scratch_buf_ = ctx_->createUnboundBuffer(scratch_.get(), scratch_size_);
    }
    uint8_t* scratch = scratch_.get();
    const auto* in_bytes = reinterpret_cast<const uint8_t*>(cpu_memory(in));
    auto in_buf = ctx_->createUnboundBuffer(cpu_memory(in), in.bytes());
    const int left = (rank_ - 1 + n) % n;
    const int right = (rank_ + 1) % n;
    const auto deadline = Clock::now() + timeout();
    auto left_ms = [&] {
      return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    };
    for (int s = 0; s + 1 < n; ++s) {
      const size_t send_chunk = static_cast<size_t>(((rank_ - s - 1) % n + n) % n);
      const size_t recv_chunk = static_cast<size_t>(((rank_ - s - 2) % n + n) % n);
      // One slot per step: a pair delivers the messages of one slot in the order they were
      // posted, so the k-th receive completion is segment k (Gloo's ring relies on the same).
      const uint64_t slot =
          kReduceScatterSlot | (static_cast<uint64_t>(tag & 0xffffff) << 32) | static_cast<uint64_t>(s);
      auto* send_buf = s == 0 ? in_buf.get() : scratch_buf_.get();
      const size_t send_base = s == 0 ? send_chunk * bytes : ((s - 1) % 2) * bytes;
      for (size_t k = 0; k < segments; ++k) {
        const size_t off = k * segment, len = std::min(segment, bytes - off);
        scratch_buf_->recv(left, slot, 2 * bytes + off, len);
        send_buf->send(right, slot, send_base + off, len);
      }
      uint8_t* dst = (s + 2 == n) ? reinterpret_cast<uint8_t*>(cpu_memory(out)) : scratch + (s % 2) * bytes;
      for (size_t k = 0; k < segments; ++k) {
        const size_t off = k * segment, len = std::min(segment, bytes - off);
        scratch_buf_->waitRecv(left_ms());
        reduce_to(in.dtype, op, dst + off, in_bytes + recv_chunk * bytes + off, scratch + 2 * bytes + off,
                  len / esize);
      }
      for (size_t k = 0; k < segments; ++k) send_buf->waitSend(left_ms());
    }
  }

  // Runs `body`, turning Gloo's exceptions into tessera::Errors that name the call and group.
  template <typename Body>
  void guarded(const Call& c, Body body) {
    try {
      body();
    } catch (const gloo::Exception& e) {
      throw translate(c, e.what());
    }
  }

  // Every failure asks the store which ranks had reached the call (a peer that timed out or
  // crashed closes its connections, so the other ranks see "connection closed" rather than a
  // timeout of their own; the absent rank is the useful fact either way).
  Error translate(const Call& c, const std::string& gloo_message) {
    const std::string where = c.what + " (call " + std::to_string(c.seq) + " on " + group_text(name_, world_ranks_) +
                              ", this is world rank " + std::to_string(world_ranks_[rank_]) + ")";
    const bool timed_out = gloo_message.find("Timed out") != std::string::npos ||
                           gloo_message.find("timed out") != std::string::npos;
    const std::string late = late_ranks(c.seq);
    if (timed_out) {
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g s", static_cast<double>(timeout().count()) / 1000.0);
      return runtime_error(where + " timed out after " + secs + late + " [gloo: " + gloo_message + "]",
                           "a rank that does not reach a collective is stuck elsewhere or has failed: look at its "
                           "output; raise --distributed-timeout-minutes only if it is merely slow");
    }
    return runtime_error(where + " failed" + late + " [gloo: " + gloo_message + "]",
                         "a peer closed its connection (it timed out, crashed or was killed) or the network "
                         "failed: the first error is usually in another rank's output");
  }

  // Records in the store that this rank reached call `seq`, waits a little for the others'
  // records, and names the ranks without one.
  std::string late_ranks(uint64_t seq) {
    try {
      const std::string base = prefix_ + "/reached/" + std::to_string(seq) + "/";
      Store& store = *shared_->store;
      store.set(base + std::to_string(rank_), {1});
      std::vector<bool> seen(size(), false);
      seen[rank_] = true;
      const auto deadline = Clock::now() + std::min<milliseconds>(timeout(), kLateReportWindow);
      while (true) {
        bool all = true;
        for (int r = 0; r < size(); ++r) {
          if (!seen[r]) seen[r] = store.check({base + std::to_string(r)});
          all = all && seen[r];
        }
        if (all) return " (every rank had reached it)";
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(milliseconds(100));
      }
      std::vector<int> missing;
      for (int r = 0; r < size(); ++r)
        if (!seen[r]) missing.push_back(world_ranks_[r]);
      return ": world rank(s) " + ranks_text(missing) + " had not reached it";
    } catch (const std::exception&) {
      return " (the store could not be asked which ranks had reached it)";
    }
  }

  std::shared_ptr<GlooShared> shared_;
  std::shared_ptr<gloo::Context> ctx_;  // null for a group of one
  std::string prefix_;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_;
  uint64_t seq_ = 0;
  int splits_ = 0;
  std::vector<uint64_t> sent_to_, received_from_;  // p2p messages posted, per peer
  std::unique_ptr<uint8_t[]> scratch_;  // reduce_scatter's; its unbound buffer below
  size_t scratch_size_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> scratch_buf_;
  AsyncQueue queue_;  // last: destroyed first, while the context is alive
};

}  // namespace

std::unique_ptr<Communicator> create_gloo_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                       const GlooOptions& options) {
  TESSERA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
                "create_gloo_communicator: rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  TESSERA_CHECK(store != nullptr, "create_gloo_communicator: no store");
  auto shared = std::make_shared<GlooShared>();
  shared->store = std::move(store);
  shared->options = options;
  shared->world_rank = rank;
  const std::string prefix = options.key_prefix + "gloo/world";
  std::shared_ptr<gloo::Context> ctx;
  if (world_size > 1) {
    shared->ensure_device();
    ctx = gloo_backend::connect_context(*shared->store, prefix, "group 'world'", rank, world_size, shared->device,
                                        shared->iface, options.timeout);
  }
  std::vector<int> ranks(world_size);
  for (int r = 0; r < world_size; ++r) ranks[r] = r;
  return std::make_unique<GlooCommunicator>(std::move(shared), std::move(ctx), prefix, "world", std::move(ranks),
                                            rank);
}

}  // namespace tessera
