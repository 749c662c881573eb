// Context parallelism's ring attention (model/context_parallel.h) at CP = the world size,
// measuring how much of the ring's communication the compute hides. Each configuration runs
// the ring twice with the same code: as built (each step's send/receive posted before the
// block is computed and waited after it), and serialised (the same messages posted only when
// the step waits, after its block: a communicator wrapper defers them). The wrapper also
// adds up the time spent blocked in the waits: serialised, that is all of the communication;
// overlapped, the part the compute did not hide (less noisy than the difference of the two
// wall times, which carries the compute's own spread). Also the time of one exchange of the
// ring's message (keys and values) and of a whole qkv row's (what the ring sent before it
// packed K and V), with no compute.
// Times: the median of `iterations` calls after a warm-up, ranks started together by a
// barrier, rank 0's clock. On a machine with fewer cores than ranks x threads the transfer's
// own CPU work (loopback TCP copies) competes with the compute: say how loaded it was.
// usage: tessera launch --standalone --nproc_per_node 2 bench/ring_attention_bench [B NH NG HD iterations] [S...]
//        (default 1 8 8 64 9, S 512 1024 2048 4096; GPT's layout when NG = NH)
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

// The communicator with its asynchronous point-to-point calls timed: the time the caller
// spends blocked in their wait() adds up in waited_ms, the communication the compute did not
// hide. Deferred, send_async and recv_async only record the call, and the first wait() on any
// of them posts everything recorded (in call order) and waits for it: the ring's code then
// runs with every exchange after the compute it would overlap, all of it waited for.
class TimedP2P final : public Communicator {
 public:
  TimedP2P(Communicator& c, bool deferred) : c_(c), deferred_(deferred) {}
  double waited_ms = 0;

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
    return post([this, t, dst] { return c_.send_async(t, dst); });
  }
  std::unique_ptr<Work> recv_async(Tensor t, int src) override {
    return post([this, t, src] { return c_.recv_async(t, src); });
  }
  void barrier() override { c_.barrier(); }
  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups, const std::string& name) override {
    return c_.split(groups, name);
  }

 private:
  using Post = std::function<std::unique_ptr<Work>()>;
  class Timed final : public Work {
   public:
    Timed(TimedP2P& owner, std::unique_ptr<Work> inner) : owner_(owner), inner_(std::move(inner)) {}
    void wait() override {
      const auto start = std::chrono::steady_clock::now();
      if (inner_) inner_->wait();
      else owner_.run_deferred();
      owner_.waited_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }

   private:
    TimedP2P& owner_;
    std::unique_ptr<Work> inner_;  // null: deferred
  };
  std::unique_ptr<Work> post(Post p) {
    if (!deferred_) return std::make_unique<Timed>(*this, p());
    pending_.push_back(std::move(p));
    return std::make_unique<Timed>(*this, nullptr);
  }
  void run_deferred() {
    std::vector<std::unique_ptr<Work>> posted;
    for (auto& p : pending_) posted.push_back(p());
    pending_.clear();
    for (auto& w : posted) w->wait();
  }
  Communicator& c_;
  bool deferred_;
  std::vector<Post> pending_;
};

// The median, over `iterations` calls after a warm-up (ranks started together by a barrier),
// of the wall time of f and of the time it waited on c's point-to-point calls.
struct Times {
  double wall_ms, waited_ms;
};
Times median_ms(Communicator& world, TimedP2P& c, const std::function<void()>& f, int iterations) {
  f();
  std::vector<double> wall, waited;
  for (int i = 0; i < iterations; ++i) {
    world.barrier();
    c.waited_ms = 0;
    const auto start = std::chrono::steady_clock::now();
    f();
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    waited.push_back(c.waited_ms);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(wall), median(waited)};
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
  TimedP2P serial(*world, /*deferred=*/true), overlapped(*world, /*deferred=*/false);
  const int cp = world->size();

  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t B = arg(1, 1), NH = arg(2, 8), NG = arg(3, NH), HD = arg(4, 64);
  const int iterations = static_cast<int>(arg(5, 9));
  std::vector<int64_t> lengths;
  for (int i = 6; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
  if (lengths.empty()) lengths = {512, 1024, 2048, 4096};
  const int64_t R = NH / NG, W = NG * (R + 2) * HD, KW = NG * 2 * HD;
  const ops::Rope rope{NG == NH ? 0 : HD, 10000.0f, {}};
  Device& dev = cpu_device();

  if (world->rank() == 0) {
    std::printf("ring attention at CP %d (Gloo), B=%lld NH=%lld NG=%lld HD=%lld, f32 on %s, %s threads per rank, "
                "median of %d\n",
                cp, (long long)B, (long long)NH, (long long)NG, (long long)HD, dev.name().c_str(),
                std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "default", iterations);
    std::printf("| S | kv msg MB | qkv msg MB | exchange kv ms | exchange qkv ms | forward ms serial / overlapped | "
                "forward waited ms serial / overlapped | backward ms serial / overlapped | backward waited ms "
                "serial / overlapped |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
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

    TimedP2P& plain = overlapped;
    auto exchange = [&](Tensor send, Tensor recv) {
      auto s = plain.send_async(send, (plain.rank() + 1) % cp);
      auto r = plain.recv_async(recv, (plain.rank() + cp - 1) % cp);
      s->wait();
      r->wait();
    };
    const Tensor kv_out = ring.message[0].slice_rows(0, 1), kv_recv = kv_in.view({1, B, T, KW});
    const Times kv = median_ms(*world, plain, [&] { exchange(kv_out, kv_recv); }, iterations);
    const Times whole = median_ms(*world, plain, [&] { exchange(qkv, qkv_in); }, iterations);
    auto forward = [&](TimedP2P& c) {
      return median_ms(*world, c, [&] { ring_attention_forward(c, ring, out, lse, qkv, NG, rope, {}, S); }, iterations);
    };
    auto backward = [&](TimedP2P& c) {
      return median_ms(
          *world, c, [&] { ring_attention_backward(c, ring, dqkv, scratch, dout, qkv, out, lse, NG, rope, {}, S); },
          iterations);
    };
    const Times fs = forward(serial), fo = forward(overlapped), bs = backward(serial), bo = backward(overlapped);
    if (world->rank() == 0)
      std::printf("| %lld | %.2f | %.2f | %.2f | %.2f | %.1f / %.1f | %.2f / %.2f | %.1f / %.1f | %.2f / %.2f |\n",
                  (long long)S, B * T * KW * 4 / 1e6, B * T * W * 4 / 1e6, kv.wall_ms, whole.wall_ms, fs.wall_ms,
                  fo.wall_ms, fs.waited_ms, fo.waited_ms, bs.wall_ms, bo.wall_ms, bs.waited_ms, bo.waited_ms);
  }
  world->barrier();
  return 0;
}
