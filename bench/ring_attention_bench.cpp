// Context parallelism's ring attention (model/context_parallel.h) at CP = the world size,
// measuring how much of the ring's communication the compute hides. Each configuration runs
// the ring twice with the same code: as built (each step's send/receive posted before the
// block is computed and waited after it), and serialised (the same messages posted only when
// the step waits, after its block: a communicator wrapper defers them), so
//   hidden = serialised - overlapped
// is the communication time the overlap took off the critical path. Also the time of one
// exchange of the ring's message (keys and values) and of a whole qkv row's (what the ring
// sent before it packed K and V), with no compute.
// Times: the fastest of `iterations` calls after a warm-up, ranks started together by a
// barrier, rank 0's clock. On a machine with fewer cores than ranks x threads the transfer's
// own CPU work (loopback TCP copies) competes with the compute: say how loaded it was.
// usage: tessera launch --standalone --nproc_per_node 2 bench/ring_attention_bench [B NH NG HD iterations] [S...]
//        (default 1 8 8 64 5, S 512 1024 2048 4096; GPT's layout when NG = NH)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/gloo/gloo_communicator.h"
#include "tessera/comm/store.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/launch/worker_env.h"
#include "tessera/model/context_parallel.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

// The communicator with its asynchronous point-to-point calls deferred: send_async and
// recv_async only record the call, and the first wait() on any of them posts everything
// recorded (in call order) and waits for it. The ring's code then runs with every exchange
// after the compute it would overlap.
class DeferredP2P final : public Communicator {
 public:
  explicit DeferredP2P(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string backend_name() const override { return c_.backend_name(); }
  std::string group_name() const override { return c_.group_name(); }
  std::vector<int> world_ranks() const override { return c_.world_ranks(); }
  void all_reduce(Tensor t, ReduceOp op) override { c_.all_reduce(t, op); }
  std::unique_ptr<Work> all_reduce_async(Tensor t, ReduceOp op) override { return c_.all_reduce_async(t, op); }
  void all_gather(Tensor out, Tensor in) override { c_.all_gather(out, in); }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override { c_.reduce_scatter(out, in, op); }
  void broadcast(Tensor t, int root) override { c_.broadcast(t, root); }
  void send(Tensor t, int dst) override { c_.send(t, dst); }
  void recv(Tensor t, int src) override { c_.recv(t, src); }
  std::unique_ptr<Work> send_async(Tensor t, int dst) override {
    return defer([this, t, dst] { return c_.send_async(t, dst); });
  }
  std::unique_ptr<Work> recv_async(Tensor t, int src) override {
    return defer([this, t, src] { return c_.recv_async(t, src); });
  }
  void barrier() override { c_.barrier(); }
  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups, const std::string& name) override {
    return c_.split(groups, name);
  }

 private:
  class Deferred final : public Work {
   public:
    explicit Deferred(DeferredP2P& owner) : owner_(owner) {}
    void wait() override { owner_.run_pending(); }

   private:
    DeferredP2P& owner_;
  };
  std::unique_ptr<Work> defer(std::function<std::unique_ptr<Work>()> post) {
    pending_.push_back(std::move(post));
    return std::make_unique<Deferred>(*this);
  }
  void run_pending() {
    std::vector<std::unique_ptr<Work>> posted;
    for (auto& post : pending_) posted.push_back(post());
    pending_.clear();
    for (auto& w : posted) w->wait();
  }
  Communicator& c_;
  std::vector<std::function<std::unique_ptr<Work>()>> pending_;
};

double best_ms(Communicator& world, const std::function<void()>& f, int iterations) {
  f();
  double best = 1e300;
  for (int i = 0; i < iterations; ++i) {
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const launch::WorkerIdentity id = launch::from_environment(argc, argv);
  std::unique_ptr<TcpStoreServer> server;  // declared first: destroyed last
  if (id.serve_store) server = std::make_unique<TcpStoreServer>(id.store_port, id.job_token);
  const auto timeout = std::chrono::minutes(5);
  std::shared_ptr<Store> store =
      id.distributed() ? std::shared_ptr<Store>(connect_tcp_store(id.store_host, id.store_port, id.job_token, timeout))
                       : std::shared_ptr<Store>(make_local_store(timeout));
  GlooOptions opt;
  opt.timeout = timeout;
  opt.master_addr = id.master_addr;
  opt.master_port = id.master_port;
  opt.key_prefix = id.key_prefix;
  std::unique_ptr<Communicator> world = create_gloo_communicator(store, id.rank, id.world_size, opt);
  DeferredP2P serial(*world);
  const int cp = world->size();

  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t B = arg(1, 1), NH = arg(2, 8), NG = arg(3, NH), HD = arg(4, 64);
  const int iterations = static_cast<int>(arg(5, 5));
  std::vector<int64_t> lengths;
  for (int i = 6; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
  if (lengths.empty()) lengths = {512, 1024, 2048, 4096};
  const int64_t R = NH / NG, W = NG * (R + 2) * HD, KW = NG * 2 * HD;
  const ops::Rope rope{NG == NH ? 0 : HD, 10000.0f, {}};
  Device& dev = cpu_device();

  if (world->rank() == 0) {
    std::printf("ring attention at CP %d (Gloo), B=%lld NH=%lld NG=%lld HD=%lld, f32 on %s, %s threads per rank, "
                "fastest of %d\n",
                cp, (long long)B, (long long)NH, (long long)NG, (long long)HD, dev.name().c_str(),
                std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "default", iterations);
    std::printf("| S | kv msg MB | qkv msg MB | exchange kv ms | exchange qkv ms | fwd serial ms | fwd overlapped ms "
                "| fwd hidden ms | bwd serial ms | bwd overlapped ms | bwd hidden ms |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  }
  for (const int64_t S : lengths) {
    const int64_t T = S / cp;
    std::vector<Buffer> buffers;
    auto tensor = [&](Shape s) {
      buffers.emplace_back(dev, static_cast<size_t>(shape_numel(s)) * 4);
      Tensor t = tensor_at(buffers.back(), 0, DType::F32, s);
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>((i * 7919 + static_cast<size_t>(world->rank()) * 13) % 1000) / 1000.0f - 0.5f;
      copy_from_host(t, v.data(), v.size() * 4);
      return t;
    };
    Tensor qkv = tensor({B, T, W}), dqkv = tensor(qkv.shape);
    Tensor out = tensor({B, T, NH * HD}), dout = tensor(out.shape), lse = tensor({B, NH, T});
    Tensor scratch = tensor(ops::flash_attention_scratch(dev, B, NH, T));
    RingBuffers ring{{tensor({2, B, T, KW}), tensor({2, B, T, KW})}, tensor(qkv.shape), tensor(qkv.shape)};
    Tensor kv_in = tensor({B, T, KW}), qkv_in = tensor(qkv.shape);

    const int next = (world->rank() + 1) % cp, prev = (world->rank() + cp - 1) % cp;
    auto exchange = [&](Tensor send, Tensor recv) {
      auto s = world->send_async(send, next);
      auto r = world->recv_async(recv, prev);
      s->wait();
      r->wait();
    };
    const double kv_ms = best_ms(*world, [&] { exchange(ring.message[0].slice_rows(0, 1), kv_in.view({1, B, T, KW})); },
                                 iterations);
    const double qkv_ms = best_ms(*world, [&] { exchange(qkv, qkv_in); }, iterations);
    auto forward = [&](Communicator& c) {
      return best_ms(*world, [&] { ring_attention_forward(c, ring, out, lse, qkv, NG, rope, {}, S); }, iterations);
    };
    auto backward = [&](Communicator& c) {
      return best_ms(
          *world, [&] { ring_attention_backward(c, ring, dqkv, scratch, dout, qkv, out, lse, NG, rope, {}, S); },
          iterations);
    };
    const double fs = forward(serial), fo = forward(*world), bs = backward(serial), bo = backward(*world);
    if (world->rank() == 0)
      std::printf("| %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", (long long)S,
                  B * T * KW * 4 / 1e6, B * T * W * 4 / 1e6, kv_ms, qkv_ms, fs, fo, fs - fo, bs, bo, bs - bo);
  }
  world->barrier();
  return 0;
}
