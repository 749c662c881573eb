// GroupCommunicator with a device transport beside its host transport (group_communicator.h),
// the shape of the NCCL communicator and of any later native library (HCCL): a fake device
// transport over in-process ranks records what reaches it. Tensors of its device go to it,
// numbered with the group's calls and checked first; host tensors and barriers stay on the
// host transport with their results; splits reach the device transport on every rank, those
// in no list included; zero-byte calls never reach it.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <thread>

#include "tessera/comm/group_communicator.h"
#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/buffer.h"
#include "tessera/device/registry.h"

using namespace tessera;
using namespace tessera::comm_detail;

namespace {

// What every rank's fake saw, in order: "rank 0 all_reduce 3", "rank 1 split tp sub", ...
struct Log {
  std::mutex lock;
  std::vector<std::string> lines;
  void add(const std::string& line) {
    std::lock_guard<std::mutex> guard(lock);
    lines.push_back(line);
  }
  size_t count(const std::string& line) {
    std::lock_guard<std::mutex> guard(lock);
    return static_cast<size_t>(std::count(lines.begin(), lines.end(), line));
  }
};

class CountedWork final : public Work {
 public:
  CountedWork(Log& log, std::string line) : log_(log), line_(std::move(line)) {}
  void wait() override { log_.add(line_ + " waited"); }

 private:
  Log& log_;
  std::string line_;
};

// Addresses the strict device's tensors; logs each call with its number on the group.
class FakeDeviceTransport final : public DeviceTransport {
 public:
  FakeDeviceTransport(Log& log, const Device& device, Group group)
      : log_(log), device_(device), group_(std::move(group)) {}
  const char* backend() const override { return "fake"; }
  bool addresses(const Tensor& t) const override { return t.device == &device_; }
  std::unique_ptr<Work> all_reduce(const Tensor&, ReduceOp, const Call& c) override { return note("all_reduce", c); }
  std::unique_ptr<Work> all_gather(const Tensor&, const Tensor&, const Call& c) override {
    return note("all_gather", c);
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor&, const Tensor&, ReduceOp, const Call& c) override {
    return note("reduce_scatter", c);
  }
  std::unique_ptr<Work> broadcast(const Tensor&, int, const Call& c) override { return note("broadcast", c); }
  std::unique_ptr<Work> post(const Tensor&, int peer, bool is_send, const P2PText&) override {
    const std::string line = prefix() + (is_send ? "send to " : "recv from ") + std::to_string(peer);
    log_.add(line);
    return std::make_unique<CountedWork>(log_, line);
  }
  void flush() override { log_.add(prefix() + "flush"); }
  std::unique_ptr<DeviceTransport> split(const SplitPlan& plan, const Group* sub) override {
    log_.add(prefix() + "split " + plan.name + (sub ? " sub" : " none"));
    if (!sub) return nullptr;
    return std::make_unique<FakeDeviceTransport>(log_, device_, *sub);
  }

 private:
  std::string prefix() const {
    return group_.name + " rank " + std::to_string(group_.world_ranks[static_cast<size_t>(group_.rank)]) + " ";
  }
  std::unique_ptr<Work> note(const char* op, const Call& c) {
    const std::string line = prefix() + op + " " + std::to_string(c.seq);
    log_.add(line);
    return std::make_unique<CountedWork>(log_, line);
  }
  Log& log_;
  const Device& device_;
  Group group_;
};

// Runs body(communicator) on `size` in-process ranks, each with a fake device transport.
void run_ranks(int size, Log& log, const std::function<void(Communicator&, Device&)>& body) {
  InProcessWorld world(size, std::chrono::seconds(20));
  Device& strict = open_device("strict");
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Transport> host = world.transport(r);
        auto device = std::make_unique<FakeDeviceTransport>(log, strict, host->group());
        GroupCommunicator comm(std::move(host), std::move(device));
        body(comm, strict);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

TEST(DeviceTransport, DeviceTensorsReachItNumberedWithTheGroupsCalls) {
  Log log;
  run_ranks(2, log, [](Communicator& comm, Device& strict) {
    EXPECT_EQ(comm.backend_name(), "fake");
    Buffer b(strict, 64);
    const Tensor d(b.handle(), 0, DType::F32, {8}, &strict);
    const Tensor half(b.handle(), 0, DType::F32, {4}, &strict);
    std::vector<float> host = {float(comm.rank() + 1), 10};
    const Tensor h(host.data(), DType::F32, {2}, nullptr);
    comm.all_reduce(d, ReduceOp::Sum);  // call 1, on the device
    comm.all_reduce(h, ReduceOp::Sum);  // call 2, on the host
    EXPECT_EQ(host, (std::vector<float>{3, 20}));
    comm.all_gather(d, half);                                   // 3
    comm.reduce_scatter(half, d, ReduceOp::Max);                // 4
    comm.broadcast(d, 1);                                       // 5
    std::unique_ptr<Work> w = comm.all_reduce_async(d, ReduceOp::Sum);  // 6, not waited yet
    comm.barrier();                                             // 7, host
    w->wait();
  });
  for (int r : {0, 1}) {
    const std::string p = "world rank " + std::to_string(r) + " ";
    for (const char* line : {"all_reduce 1", "all_gather 3", "reduce_scatter 4", "broadcast 5"}) {
      EXPECT_EQ(log.count(p + line), 1u) << p + line;
      EXPECT_EQ(log.count(p + line + " waited"), 1u) << "a synchronous call waits: " << p + line;
    }
    EXPECT_EQ(log.count(p + "all_reduce 6"), 1u);
    EXPECT_EQ(log.count(p + "all_reduce 6 waited"), 1u);
    EXPECT_EQ(log.count(p + "all_reduce 2"), 0u) << "host tensors stay on the host transport";
    EXPECT_EQ(log.count(p + "flush"), 1u) << "barrier launches held p2p first";
  }
}

TEST(DeviceTransport, P2POnTheDevicePostsThereAndWaits) {
  Log log;
  run_ranks(2, log, [](Communicator& comm, Device& strict) {
    Buffer b(strict, 16);
    const Tensor d(b.handle(), 0, DType::F32, {4}, &strict);
    const int peer = 1 - comm.rank();
    std::unique_ptr<Work> s = comm.send_async(d, peer);
    std::unique_ptr<Work> r = comm.recv_async(d, peer);
    s->wait();
    r->wait();
  });
  EXPECT_EQ(log.count("world rank 0 send to 1 waited"), 1u);
  EXPECT_EQ(log.count("world rank 1 recv from 0 waited"), 1u);
}

TEST(DeviceTransport, SplitReachesItOnEveryRank) {
  Log log;
  run_ranks(3, log, [](Communicator& comm, Device& strict) {
    std::unique_ptr<Communicator> sub = comm.split({{0, 2}}, "pair");
    EXPECT_EQ(sub != nullptr, comm.rank() != 1);
    if (!sub) return;
    EXPECT_EQ(sub->backend_name(), "fake");
    Buffer b(strict, 16);
    sub->all_reduce(Tensor(b.handle(), 0, DType::F32, {4}, &strict), ReduceOp::Sum);
  });
  EXPECT_EQ(log.count("world rank 0 split pair sub"), 1u);
  EXPECT_EQ(log.count("world rank 1 split pair none"), 1u) << "ranks in no list split the device library too";
  EXPECT_EQ(log.count("world rank 2 split pair sub"), 1u);
  EXPECT_EQ(log.count("pair rank 0 all_reduce 1"), 1u);
  EXPECT_EQ(log.count("pair rank 2 all_reduce 1"), 1u);
}

TEST(DeviceTransport, EmptyCallsNeverReachIt) {
  Log log;
  run_ranks(2, log, [](Communicator& comm, Device& strict) {
    Buffer b(strict, 64);
    const Tensor empty(b.handle(), 0, DType::F32, {0}, &strict);
    comm.all_reduce(empty, ReduceOp::Sum);
    comm.all_gather(empty, empty);
    comm.all_reduce_async(empty, ReduceOp::Sum)->wait();
    comm.broadcast(empty, 0);
  });
  EXPECT_TRUE(log.lines.empty()) << log.lines.front();
}
