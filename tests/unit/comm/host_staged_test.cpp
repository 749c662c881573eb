// The host-staged path (device -> pinned host -> transport -> device) against the host path:
// every collective and p2p call, run once on host tensors and once on tensors of a device
// the host cannot address, must leave the same bytes. Devices: strict (host memory that
// refuses host access, so any access that skipped the staging aborts naming its place) and
// every OpenCL device when the backend is built and one is present. Ranks are in-process
// threads sharing the device; the staging lives in GroupCommunicator, the same for Gloo.
#include <gtest/gtest.h>

#include <cstring>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/device/host_staging.h"
#include "tessera/device/registry.h"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> devices_under_test() {
  std::vector<std::string> specs = {"strict"};
  for (const std::string& backend : device_backends()) {
    if (backend == "cpu") continue;
    for (int i = 0; i < device_count(backend); ++i) specs.push_back(backend + ":" + std::to_string(i));
  }
  return specs;
}

// The same values as a host tensor and as a tensor of `device`.
template <typename T>
struct Twin {
  Twin(Device& device, DType dtype, std::vector<T> values)
      : host(std::move(values)), buffer(device, host.size() * sizeof(T)) {
    const Shape shape = {static_cast<int64_t>(host.size())};
    h = Tensor(host.data(), dtype, shape, nullptr);
    d = Tensor(buffer.handle(), 0, dtype, shape, &device);
    copy_from_host(d, host.data(), d.bytes());
  }
  // Whether the device tensor holds the host tensor's bytes.
  bool same() const {
    std::vector<T> back(host.size());
    copy_to_host(back.data(), back.size() * sizeof(T), d);
    return std::memcmp(back.data(), host.data(), d.bytes()) == 0;
  }

  std::vector<T> host;
  Buffer buffer;
  Tensor h, d;
};

// Values whose sums are exact in f32 (small integers), different on every rank and element.
template <typename T>
std::vector<T> values(int rank, size_t n, int salt) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>((rank + 1) * static_cast<int>(i % 13) + salt);
  return v;
}

class HostStaged : public ::testing::TestWithParam<std::string> {
 protected:
  Device& device() { return open_device(GetParam()); }
};

constexpr int kRanks = 3;
constexpr size_t kCount = 1000;

TEST_P(HostStaged, AllReduceEveryDtypeAndOpEqualsTheHostPath) {
  Device& dev = device();
  run_in_process_ranks(kRanks, [&](Communicator& c) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      Twin<float> f(dev, DType::F32, values<float>(c.rank(), kCount, 1));
      Twin<int32_t> i(dev, DType::I32, values<int32_t>(c.rank(), kCount, -5));
      Twin<int64_t> l(dev, DType::I64, values<int64_t>(c.rank(), kCount, 1 << 20));
      for (Tensor* t : {&f.h, &f.d, &i.h, &i.d, &l.h, &l.d}) c.all_reduce(*t, op);
      EXPECT_TRUE(f.same() && i.same() && l.same()) << "rank " << c.rank();
    }
    Twin<float> sum(dev, DType::F32, values<float>(c.rank(), 1, 1));
    c.all_reduce(sum.d, ReduceOp::Sum);
    EXPECT_EQ(read_f32(sum.d)[0], 1.f + 1.f + 1.f);  // element 0: (r + 1) * 0 + 1 on each rank
  });
}

// Two outstanding asynchronous all-reduces per path (gradient buckets); results land in the
// device tensor at wait().
TEST_P(HostStaged, AsyncAllReduceEqualsTheHostPath) {
  Device& dev = device();
  run_in_process_ranks(kRanks, [&](Communicator& c) {
    Twin<float> a(dev, DType::F32, values<float>(c.rank(), kCount, 2));
    Twin<float> b(dev, DType::F32, values<float>(c.rank(), 17, 3));
    auto wa_h = c.all_reduce_async(a.h, ReduceOp::Sum);
    auto wb_h = c.all_reduce_async(b.h, ReduceOp::Max);
    auto wa_d = c.all_reduce_async(a.d, ReduceOp::Sum);
    auto wb_d = c.all_reduce_async(b.d, ReduceOp::Max);
    wb_d->wait();
    wa_d->wait();
    wa_h->wait();
    wb_h->wait();
    EXPECT_TRUE(a.same() && b.same()) << "rank " << c.rank();
  });
}

TEST_P(HostStaged, AllGatherReduceScatterBroadcastEqualTheHostPath) {
  Device& dev = device();
  run_in_process_ranks(kRanks, [&](Communicator& c) {
    Twin<float> in(dev, DType::F32, values<float>(c.rank(), kCount, 4));
    Twin<float> gathered(dev, DType::F32, std::vector<float>(kCount * kRanks, -1.f));
    c.all_gather(gathered.h, in.h);
    c.all_gather(gathered.d, in.d);
    EXPECT_TRUE(gathered.same()) << "all_gather, rank " << c.rank();

    Twin<int32_t> whole(dev, DType::I32, values<int32_t>(c.rank(), kCount * kRanks, 5));
    Twin<int32_t> chunk(dev, DType::I32, std::vector<int32_t>(kCount, -1));
    c.reduce_scatter(chunk.h, whole.h, ReduceOp::Sum);
    c.reduce_scatter(chunk.d, whole.d, ReduceOp::Sum);
    EXPECT_TRUE(chunk.same()) << "reduce_scatter, rank " << c.rank();

    // Any dtype moves: bf16 bits as u16.
    Twin<uint16_t> cast(dev, DType::BF16, values<uint16_t>(c.rank(), kCount, 6));
    c.broadcast(cast.h, 1);
    c.broadcast(cast.d, 1);
    EXPECT_TRUE(cast.same()) << "broadcast, rank " << c.rank();
  });
}

// A host tensor on one side and a device tensor on the other: each is staged or not on its own.
TEST_P(HostStaged, MixedHostAndDeviceOperands) {
  Device& dev = device();
  run_in_process_ranks(kRanks, [&](Communicator& c) {
    Twin<float> in(dev, DType::F32, values<float>(c.rank(), kCount, 7));
    Twin<float> out(dev, DType::F32, std::vector<float>(kCount * kRanks));
    c.all_gather(out.h, in.d);
    c.all_gather(out.d, in.h);
    EXPECT_TRUE(out.same()) << "rank " << c.rank();
  });
}

// A ring of posted sends and receives (Megatron's batch_isend_irecv), several messages per
// pair in flight, then blocking send/recv between ranks 0 and 1.
TEST_P(HostStaged, PointToPointEqualsTheHostPath) {
  Device& dev = device();
  run_in_process_ranks(kRanks, [&](Communicator& c) {
    const int next = (c.rank() + 1) % kRanks, prev = (c.rank() + kRanks - 1) % kRanks;
    std::vector<Twin<float>> out, in;
    for (int k = 0; k < 3; ++k) {
      out.emplace_back(dev, DType::F32, values<float>(c.rank(), kCount, 10 * k));
      in.emplace_back(dev, DType::F32, std::vector<float>(kCount, -1.f));
    }
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 3; ++k) {
      works.push_back(c.send_async(out[k].h, next));
      works.push_back(c.recv_async(in[k].h, prev));
      works.push_back(c.send_async(out[k].d, next));
      works.push_back(c.recv_async(in[k].d, prev));
    }
    for (auto& w : works) w->wait();
    // Each message k went out twice in a row (host, then device), so the host tensor of
    // message k and the device tensor of message k received the same values.
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(in[k].same()) << "message " << k << ", rank " << c.rank();

    Twin<int64_t> x(dev, DType::I64, values<int64_t>(c.rank(), 33, 8));
    if (c.rank() == 0) {
      c.send(x.h, 1);
      c.send(x.d, 1);
    } else if (c.rank() == 1) {
      c.recv(x.h, 0);
      c.recv(x.d, 0);
      EXPECT_TRUE(x.same());
    }
  });
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (ch == ':') ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Devices, HostStaged, ::testing::ValuesIn(devices_under_test()), test_name);

}  // namespace
