// The multi-tensor optimizer ops (ops.h) against the per-tensor ops they replace, on every
// device this binary has (cpu, strict, and each OpenCL or CUDA device): over a slab of
// segments that span several chunks, sit at different offsets in each tensor and split into
// the decay and no-decay groups, AdamW and SGD give adamw_update's / sgd_update's bits and
// the 16-bit copy gives convert's; the norm's slots give sum_squares' bits and lie within
// their stated bound of a float64 (long double) sum; grad_norm_finish gives the host
// arithmetic's bits and flags inf and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

std::vector<std::string> devices_under_test() {
  std::vector<std::string> specs = {"cpu", "strict"};
  for (const std::string& backend : device_backends()) {
    if (backend == "cpu") continue;
    for (int i = 0; i < device_count(backend); ++i) specs.push_back(backend + ":" + std::to_string(i));
  }
  return specs;
}

// Four segments: two chunks and a tail (decay), a short one (no decay), one more (decay),
// and 7 elements whose 16-bit copy starts 4 bytes into a 64-byte line (it ends before the
// line does: the CPU's bf16 copy is written by lines), each placed at its own offset in the
// parameter, gradient and state buffers, with gaps.
std::vector<ops::MultiTensorSegment> segments() {
  std::vector<ops::MultiTensorSegment> s(4);
  s[0] = {.main = 0, .param = 16, .grad = 32, .state = 0, .numel = 2 * 65536 + 77, .decay = true, .slot = 3};
  s[1] = {.main = 131200, .param = 131184, .grad = 131300, .state = 131168, .numel = 33, .decay = false, .slot = 0};
  s[2] = {.main = 131280, .param = 131232, .grad = 131400, .state = 131216, .numel = 1000, .decay = true, .slot = 1};
  s[3] = {.main = 132400, .param = 132290, .grad = 132500, .state = 132400, .numel = 7, .decay = false, .slot = 5};
  return s;
}
constexpr int64_t kSlab = 133000;  // elements of every slab: past each segment's end
constexpr int64_t kSlots = 6;

class MultiTensor : public ::testing::TestWithParam<std::string> {
 protected:
  Device& device() { return open_device(GetParam()); }

  Tensor alloc(DType dtype, const Shape& shape) {
    buffers_.emplace_back(device(), static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
    return tensor_at(buffers_.back(), 0, dtype, shape);
  }
  // N(0, std) values stored in dtype (rounded on the host).
  Tensor normal(DType dtype, int64_t n, float std) {
    std::normal_distribution<float> dist(0.0f, std);
    Tensor t = alloc(dtype, {n});
    if (dtype == DType::F32) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = dist(gen_);
      copy_from_host(t, v.data(), v.size() * sizeof(float));
    } else {
      std::vector<uint16_t> v(static_cast<size_t>(n));
      for (uint16_t& x : v) x = dtype == DType::BF16 ? f32_to_bf16(dist(gen_)) : f32_to_f16(dist(gen_));
      copy_from_host(t, v.data(), v.size() * sizeof(uint16_t));
    }
    return t;
  }
  // A copy of t on the same device.
  Tensor clone(const Tensor& t) {
    Tensor c = alloc(t.dtype, t.shape);
    copy_tensor(c, t);
    return c;
  }
  static Tensor piece(const Tensor& t, int64_t at, int64_t n) {
    return Tensor(t.handle, t.offset + static_cast<size_t>(at) * dtype_size(t.dtype), t.dtype, {n}, t.device);
  }
  static std::vector<char> bytes(const Tensor& t) {
    std::vector<char> b(t.bytes());
    copy_to_host(b.data(), b.size(), t);
    return b;
  }
  static std::vector<double> doubles(const Tensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    copy_to_host(v.data(), v.size() * sizeof(double), t);
    return v;
  }
  Tensor table(const std::vector<ops::MultiTensorSegment>& segs) {
    const std::vector<int64_t> rows = ops::multi_tensor_chunk_table(segs);
    Tensor t = alloc(DType::I64, {static_cast<int64_t>(rows.size()) / ops::kChunkColumns, ops::kChunkColumns});
    copy_from_host(t, rows.data(), rows.size() * sizeof(int64_t));
    return t;
  }
  Tensor scalars(double lr, double wd, double loss_scale, int64_t step, float grad_scale) {
    float host[ops::kStepScalars];
    ops::step_scalars(host, lr, wd, loss_scale, 0.9f, 0.95f, step);
    host[ops::kGradScale] = grad_scale;
    Tensor t = alloc(DType::F32, {ops::kStepScalars});
    copy_from_host(t, host, sizeof(host));
    return t;
  }

  // Three steps of AdamW (sgd_momentum < 0) or SGD with that momentum, multi-tensor on one
  // copy of the state and per tensor on another, compared bit for bit.
  void update_equals_per_tensor(DType param_dtype, float sgd_momentum) {
    const bool adam = sgd_momentum < 0.0f, wide = param_dtype == DType::F32;
    const std::vector<ops::MultiTensorSegment> segs = segments();
    Tensor param16 = wide ? Tensor() : normal(param_dtype, kSlab, 0.5f);
    Tensor main = normal(DType::F32, kSlab, 0.5f);
    if (!wide)  // the main values start as the widened 16-bit parameters, as in the optimizer
      for (const ops::MultiTensorSegment& s : segs)
        ops::convert(piece(main, s.main, s.numel), piece(param16, s.param, s.numel));
    Tensor grad = normal(DType::F32, kSlab, 0.1f), m = normal(DType::F32, kSlab, 0.01f), v = alloc(DType::F32, {kSlab});
    Tensor main_ref = clone(main), m_ref = clone(m), v_ref = clone(v), p16_ref = wide ? Tensor() : clone(param16);
    const Tensor chunks = table(segs);
    for (int64_t step = 1; step <= 3; ++step) {
      const double lr = 1e-3 * static_cast<double>(step), wd = 0.1;
      const float grad_scale = 0.5f;
      const Tensor s = scalars(lr, wd, 1.0, step, grad_scale);
      if (adam)
        ops::multi_tensor_adamw(main, param16, grad, m, v, chunks, s, 0.9f, 0.95f, 1e-8f);
      else
        ops::multi_tensor_sgd(main, param16, grad, sgd_momentum == 0.0f ? Tensor() : m, chunks, s, sgd_momentum);
      for (const ops::MultiTensorSegment& seg : segs) {
        const Tensor p = piece(main_ref, seg.main, seg.numel), g = piece(grad, seg.grad, seg.numel);
        const float wd_seg = seg.decay ? static_cast<float>(wd) : 0.0f;
        if (adam)
          ops::adamw_update(p, g, piece(m_ref, seg.state, seg.numel), piece(v_ref, seg.state, seg.numel),
                            static_cast<float>(lr), 0.9f, 0.95f, 1e-8f, wd_seg, step, grad_scale);
        else
          ops::sgd_update(p, g, sgd_momentum == 0.0f ? Tensor() : piece(m_ref, seg.state, seg.numel),
                          static_cast<float>(lr), sgd_momentum, wd_seg, step, grad_scale);
        if (!wide) ops::convert(piece(p16_ref, seg.param, seg.numel), p);
      }
    }
    EXPECT_EQ(bytes(main), bytes(main_ref)) << "main parameters on " << GetParam();
    EXPECT_EQ(bytes(m), bytes(m_ref)) << "first state on " << GetParam();
    if (adam) EXPECT_EQ(bytes(v), bytes(v_ref)) << "second moment on " << GetParam();
    if (!wide) EXPECT_EQ(bytes(param16), bytes(p16_ref)) << "16-bit parameters on " << GetParam();
  }

  std::mt19937 gen_{20261205};
  std::vector<Buffer> buffers_;
};

TEST_P(MultiTensor, AdamWEqualsPerTensorOpsF32) { update_equals_per_tensor(DType::F32, -1.0f); }
TEST_P(MultiTensor, AdamWEqualsPerTensorOpsAndConvertBf16) { update_equals_per_tensor(DType::BF16, -1.0f); }
TEST_P(MultiTensor, AdamWEqualsPerTensorOpsAndConvertF16) { update_equals_per_tensor(DType::F16, -1.0f); }
TEST_P(MultiTensor, SgdEqualsPerTensorOps) { update_equals_per_tensor(DType::F32, 0.9f); }
TEST_P(MultiTensor, SgdWithoutMomentumAndBf16EqualsPerTensorOps) { update_equals_per_tensor(DType::BF16, 0.0f); }

TEST_P(MultiTensor, SumSquaresEqualsPerTensorAndFloat64) {
  const std::vector<ops::MultiTensorSegment> segs = segments();
  const Tensor grad = normal(DType::F32, kSlab, 1.0f);
  const Tensor sums = alloc(DType::I64, {kSlots}), ref = alloc(DType::I64, {kSlots});
  const Tensor chunks = table(segs);
  const Tensor workspace = alloc(DType::I64, ops::multi_tensor_sum_squares_workspace(device(), chunks.dim(0)));
  ops::multi_tensor_sum_squares(sums, workspace, grad, chunks);
  for (const ops::MultiTensorSegment& s : segs) ops::sum_squares(ref, s.slot, piece(grad, s.grad, s.numel));
  const std::vector<double> got = doubles(sums);
  EXPECT_EQ(got, doubles(ref)) << "the per-tensor order, on " << GetParam();
  std::vector<float> host(static_cast<size_t>(kSlab));
  copy_to_host(host.data(), host.size() * sizeof(float), grad);
  for (const ops::MultiTensorSegment& s : segs) {
    long double exact = 0.0L;
    for (int64_t i = 0; i < s.numel; ++i) exact += static_cast<long double>(host[s.grad + i]) * host[s.grad + i];
    // ops.h's bound: n * 2^-53 of the sum, relative.
    const double bound = static_cast<double>(s.numel) * 0x1p-53 * static_cast<double>(exact);
    EXPECT_NEAR(got[s.slot], static_cast<double>(exact), bound) << "segment of " << s.numel;
  }
  EXPECT_EQ(got[2], 0.0);  // no segment's slot
  EXPECT_EQ(got[4], 0.0);
}

// grad_norm_finish against the trainer's former host arithmetic, for a finite norm with and
// without clipping, no clipping at all, and inf and NaN slots.
TEST_P(MultiTensor, GradNormFinishIsTheHostArithmetic) {
  struct Case {
    double slots[3];
    float clip;
    double loss_scale;
  };
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const Case cases[] = {{{2.25, 0.0, 7.5}, 1.0f, 1.0},      {{1e-4, 2e-5, 0.0}, 1.0f, 1.0},
                        {{2.25, 0.0, 7.5}, 0.0f, 1.0},      {{3e8, 1e9, 5e7}, 1.0f, 65536.0},
                        {{2.25, inf, 7.5}, 1.0f, 65536.0},  {{nan, 0.0, 1.0}, 1.0f, 1.0}};
  for (const Case& c : cases) {
    const Tensor sums = alloc(DType::I64, {3}), result = alloc(DType::I64, {2});
    copy_from_host(sums, c.slots, sizeof(c.slots));
    const Tensor s = scalars(1e-3, 0.1, c.loss_scale, 1, 0.0f);
    ops::grad_norm_finish(result, s, sums, c.clip);
    double total = 0.0;
    for (double x : c.slots) total += x;
    const double norm = std::sqrt(total) / c.loss_scale;
    double coeff = 1.0;
    if (c.clip > 0.0f) {
      const double q = c.clip / (norm + 1e-6);
      coeff = q < 1.0 ? q : 1.0;
    }
    const std::vector<double> got = doubles(result);
    float host[ops::kStepScalars];
    copy_to_host(host, sizeof(host), s);
    if (std::isfinite(total)) {
      EXPECT_EQ(got[0], norm) << GetParam();
      EXPECT_EQ(got[1], 0.0);
      const float want = static_cast<float>(coeff / c.loss_scale);
      EXPECT_EQ(std::memcmp(&host[ops::kGradScale], &want, sizeof(float)), 0)
          << host[ops::kGradScale] << " vs " << want << " on " << GetParam();
    } else {
      EXPECT_FALSE(std::isfinite(got[0]));
      EXPECT_EQ(got[1], 1.0) << "found_inf on " << GetParam();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MultiTensor, ::testing::ValuesIn(devices_under_test()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == ':') ch = '_';
                           return name;
                         });

}  // namespace
