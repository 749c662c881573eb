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

#include "tessera/comm/group_communicator.h"
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

void set_all_reduce_data(gloo::AllreduceOptions& opts, void* data, size_t count, DType dtype, ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  const bool sum = op == ReduceOp::Sum;
  switch (dtype) {
    case DType::F32:
      opts.setOutput(static_cast<float*>(data), count);
      opts.setReduceFunction(sum ? static_cast<Fn>(&gloo::sum<float>) : static_cast<Fn>(&gloo::max<float>));
      break;
    case DType::I32:
      opts.setOutput(static_cast<int32_t*>(data), count);
      opts.setReduceFunction(sum ? static_cast<Fn>(&gloo::sum<int32_t>) : static_cast<Fn>(&gloo::max<int32_t>));
      break;
    case DType::I64:
      opts.setOutput(static_cast<int64_t*>(data), count);
      opts.setReduceFunction(sum ? static_cast<Fn>(&gloo::sum<int64_t>) : static_cast<Fn>(&gloo::max<int64_t>));
      break;
    default: TESSERA_CHECK(false, "gloo: no reduction for dtype " + std::string(dtype_name(dtype)));
  }
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

// Slots of the operations we build on unbound buffers, away from Gloo's prefixes (0x01-0x08).
constexpr uint64_t kReduceScatterSlot = 0x40ull << 56;
constexpr uint64_t kP2PSlot = 0x41ull << 56;
constexpr uint64_t kP2PSequenceMask = (1ull << 56) - 1;
constexpr auto kLateReportWindow = std::chrono::seconds(5);
constexpr size_t kSegmentBytes = 1 << 20;  // as Gloo's all-reduce

bool is_timeout(const std::string& gloo_message) {
  return gloo_message.find("Timed out") != std::string::npos || gloo_message.find("timed out") != std::string::npos;
}

const char* const kPeerFailedHint =
    "a peer closed its connection (it timed out, crashed or was killed) or the network failed: the first error is "
    "usually in another rank's output";

Error translate_p2p(const P2PText& text, milliseconds timeout, const std::string& gloo_message) {
  if (is_timeout(gloo_message)) return p2p_timeout(text, timeout, " [gloo: " + gloo_message + "]");
  const std::string head = text.what + " " + text.where;
  if (gloo_message.find("Application timeout") != std::string::npos)
    return runtime_error(head + " was cancelled: another operation of this rank on the group timed out [gloo: " +
                         gloo_message + "]");
  return runtime_error(head + " failed [gloo: " + gloo_message + "]", kPeerFailedHint);
}

// One posted send or recv. Each has its own unbound buffer, as Gloo allows one pending
// operation per buffer and counts completions per buffer.
class GlooP2PWork final : public Work {
 public:
  GlooP2PWork(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send, P2PText text, milliseconds timeout)
      : buf_(std::move(buf)), is_send_(is_send), text_(std::move(text)), timeout_(timeout) {}

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
      if (is_send_) buf_->waitSend(timeout_);
      else buf_->waitRecv(timeout_);
    } catch (const gloo::Exception& e) {
      throw translate_p2p(text_, timeout_, e.what());
    }
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  P2PText text_;
  milliseconds timeout_;
  bool waited_ = false;
};

class GlooTransport final : public Transport {
 public:
  GlooTransport(Group group, std::shared_ptr<GlooShared> shared, std::shared_ptr<gloo::Context> ctx,
                std::string prefix)
      : Transport(std::move(group)), shared_(std::move(shared)), ctx_(std::move(ctx)), prefix_(std::move(prefix)) {}

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, const Call& c) override {
    guarded(c, [&] {
      gloo::AllreduceOptions opts(ctx_);
      gloo_backend::set_all_reduce_data(opts, data, count, dtype, op);
      opts.setTag(tag(c));
      opts.setTimeout(timeout());
      gloo::allreduce(opts);
    });
  }

  void all_gather(void* out, const void* in, size_t bytes, const Call& c) override {
    guarded(c, [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
      opts.setOutput(static_cast<uint8_t*>(out), bytes * group().size());
      opts.setTag(tag(c));
      opts.setTimeout(timeout());
      gloo::allgather(opts);
    });
  }

  void reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, const Call& c) override {
    guarded(c, [&] { ring_reduce_scatter(out, in, count, dtype, op, tag(c)); });
  }

  void broadcast(void* data, size_t bytes, int root, const Call& c) override {
    guarded(c, [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(tag(c));
      opts.setTimeout(timeout());
      gloo::broadcast(opts);
    });
  }

  void barrier(const Call& c) override {
    guarded(c, [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(tag(c));
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    });
  }

  // Message k (per pair and direction, counted by both ends) travels on slot kP2PSlot + k,
  // so the k-th send meets the k-th recv by slot, not by the order of Gloo's per-slot queues.
  std::unique_ptr<Work> post(void* data, size_t bytes, int peer, bool is_send, uint64_t message,
                             const P2PText& text) override {
    const uint64_t slot = kP2PSlot | (message & kP2PSequenceMask);
    try {
      auto buf = ctx_->createUnboundBuffer(data, bytes);
      if (is_send) buf->send(peer, slot);
      else buf->recv(peer, slot);
      return std::make_unique<GlooP2PWork>(std::move(buf), is_send, text, timeout());
    } catch (const gloo::Exception& e) {
      throw translate_p2p(text, timeout(), e.what());
    }
  }

  // Each subgroup is its own Gloo context on the same transport device, its keys under
  // "<prefix>/split<seq>/g<index>".
  std::unique_ptr<Transport> split(const SplitPlan& plan) override {
    if (plan.mine < 0) return nullptr;
    Group sub = plan.subgroup(group(), plan.mine, group().rank);
    const std::string sub_prefix = prefix_ + "/split" + std::to_string(plan.seq) + "/g" + std::to_string(plan.mine);
    std::shared_ptr<gloo::Context> ctx;
    if (sub.size() > 1) {
      shared_->ensure_device();
      ctx = gloo_backend::connect_context(*shared_->store, sub_prefix, "group '" + sub.name + "'", sub.rank,
                                          sub.size(), shared_->device, shared_->iface, timeout());
    }
    return std::make_unique<GlooTransport>(std::move(sub), shared_, std::move(ctx), sub_prefix);
  }

 private:
  milliseconds timeout() const { return group().timeout; }
  static uint32_t tag(const Call& c) { return static_cast<uint32_t>(c.seq); }

  // Ring reduce-scatter: in step s (0..n-2) rank r sends its partial reduction of chunk
  // (r - s - 1) mod n to rank r + 1 and receives chunk (r - s - 2) mod n from rank r - 1,
  // combining it with its own input; after n - 1 steps it holds the full reduction of chunk r.
  // Each step moves its chunk in segments of at most kSegmentBytes, all posted at once, and
  // reduces segment k while later segments are still arriving (as Gloo's ring all-reduce
  // does). Scratch (two partial chunks and a receive chunk) is kept between calls.
  void ring_reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, uint32_t tag) {
    const int n = group().size();
    const int rank = group().rank;
    const size_t esize = dtype_size(dtype);
    const size_t bytes = count * esize;
    const size_t segment = std::max(esize, kSegmentBytes / esize * esize);
    const size_t segments = (bytes + segment - 1) / segment;
    if (scratch_size_ < 3 * bytes) {
      scratch_.reset(new uint8_t[3 * bytes]);  // no zero-fill: every byte read is written first
      scratch_size_ = 3 * bytes;
      scratch_buf_ = ctx_->createUnboundBuffer(scratch_.get(), scratch_size_);
    }
    uint8_t* scratch = scratch_.get();
    const auto* in_bytes = static_cast<const uint8_t*>(in);
    auto in_buf = ctx_->createUnboundBuffer(const_cast<void*>(in), bytes * n);
    const int left = (rank - 1 + n) % n;
    const int right = (rank + 1) % n;
    const auto deadline = Clock::now() + timeout();
    auto left_ms = [&] {
      return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    };
    for (int s = 0; s + 1 < n; ++s) {
      const size_t send_chunk = static_cast<size_t>(((rank - s - 1) % n + n) % n);
      const size_t recv_chunk = static_cast<size_t>(((rank - s - 2) % n + n) % n);
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
      uint8_t* dst = (s + 2 == n) ? static_cast<uint8_t*>(out) : scratch + (s % 2) * bytes;
      for (size_t k = 0; k < segments; ++k) {
        const size_t off = k * segment, len = std::min(segment, bytes - off);
        scratch_buf_->waitRecv(left_ms());
        reduce_to(dtype, op, dst + off, in_bytes + recv_chunk * bytes + off, scratch + 2 * bytes + off, len / esize);
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
    const std::string where = c.where(group());
    const std::string late = late_ranks(c.seq);
    if (is_timeout(gloo_message)) return collective_timeout(where, timeout(), late + " [gloo: " + gloo_message + "]");
    return runtime_error(where + " failed" + late + " [gloo: " + gloo_message + "]", kPeerFailedHint);
  }

  // Records in the store that this rank reached call `seq`, waits a little for the others'
  // records, and names the ranks without one.
  std::string late_ranks(uint64_t seq) {
    const int size = group().size();
    try {
      const std::string base = prefix_ + "/reached/" + std::to_string(seq) + "/";
      Store& store = *shared_->store;
      store.set(base + std::to_string(group().rank), {1});
      std::vector<bool> seen(size, false);
      seen[group().rank] = true;
      const auto deadline = Clock::now() + std::min<milliseconds>(timeout(), kLateReportWindow);
      while (true) {
        bool all = true;
        for (int r = 0; r < size; ++r) {
          if (!seen[r]) seen[r] = store.check({base + std::to_string(r)});
          all = all && seen[r];
        }
        if (all) return " (every rank had reached it)";
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(milliseconds(100));
      }
      std::vector<int> missing;
      for (int r = 0; r < size; ++r)
        if (!seen[r]) missing.push_back(group().world_ranks[r]);
      return ": world rank(s) " + ranks_text(missing) + " had not reached it";
    } catch (const std::exception&) {
      return " (the store could not be asked which ranks had reached it)";
    }
  }

  std::shared_ptr<GlooShared> shared_;
  std::shared_ptr<gloo::Context> ctx_;  // null for a group of one
  std::string prefix_;
  std::unique_ptr<uint8_t[]> scratch_;  // reduce_scatter's; its unbound buffer below
  size_t scratch_size_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> scratch_buf_;
};

}  // namespace

std::unique_ptr<comm_detail::Transport> create_gloo_transport(std::shared_ptr<Store> store, int rank,
                                                              int world_size, const GlooOptions& options) {
  TESSERA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
                "create_gloo_transport: rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  TESSERA_CHECK(store != nullptr, "create_gloo_transport: no store");
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
  Group world{"gloo", "world", std::vector<int>(world_size), rank, options.timeout};
  for (int r = 0; r < world_size; ++r) world.world_ranks[r] = r;
  return std::make_unique<GlooTransport>(std::move(world), std::move(shared), std::move(ctx), prefix);
}

std::unique_ptr<Communicator> create_gloo_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                       const GlooOptions& options) {
  return std::make_unique<GroupCommunicator>(create_gloo_transport(std::move(store), rank, world_size, options));
}

}  // namespace tessera
