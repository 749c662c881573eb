// Every op of ops.h, forward and backward, on every backend this binary was built with,
// against the CPU backend: the idea of ggml's tests/test-backend-ops.cpp. Each case builds
// random inputs once, runs the op through ops.h on the CPU device and on the device under
// test (same inputs, uploaded), and compares every output. Gradient outputs start from
// random values on both sides, so a kernel that sets instead of accumulating (+=) fails.
//
// Each tolerance sits next to its case with the reason for its size. Where the two
// backends do the same float operations in the same order (copies, element-wise maps with
// the CPU's own formulas, the Philox masks, the optimizer updates built to round as
// written, sums laid out as the CPU lays them out) the tolerance is 0: bit-identical.
// Sums whose order differs between backends get a relative bound from their length.
//
// The backends: "strict" (the CPU kernels on host memory that refuses host access, which
// proves the kernels reach memory only through their backend) and every OpenCL device
// (opencl:N) and CUDA device (cuda:N) when that backend is built and a device is present.
// The CPU itself is the reference, so it is not a case.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "host_values.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

std::vector<std::string> backends_under_test() {
  std::vector<std::string> specs = {"strict"};
  for (const std::string& backend : device_backends()) {
    if (backend == "cpu") continue;
    for (int i = 0; i < device_count(backend); ++i) specs.push_back(backend + ":" + std::to_string(i));
  }
  return specs;
}

enum Side { kCpu = 0, kDev = 1 };

// One tensor on the CPU and the same contents on the device under test.
struct Twin {
  Buffer buffers[2];
  Tensor t[2];
  const Tensor& operator[](Side s) const { return t[s]; }
};

class BackendOps : public ::testing::TestWithParam<std::string> {
 protected:
  Device& device() { return open_device(GetParam()); }

  Twin& make(DType dtype, const Shape& shape, const void* host) {
    auto twin = std::make_unique<Twin>();
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    Device* devices[2] = {&cpu_device(), &device()};
    for (int s = 0; s < 2; ++s) {
      twin->buffers[s] = Buffer(*devices[s], bytes);
      twin->t[s] = tensor_at(twin->buffers[s], 0, dtype, shape);
      if (host != nullptr) copy_from_host(twin->t[s], host, bytes);
    }
    twins_.push_back(std::move(twin));
    return *twins_.back();
  }
  Twin& values(const Shape& shape, const std::vector<float>& v) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), shape_numel(shape));
    return make(DType::F32, shape, v.data());
  }
  Twin& ids(const Shape& shape, const std::vector<int32_t>& v) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), shape_numel(shape));
    return make(DType::I32, shape, v.data());
  }
  // N(mean, std) values; each call draws from its own stream.
  Twin& normal(const Shape& shape, float std = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, std);
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (float& x : v) x = dist(gen_);
    return values(shape, v);
  }
  Twin& zeros(const Shape& shape) { return make(DType::F32, shape, nullptr); }
  std::vector<int32_t> random_ids(int64_t n, int32_t limit) {
    std::uniform_int_distribution<int32_t> dist(0, limit - 1);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& x : v) x = dist(gen_);
    return v;
  }

  // Runs op on the CPU tensors, then on the device's.
  void run(const std::function<void(Side)>& op) {
    op(kCpu);
    op(kDev);
  }

  // The values of a floating tensor of any dtype, widened to f32 (exact).
  static std::vector<float> read(const Tensor& t) { return testing_support::host_values(t); }
  // N(mean, std) values stored in dtype (rounded on the host by core/dtype.h).
  Twin& normal_as(DType dtype, const Shape& shape, float std = 1.0f, float mean = 0.0f) {
    if (dtype == DType::F32) return normal(shape, std, mean);
    std::normal_distribution<float> dist(mean, std);
    std::vector<uint16_t> h(static_cast<size_t>(shape_numel(shape)));
    for (uint16_t& x : h) x = dtype == DType::BF16 ? f32_to_bf16(dist(gen_)) : f32_to_f16(dist(gen_));
    return make(dtype, shape, h.data());
  }
  // The device side gets the CPU side's bits (a saved state both backwards then start from).
  static void copy_cpu_to_device(const Twin& twin) {
    const std::vector<uint8_t> b = bytes_of(twin[kCpu]);
    copy_from_host(twin[kDev], b.data(), b.size());
  }
  static std::vector<uint8_t> bytes_of(const Tensor& t) {
    std::vector<uint8_t> v(t.bytes());
    copy_to_host(v.data(), v.size(), t);
    return v;
  }
  // The device's result has the CPU's bits exactly (any dtype).
  void expect_same_bits(const char* what, const Twin& twin) {
    EXPECT_EQ(bytes_of(twin[kCpu]), bytes_of(twin[kDev])) << what << " on " << GetParam();
  }
  // op throws an Error whose message contains `message`.
  static void expect_error(const std::function<void()>& op, const std::string& message) {
    try {
      op();
      ADD_FAILURE() << "no error; expected \"" << message << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // An I64 tensor holding doubles (ops.h).
  static std::vector<double> doubles(const Tensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    copy_to_host(v.data(), v.size() * sizeof(double), t);
    return v;
  }

  // |dev - cpu| <= abs_tol + rel_tol * |cpu| for every element (0, 0: the same bits;
  // inf and NaN must match in kind). Reports the worst element.
  void expect_close(const char* what, const Twin& twin, double rel_tol, double abs_tol = 0.0) {
    const std::vector<float> ref = read(twin[kCpu]), got = read(twin[kDev]);
    ASSERT_EQ(ref.size(), got.size());
    double worst = 0.0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float r = ref[i], g = got[i];
      if (std::isnan(r) || std::isinf(r)) {
        if (!(std::isnan(r) ? std::isnan(g) : g == r)) ++bad, worst_i = i;
        continue;
      }
      const double err = std::fabs(static_cast<double>(g) - r);
      const double excess = err - (abs_tol + rel_tol * std::fabs(r));
      if (excess > 0 || std::isnan(g)) {
        ++bad;
        if (excess > worst || std::isnan(g)) worst = excess, worst_i = i;
      }
    }
    EXPECT_EQ(bad, 0u) << what << " on " << GetParam() << ": " << bad << " of " << ref.size()
                       << " elements differ from the CPU beyond rel " << rel_tol << " abs " << abs_tol
                       << "; worst at " << worst_i << ": cpu " << ref[worst_i] << ", device " << got[worst_i];
  }

  std::mt19937 gen_{1234};
  std::vector<std::unique_ptr<Twin>> twins_;
};

// ---- embedding -----------------------------------------------------------------------

TEST_P(BackendOps, Embedding) {
  const int64_t B = 2, T = 5, C = 24, V = 11, P = 7;
  Twin& tokens = ids({B, T}, random_ids(B * T, V));
  Twin& positions = ids({B, T}, random_ids(B * T, P));
  Twin& wte = normal({V, C});
  Twin& wpe = normal({P, C});
  Twin& out = zeros({B, T, C});
  run([&](Side s) { ops::embedding_forward(out[s], tokens[s], positions[s], wte[s], wpe[s], 0, 0); });
  expect_close("out", out, 0);  // one add per element, the same on both
  Twin& dout = normal({B, T, C});
  Twin& dwte = normal({V, C});
  Twin& dwpe = normal({P, C});
  run([&](Side s) { ops::embedding_backward(dwte[s], dwpe[s], dout[s], tokens[s], positions[s], 0, 0); });
  // Both backends add each table row's contributions in row order n = 0, 1, ...
  expect_close("dwte", dwte, 0);
  expect_close("dwpe", dwpe, 0);
}

TEST_P(BackendOps, EmbeddingVocabShardAndAbsentTable) {
  const int64_t B = 2, T = 6, C = 16, V = 12, shard_start = 4, shard_rows = 5;
  Twin& tokens = ids({B, T}, random_ids(B * T, V));
  Twin& wte = normal({shard_rows, C});
  Twin& out = normal({B, T, C});
  run([&](Side s) { ops::embedding_forward(out[s], tokens[s], Tensor(), wte[s], Tensor(), shard_start, V); });
  expect_close("out (shard, no positions)", out, 0);
  Twin& dout = normal({B, T, C});
  Twin& dwte = normal({shard_rows, C});
  run([&](Side s) { ops::embedding_backward(dwte[s], Tensor(), dout[s], tokens[s], Tensor(), shard_start, V); });
  expect_close("dwte (shard)", dwte, 0);
}

// A device backend does not read ids back (ops.h: who checks the ids), so an out-of-range
// token or position must still stay in bounds: its term is left out. The device alone (the
// CPU and the strict device check the ids and throw).
TEST_P(BackendOps, EmbeddingOutOfRangeIdsStayInBounds) {
  if (device().backend().runs_declared_ops_only) GTEST_SKIP() << "the strict device runs the CPU's checks";
  const int64_t C = 8, V = 5, P = 4, N = 5;
  // Rows: both ids good; a token past the vocabulary; a negative token; a position past
  // wpe; a negative position.
  Twin& tokens = ids({1, N}, {2, V + 3, -1, 1, 4});
  Twin& positions = ids({1, N}, {0, 1, 2, P + 2, -7});
  Twin& wte = normal({V, C});
  Twin& wpe = normal({P, C});
  Twin& out = zeros({1, N, C});
  ops::embedding_forward(out[kDev], tokens[kDev], positions[kDev], wte[kDev], wpe[kDev], 0, 0);
  const std::vector<float> te = read(wte[kCpu]), pe = read(wpe[kCpu]), y = read(out[kDev]);
  const int token_row[N] = {2, -1, -1, 1, 4}, position_row[N] = {0, 1, 2, -1, -1};  // -1: left out
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const float want = (token_row[n] >= 0 ? te[token_row[n] * C + c] : 0.0f) +
                         (position_row[n] >= 0 ? pe[position_row[n] * C + c] : 0.0f);
      EXPECT_EQ(y[n * C + c], want) << "row " << n << ", channel " << c << " on " << GetParam();
    }
  Twin& dout = normal({1, N, C});
  Twin& dwte = zeros({V, C});
  Twin& dwpe = zeros({P, C});
  ops::embedding_backward(dwte[kDev], dwpe[kDev], dout[kDev], tokens[kDev], positions[kDev], 0, 0);
  const std::vector<float> g = read(dout[kCpu]), gte = read(dwte[kDev]), gpe = read(dwpe[kDev]);
  std::vector<float> want_te(static_cast<size_t>(V * C)), want_pe(static_cast<size_t>(P * C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      if (token_row[n] >= 0) want_te[token_row[n] * C + c] += g[n * C + c];
      if (position_row[n] >= 0) want_pe[position_row[n] * C + c] += g[n * C + c];
    }
  EXPECT_EQ(gte, want_te) << "dwte on " << GetParam();
  EXPECT_EQ(gpe, want_pe) << "dwpe on " << GetParam();
}

// ---- layernorm -----------------------------------------------------------------------

TEST_P(BackendOps, LayerNorm) {
  // C = 48: rows CUDA's native kernels read in 128-bit vectors; C = 50: element by element.
  for (const int64_t C : {48, 50}) {
    const int64_t N = 9;
    Twin& inp = normal({N, C}, 2.0f, 3.0f);
    Twin& weight = normal({C});
    Twin& bias = normal({C});
    Twin& out = zeros({N, C});
    Twin& mean = zeros({N});
    Twin& rstd = zeros({N});
    run([&](Side s) { ops::layernorm_forward(out[s], mean[s], rstd[s], inp[s], weight[s], bias[s], 1e-5f); });
    // The row sums run in a different order (the CPU's vector lanes, the device's one
    // loop): a few ulp on sums of 48 terms.
    expect_close("mean", mean, 1e-6, 1e-6);
    expect_close("rstd", rstd, 1e-5);
    expect_close("out", out, 1e-5, 1e-5);
    Twin& dout = normal({N, C});
    Twin& dinp = normal({N, C});
    Twin& dweight = normal({C});
    Twin& dbias = normal({C});
    run([&](Side s) {
      ops::layernorm_backward(dinp[s], dweight[s], dbias[s], dout[s], inp[s], weight[s], mean[s],
                              rstd[s]);
    });
    // The same row reductions as the forward; dweight/dbias sum rows in order on both.
    expect_close("dinp", dinp, 1e-5, 1e-5);
    expect_close("dweight", dweight, 1e-5, 1e-5);
    expect_close("dbias", dbias, 0);
  }
}

TEST_P(BackendOps, RmsNorm) {
  // C = 48: rows CUDA's native kernels read in 128-bit vectors; C = 50: element by element.
  for (const int64_t C : {48, 50}) {
    const int64_t N = 9;
    Twin& inp = normal({N, C}, 2.0f, 1.0f);
    Twin& weight = normal({C});
    Twin& out = zeros({N, C});
    Twin& rstd = zeros({N});
    run([&](Side s) { ops::rmsnorm_forward(out[s], rstd[s], inp[s], weight[s], 1e-5f); });
    // As LayerNorm: the row sums of squares run in another order (a few ulp of 48 terms).
    expect_close("rstd", rstd, 1e-5);
    expect_close("out", out, 1e-5, 1e-5);
    copy_cpu_to_device(rstd);
    Twin& dout = normal({N, C});
    Twin& dinp = normal({N, C});
    Twin& dweight = normal({C});
    run([&](Side s) { ops::rmsnorm_backward(dinp[s], dweight[s], dout[s], inp[s], weight[s], rstd[s]); });
    // One row reduction for dinp; dweight sums rows in order on both, its products may fuse
    // (FMA) differently.
    expect_close("dinp", dinp, 1e-5, 1e-5);
    expect_close("dweight", dweight, 1e-5, 1e-5);
    Twin& dinp_only = normal({N, C});
    run([&](Side s) { ops::rmsnorm_backward(dinp_only[s], Tensor(), dout[s], inp[s], weight[s], rstd[s]); });
    expect_close("dinp (dweight absent)", dinp_only, 1e-5, 1e-5);
  }
}

// ---- linear and bias -----------------------------------------------------------------

TEST_P(BackendOps, LinearF32) {
  const int64_t N = 6, C = 40, OC = 33;
  Twin& inp = normal({N, C});
  Twin& weight = normal({OC, C}, 0.3f);
  Twin& bias = normal({OC});
  Twin& out = zeros({N, OC});
  run([&](Side s) { ops::linear_forward(out[s], inp[s], weight[s], bias[s]); });
  expect_close("out", out, 1e-5, 1e-5);  // K = 40 products summed in another order
  Twin& dout = normal({N, OC});
  Twin& dinp = normal({N, C});
  Twin& dweight = normal({OC, C});
  Twin& dbias = normal({OC});
  run([&](Side s) { ops::linear_backward(dinp[s], dweight[s], dbias[s], dout[s], inp[s], weight[s]); });
  expect_close("dinp", dinp, 1e-5, 1e-5);        // K = OC = 33
  expect_close("dweight", dweight, 1e-5, 1e-5);  // K = N = 6
  expect_close("dbias", dbias, 0);                // column sums, rows in order on both
}

TEST_P(BackendOps, LinearF16OverflowIsInf) {
  // F16 tensors: a result beyond the half range is inf on every backend (the dynamic loss
  // scaler must see it), however the backend multiplies.
  const int64_t N = 2, C = 4, OC = 3;
  Twin& inp = make(DType::F16, {N, C}, std::vector<uint16_t>(N * C, f32_to_f16(200.0f)).data());
  Twin& weight = make(DType::F16, {OC, C}, std::vector<uint16_t>(OC * C, f32_to_f16(100.0f)).data());
  Twin& out = make(DType::F16, {N, OC}, nullptr);
  run([&](Side s) { ops::linear_forward(out[s], inp[s], weight[s], Tensor()); });
  expect_close("out (80000 -> inf)", out, 0);
  EXPECT_TRUE(std::isinf(read(out[kDev])[0]));
}

TEST_P(BackendOps, BiasAdd) {
  const int64_t N = 7, OC = 13;
  Twin& inp = normal({N, OC});
  Twin& bias = normal({OC});
  Twin& out = zeros({N, OC});
  run([&](Side s) { ops::bias_add_forward(out[s], inp[s], bias[s]); });
  expect_close("out", out, 0);
  run([&](Side s) { ops::bias_add_forward(inp[s], inp[s], bias[s]); });  // in place
  expect_close("out (in place)", inp, 0);
  Twin& dbias = normal({OC});
  run([&](Side s) { ops::bias_add_backward(dbias[s], out[s]); });
  expect_close("dbias", dbias, 0);
}

// More rows and columns than a CUDA kernel's block handles at once: the norms' row per
// block of 256 threads (ops/cuda/layernorm.cpp) striding over C = 300 columns, and the
// column sums (dbias, the norms' dweight and LayerNorm's dbias) in two passes over blocks
// of 64 rows (ops/cuda/column_sums.h), N = 200 rows: four blocks, the last one short.
TEST_P(BackendOps, RowsAndColumnsBeyondOneBlock) {
  const int64_t N = 200, C = 300;
  // CUDA adds each column's blocks of rows, then the blocks' partial sums: another order
  // than the CPU's rows one after the other, a few ulp of partial sums up to ~30 (N(0,1)
  // terms) per add. Elsewhere the rows add in order on both: exact.
  const bool blocked = GetParam().rfind("cuda", 0) == 0;
  const double sum_rel = blocked ? 1e-5 : 0.0, sum_abs = blocked ? 1e-4 : 0.0;
  Twin& inp = normal({N, C}, 2.0f, 3.0f);
  Twin& weight = normal({C});
  Twin& bias = normal({C});
  Twin& out = zeros({N, C});
  Twin& mean = zeros({N});
  Twin& rstd = zeros({N});
  run([&](Side s) { ops::layernorm_forward(out[s], mean[s], rstd[s], inp[s], weight[s], bias[s], 1e-5f); });
  expect_close("mean", mean, 1e-6, 1e-6);  // as LayerNorm: row sums (300 terms) in another order
  expect_close("rstd", rstd, 1e-5);
  expect_close("out", out, 1e-5, 1e-5);
  copy_cpu_to_device(mean);
  copy_cpu_to_device(rstd);
  Twin& dout = normal({N, C});
  Twin& dinp = normal({N, C});
  Twin& dweight = normal({C});
  Twin& dbias = normal({C});
  run([&](Side s) {
    ops::layernorm_backward(dinp[s], dweight[s], dbias[s], dout[s], inp[s], weight[s], mean[s], rstd[s]);
  });
  expect_close("dinp", dinp, 1e-5, 1e-5);
  expect_close("dweight", dweight, 1e-5, 1e-4);  // 200 products (FMA may differ), blocked on CUDA
  expect_close("dbias", dbias, sum_rel, sum_abs);
  Twin& rms_out = zeros({N, C});
  Twin& rms_rstd = zeros({N});
  run([&](Side s) { ops::rmsnorm_forward(rms_out[s], rms_rstd[s], inp[s], weight[s], 1e-5f); });
  expect_close("rmsnorm rstd", rms_rstd, 1e-5);  // as RmsNorm
  expect_close("rmsnorm out", rms_out, 1e-5, 1e-5);
  copy_cpu_to_device(rms_rstd);
  Twin& rms_dinp = normal({N, C});
  Twin& rms_dweight = normal({C});
  run([&](Side s) { ops::rmsnorm_backward(rms_dinp[s], rms_dweight[s], dout[s], inp[s], weight[s], rms_rstd[s]); });
  expect_close("rmsnorm dinp", rms_dinp, 1e-5, 1e-5);
  expect_close("rmsnorm dweight", rms_dweight, 1e-5, 1e-4);  // as dweight above
  Twin& bias_grad = normal({C});
  run([&](Side s) { ops::bias_add_backward(bias_grad[s], dout[s]); });
  expect_close("bias_add dbias", bias_grad, sum_rel, sum_abs);
  // A bf16 gradient: the f32 sum (as above) added and rounded once, so one bf16 ulp more.
  Twin& bias_grad16 = normal_as(DType::BF16, {C});
  run([&](Side s) { ops::bias_add_backward(bias_grad16[s], dout[s]); });
  expect_close("bias_add dbias (bf16)", bias_grad16, blocked ? sum_rel + 0x1p-7 : 0.0, sum_abs);
}

// ---- attention -----------------------------------------------------------------------

ops::Dropout dropout_of(float p, uint32_t site, uint64_t element_offset = 0) {
  ops::Dropout d;
  d.p = p;
  d.key = {.seed = 42, .iteration = 3, .site = site};
  d.sample0 = 5;
  d.element_offset = element_offset;
  return d;
}

TEST_P(BackendOps, Attention) {
  for (float p : {0.0f, 0.25f}) {
    SCOPED_TRACE("dropout " + std::to_string(p));
    const int64_t B = 2, T = 19, NH = 3, HD = 8;
    // Head offset 1 of 4: the shard's dropout elements start at element_offset.
    const ops::Dropout drop = dropout_of(p, 7, static_cast<uint64_t>(1 * T * T));
    Twin& qkv = normal({B, T, NH * 3 * HD});
    Twin& att = zeros({B, NH, T, T});
    Twin& out = zeros({B, T, NH * HD});
    run([&](Side s) { ops::attention_forward(out[s], att[s], qkv[s], drop); });
    // Dot products of HD = 8 and softmax sums of up to T = 19 terms in another order;
    // exp is the same polynomial on both. A few ulp.
    expect_close("att", att, 1e-5, 1e-7);
    expect_close("out", out, 1e-5, 1e-6);
    Twin& dout = normal({B, T, NH * HD});
    Twin& dqkv = normal({B, T, NH * 3 * HD});
    Twin& scratch = zeros({B, NH, T, T});
    run([&](Side s) { ops::attention_backward(dqkv[s], scratch[s], dout[s], qkv[s], att[s], drop); });
    // Chains of two such reductions (dp, then the weighted sums over T) into O(1) gradients.
    expect_close("dqkv", dqkv, 1e-4, 1e-5);
  }
}

// The grouped QKV layout with RoPE: GQA (R = 3) with half the channels rotated (rotary
// percent 0.5), one group, and GPT's layout (NG == NH, no rotation: a copy).
// And Llama 3.1's frequency scaling (ops.h RopeScaling) with a short original context, so
// that 9 positions turn every region of it by whole radians.
struct QkvCase {
  int64_t NG, NH, HD, dim;
  float base = 10000.0f;
  ops::RopeScaling scaling = {};
};
const QkvCase kQkvCases[] = {
    {2, 6, 8, 4}, {1, 4, 6, 6}, {3, 3, 8, 0}, {1, 2, 8, 8, 25.0f, {4.0f, 1.0f, 4.0f, 64.0f}}};

TEST_P(BackendOps, AttentionQkv) {
  for (const QkvCase& c : kQkvCases) {
    SCOPED_TRACE("NG " + std::to_string(c.NG) + " NH " + std::to_string(c.NH) + " rope dim " + std::to_string(c.dim));
    const int64_t B = 2, T = 9, R = c.NH / c.NG;
    const ops::Rope rope{c.dim, c.base, c.scaling};
    Twin& qkv = normal({B, T, c.NG * (R + 2) * c.HD});
    Twin& out = normal({B, T, c.NH * 3 * c.HD});
    run([&](Side s) { ops::attention_qkv_forward(out[s], qkv[s], c.NG, rope); });
    // The angles t * inv_freq (t < 9) from the device's pow, cos and sin (a few ulp of
    // OpenCL C's / CUDA's accuracy against the CPU's rounded double cos and sin), times
    // |x| ~ 3; the copies (v, unrotated channels, dim 0) are exact within that bound.
    const double tol = c.dim == 0 ? 0.0 : 1e-5;
    expect_close("out", out, tol, tol);
    Twin& dout = normal({B, T, c.NH * 3 * c.HD});
    Twin& dqkv = normal({B, T, c.NG * (R + 2) * c.HD});
    run([&](Side s) { ops::attention_qkv_backward(dqkv[s], dout[s], c.NG, rope); });
    // dk, dv add the group's R heads in head order on both backends: exact without
    // rotation, else the rotation's bound above over R terms.
    expect_close("dqkv", dqkv, tol, 2 * tol);
  }
}

// ---- element-wise --------------------------------------------------------------------

TEST_P(BackendOps, Gelu) {
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    SCOPED_TRACE(kind == ops::GeluKind::Tanh ? "tanh" : "erf");
    Twin& inp = normal({3, 50}, 3.0f);
    Twin& out = zeros({3, 50});
    run([&](Side s) { ops::gelu_forward(out[s], inp[s], kind); });
    // The same formulas and polynomial approximations; compilers may contract a*b+c into
    // FMAs differently (the CPU build allows it, OpenCL C's default too): a few ulp.
    expect_close("out", out, 1e-6, 1e-7);
    Twin& dout = normal({3, 50});
    Twin& dinp = normal({3, 50});
    run([&](Side s) { ops::gelu_backward(dinp[s], dout[s], inp[s], kind); });
    expect_close("dinp", dinp, 1e-6, 1e-6);
  }
}

TEST_P(BackendOps, Swiglu) {
  // F = 64: rows CUDA's native kernels read in 128-bit vectors; F = 50: element by element.
  for (const int64_t F : {50, 64}) {
    const int64_t N = 3;
    Twin& inp = normal({N, 2 * F}, 3.0f);
    Twin& out = zeros({N, F});
    run([&](Side s) { ops::swiglu_forward(out[s], inp[s]); });
    // The same formula, each backend's exp and FMA contraction (as GeLU): a few ulp.
    expect_close("out", out, 1e-6, 1e-7);
    Twin& dout = normal({N, F});
    Twin& dinp = normal({N, 2 * F});
    run([&](Side s) { ops::swiglu_backward(dinp[s], dout[s], inp[s]); });
    expect_close("dinp", dinp, 1e-6, 1e-6);
  }
}

TEST_P(BackendOps, Dropout) {
  // Odd sizes and an element offset that is not a multiple of 4, so samples and shards
  // start mid-way through a Philox group.
  const ops::Dropout drop = dropout_of(0.3f, 4, 6);
  Twin& inp = normal({3, 37});
  Twin& out = zeros({3, 37});
  run([&](Side s) { ops::dropout_forward(out[s], inp[s], drop); });
  // The same Philox bits decide the mask and x * 1/(1-p) rounds once: identical.
  expect_close("out", out, 0);
  run([&](Side s) { ops::dropout_forward(inp[s], inp[s], drop); });
  expect_close("out (in place)", inp, 0);
  Twin& dout = normal({3, 37});
  Twin& dinp = normal({3, 37});
  run([&](Side s) { ops::dropout_backward(dinp[s], dout[s], drop); });
  expect_close("dinp", dinp, 0);
  const ops::Dropout off = dropout_of(0.0f, 4);
  Twin& copy = zeros({3, 37});
  run([&](Side s) { ops::dropout_forward(copy[s], dout[s], off); });
  expect_close("out (p = 0)", copy, 0);
  run([&](Side s) { ops::dropout_backward(dinp[s], dout[s], off); });
  expect_close("dinp (p = 0)", dinp, 0);
}

// Dropout::iteration, the iteration as a device scalar: on each side (the CPU's kernels with a
// CPU scalar, the device's with its own), an op given key.iteration 3 and one given a scalar
// holding 3 (key.iteration 99, ignored) write the same bits, and a scalar holding 4 another
// mask: every kind of dropout launch (the plain kernels, the fused bias-dropout-add forward
// and backward, the unfused and the fused attention) reads the scalar.
TEST_P(BackendOps, DropoutIterationFromADeviceScalar) {
  const ops::Dropout by_key = dropout_of(0.3f, 4, 6);  // iteration 3
  Twin& three = ids({1}, {3});
  Twin& four = ids({1}, {4});
  const auto from = [&](const Twin& scalar, Side s) {
    ops::Dropout d = by_key;
    d.key.iteration = 99;
    d.iteration = scalar[s];
    return d;
  };
  // op(out, s, dropout) for the three dropouts; out's shape `shape`.
  const auto check = [&](const char* what, const Shape& shape,
                         const std::function<void(const Tensor&, Side, const ops::Dropout&)>& op) {
    Twin& want = zeros(shape);
    Twin& got = zeros(shape);
    Twin& other = zeros(shape);
    run([&](Side s) {
      op(want[s], s, by_key);
      op(got[s], s, from(three, s));
      op(other[s], s, from(four, s));
    });
    for (Side s : {kCpu, kDev}) {
      EXPECT_EQ(bytes_of(want[s]), bytes_of(got[s])) << what << (s == kCpu ? " on the CPU" : " on the device");
      EXPECT_NE(bytes_of(want[s]), bytes_of(other[s])) << what << ": a scalar of 4 left the mask of 3";
    }
  };
  Twin& inp = normal({3, 37});
  Twin& bias = normal({37});
  Twin& residual = normal({3, 37});
  check("dropout_forward", {3, 37}, [&](const Tensor& out, Side s, const ops::Dropout& d) {
    ops::dropout_forward(out, inp[s], d);
  });
  check("dropout_backward", {3, 37}, [&](const Tensor& out, Side s, const ops::Dropout& d) {
    ops::dropout_backward(out, inp[s], d, ops::GradWrite::Assign);
  });
  check("bias_dropout_add_forward", {3, 37}, [&](const Tensor& out, Side s, const ops::Dropout& d) {
    ops::bias_dropout_add_forward(out, inp[s], bias[s], residual[s], d);
  });
  check("bias_dropout_add_backward", {3, 37}, [&](const Tensor& out, Side s, const ops::Dropout& d) {
    ops::bias_dropout_add_backward(out, Tensor(), Tensor(), inp[s], d, ops::GradWrite::Assign);
  });
  const int64_t B = 2, T = 9, NH = 2, HD = 8;
  Twin& qkv = normal({B, T, NH * 3 * HD});
  Twin& att = zeros({B, NH, T, T});
  check("attention_forward", {B, T, NH * HD}, [&](const Tensor& out, Side s, const ops::Dropout& d) {
    ops::attention_forward(out, att[s], qkv[s], d);
  });
  if (!ops::supports(device(), ops::flash_attention_forward)) return;
  Twin& lse = zeros({B, NH, T});
  check("flash_attention_forward", {B, T, NH * HD}, [&](const Tensor& out, Side s, const ops::Dropout& d) {
    ops::flash_attention_forward(out, lse[s], qkv[s], Tensor(), NH, ops::Rope{}, d, ops::AttentionBlock{});
  });
}

TEST_P(BackendOps, Residual) {
  Twin& a = normal({4, 21});
  Twin& b = normal({4, 21});
  Twin& out = zeros({4, 21});
  run([&](Side s) { ops::residual_forward(out[s], a[s], b[s]); });
  expect_close("out", out, 0);
  Twin& dout = normal({4, 21});
  run([&](Side s) { ops::residual_backward(a[s], b[s], dout[s]); });
  expect_close("da", a, 0);
  expect_close("db", b, 0);
  run([&](Side s) { ops::residual_backward(Tensor(), b[s], dout[s]); });
  expect_close("db (da absent)", b, 0);
}

// ---- cross-entropy -------------------------------------------------------------------

TEST_P(BackendOps, CrossEntropy) {
  // V = 75: two full blocks of the 32 partial sums and a tail, a shard [50, 125) of 150, the
  // gradient element by element on CUDA's native kernel; V = 64: its 128-bit vectors.
  for (const int64_t V : {75, 64}) {
    const int64_t N = 6, vocab_start = 50, vocab_size = 150;
    Twin& logits = normal({N, V}, 3.0f);
    std::vector<int32_t> tgt = random_ids(N, static_cast<int32_t>(vocab_size));
    tgt[0] = 60;  // at least one target in the shard and one outside
    tgt[1] = 10;
    Twin& targets = ids({N}, tgt);
    Twin& row_max = zeros({N});
    Twin& sum_exp = zeros({N});
    Twin& target_logit = zeros({N});
    run([&](Side s) { ops::cross_entropy_max(row_max[s], logits[s]); });
    expect_close("row_max", row_max, 0);
    run([&](Side s) {
      ops::cross_entropy_sums(sum_exp[s], target_logit[s], logits[s], targets[s], row_max[s], vocab_start, vocab_size);
    });
    // The device sums into the CPU's 32 partials in the CPU's order; exp's polynomial may
    // contract into FMAs differently: an ulp or two per term.
    expect_close("sum_exp", sum_exp, 1e-6);
    expect_close("target_logit", target_logit, 0);
    Twin& losses = zeros({N});
    Twin& lse = zeros({N});
    run([&](Side s) { ops::cross_entropy_finish(losses[s], lse[s], sum_exp[s], row_max[s], target_logit[s]); });
    // OpenCL's log may be 3 ulp from glibc's correctly rounded one.
    expect_close("logsumexp", lse, 1e-6, 1e-6);
    expect_close("losses", losses, 1e-6, 1e-6);
    Twin& dlosses = normal({N});
    Twin& dlogits = normal({N, V});
    run([&](Side s) {
      ops::cross_entropy_backward(dlogits[s], dlosses[s], logits[s], targets[s], lse[s], vocab_start, vocab_size);
    });
    expect_close("dlogits", dlogits, 1e-5, 1e-6);  // exp of the same arguments, then one FMA
  }
}

// ---- sequence regrouping -------------------------------------------------------------

TEST_P(BackendOps, SequenceRegroup) {
  const int64_t B = 3, T = 8, C = 5;
  Twin& seq = normal({B, T, C});
  Twin& rank_major = zeros({4, B * T / 4, C});
  Twin& back = zeros({B, T, C});
  run([&](Side s) { ops::sequence_to_rank_major(rank_major[s], seq[s], 4); });
  expect_close("rank-major", rank_major, 0);  // copies
  run([&](Side s) { ops::rank_major_to_sequence(back[s], rank_major[s], 4); });
  expect_close("sequence", back, 0);
}

// ---- optimizers and reductions ---------------------------------------------------------

TEST_P(BackendOps, AdamW) {
  const int64_t n = 1000;
  Twin& param = normal({n});
  Twin& grad = normal({n}, 0.1f);
  Twin& m = normal({n}, 0.01f);
  Twin& v = zeros({n});
  for (int64_t step = 1; step <= 3; ++step)
    run([&](Side s) { ops::adamw_update(param[s], grad[s], m[s], v[s], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f); });
  // Written to round every operation as written on both (no FMA contraction, correctly
  // rounded division and sqrt), with the step's scalars computed once on the host: the
  // same bits.
  expect_close("param", param, 0);
  expect_close("m", m, 0);
  expect_close("v", v, 0);
}

TEST_P(BackendOps, Sgd) {
  const int64_t n = 777;
  Twin& param = normal({n});
  Twin& grad = normal({n}, 0.1f);
  Twin& buf = zeros({n});
  for (int64_t step = 1; step <= 3; ++step)
    run([&](Side s) { ops::sgd_update(param[s], grad[s], buf[s], 0.01f, 0.9f, 1e-4f, step, 2.0f); });
  expect_close("param (momentum)", param, 0);  // as for AdamW: the same bits
  expect_close("momentum buffer", buf, 0);
  run([&](Side s) { ops::sgd_update(param[s], grad[s], Tensor(), 0.01f, 0.0f, 1e-4f, 1, 1.0f); });
  expect_close("param (no momentum)", param, 0);
}

TEST_P(BackendOps, SumSquaresAndScale) {
  // Five chunks of 65536 (the CPU reads four side by side, then one alone) and a tail that
  // is not a multiple of 32, into slot 1 of three slots that start from values of their own
  // (the op adds).
  const int64_t n = 5 * 65536 + 1000 + 7;
  Twin& x = normal({n});
  const double start[3] = {0.5, 2.0, -1.0};
  Twin& sums = make(DType::I64, {3}, start);
  run([&](Side s) { ops::sum_squares(sums[s], 1, x[s]); });
  const std::vector<double> cpu = doubles(sums[kCpu]), dev = doubles(sums[kDev]);
  EXPECT_EQ(cpu, dev) << "the device sums the CPU's partial sums in the CPU's order, on " << GetParam();
  EXPECT_EQ(cpu[0], 0.5);
  EXPECT_EQ(cpu[2], -1.0);
  run([&](Side s) { ops::scale_inplace(x[s], 0.37f); });
  expect_close("scaled", x, 0);
}

TEST_P(BackendOps, MaskedLoss) {
  const int64_t N = 37;
  Twin& losses = normal({N}, 2.0f, 5.0f);
  std::vector<float> m(N);
  for (int64_t i = 0; i < N; ++i) m[i] = i % 3 == 2 ? 0.0f : 1.0f;
  Twin& mask = values({N}, m);
  const double start[2] = {1.25, 3.0};  // a previous micro-batch's sums: the op adds
  Twin& sums = make(DType::I64, {2}, start);
  run([&](Side s) { ops::masked_loss_sums(sums[s], losses[s], mask[s]); });
  // The same products summed in index order, in double: the same bits.
  EXPECT_EQ(doubles(sums[kCpu]), doubles(sums[kDev])) << GetParam();
  double loss_sum = 0.0, mask_sum = 0.0;
  const std::vector<float> l = read(losses[kCpu]);
  for (int64_t i = 0; i < N; ++i) loss_sum += static_cast<double>(l[i]) * m[i], mask_sum += m[i];
  EXPECT_EQ(doubles(sums[kCpu]), (std::vector<double>{1.25 + loss_sum, 3.0 + mask_sum}));

  Twin& dlosses = normal({N});  // accumulates
  run([&](Side s) { ops::masked_loss_backward(dlosses[s], mask[s], 0.125f); });
  expect_close("dlosses", dlosses, 0);  // one product and one add per element: the same bits
}

// Megatron's normal init from the shared Philox source: a shard of whole rows and a shard
// of columns, each equal to its slice of the full tensor drawn on the CPU.
TEST_P(BackendOps, InitNormalAndFill) {
  const int64_t rows = 6, cols = 10;
  Twin& full = zeros({rows, cols});
  run([&](Side s) { ops::init_normal(full[s], 0.02f, 1234, 7, {0, rows * cols, rows * cols}); });
  // Box-Muller in double through each device's log and cos, rounded to float: the same
  // bits unless a device's libm differs by an ulp of double at a rounding boundary.
  expect_close("full", full, 0);
  Twin& row_shard = zeros({2, cols});
  Twin& col_shard = zeros({rows, 4});
  run([&](Side s) {
    ops::init_normal(row_shard[s], 0.02f, 1234, 7, {3 * cols, 2 * cols, 2 * cols});
    ops::init_normal(col_shard[s], 0.02f, 1234, 7, {5, 4, cols});
  });
  expect_close("row shard", row_shard, 0);
  expect_close("column shard", col_shard, 0);
  const std::vector<float> f = read(full[kCpu]), r = read(row_shard[kDev]), c = read(col_shard[kDev]);
  for (int64_t i = 0; i < 2 * cols; ++i) EXPECT_EQ(r[i], f[3 * cols + i]) << "row shard element " << i;
  for (int64_t i = 0; i < rows * 4; ++i) EXPECT_EQ(c[i], f[(i / 4) * cols + 5 + i % 4]) << "column shard element " << i;

  Twin& x = normal({9});
  run([&](Side s) { ops::fill(x[s], 1.0f); });
  expect_close("filled", x, 0);
  EXPECT_EQ(read(x[kDev]), std::vector<float>(9, 1.0f));
}

// ---- convert ----------------------------------------------------------------------------

// Values that exercise every branch of the roundings: ties to even in both 16-bit formats,
// the half overflow threshold (65504 stays, 65520 and above are inf), half subnormals and
// the values that flush to zero, f32 subnormals, values near FLT_MAX (bfloat16 inf), inf,
// NaN; then random values over a wide range of scales.
std::vector<float> conversion_inputs(std::mt19937& gen) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 1.0f + 0x1p-11f,
                          1.0f + 0x3p-11f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 0x1p-14f, 0x1p-24f,
                          0x1.8p-24f, 0x1p-25f, 0x1.000002p-25f, 1e-30f, 1e-40f, 3.39e38f, -3.4028235e38f,
                          INFINITY, -INFINITY, NAN, -NAN};
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f), mantissa(-1.0f, 1.0f);
  while (v.size() < 1000) v.push_back(mantissa(gen) * std::exp2(exponent(gen)));
  return v;
}

// Every pair of float dtypes, against the CPU bit for bit, and the CPU's F32 -> 16-bit
// roundings against core/dtype.h's (bfloat16, and half through GCC's _Float16: a
// reference independent of the kernels).
TEST_P(BackendOps, Convert) {
  const std::vector<float> x = conversion_inputs(gen_);
  const int64_t n = static_cast<int64_t>(x.size());
  Twin& src = values({n}, x);
  const DType floats[3] = {DType::F32, DType::BF16, DType::F16};
  for (DType from : floats) {
    Twin& narrow = make(from, {n}, nullptr);
    run([&](Side s) { ops::convert(narrow[s], src[s]); });
    expect_same_bits(("F32 -> " + std::string(dtype_name(from))).c_str(), narrow);
    for (DType to : floats) {
      Twin& out = make(to, {n}, nullptr);
      run([&](Side s) { ops::convert(out[s], narrow[s]); });
      expect_same_bits((std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to))).c_str(), out);
    }
    if (from == DType::F32) continue;
    std::vector<uint16_t> got(static_cast<size_t>(n));
    copy_to_host(got.data(), got.size() * 2, narrow[kCpu]);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = from == DType::BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
      if (std::isnan(x[i]))  // NaN stays NaN (the quieted payload is the backends' choice)
        EXPECT_TRUE(from == DType::BF16 ? std::isnan(bf16_to_f32(got[i])) : std::isnan(f16_to_f32(got[i])));
      else
        EXPECT_EQ(got[i], want) << dtype_name(from) << " of " << x[i];
    }
  }
}

TEST_P(BackendOps, ConvertRejectsIntegerTensors) {
  Twin& f = normal({4});
  Twin& i = ids({4}, {1, 2, 3, 4});
  for (Side s : {kCpu, kDev}) expect_error([&] { ops::convert(i[s], f[s]); }, "convert: out has dtype i32");
}

// ---- 16-bit storage (ops.h; issue #19) ---------------------------------------------------
// The combinations the model runs with --bf16 / --fp16 (Megatron's Float16Module):
// activations and parameters in `act`, parameter gradients (the fp32 main grads) F32, every
// statistic F32. Each op runs on the same 16-bit inputs on both backends.
//
// Tolerances: both backends compute in f32 and round each stored result once. Where the
// F32 case of an op is exact (the same operations in the same order) the 16-bit case is
// exact too. Elsewhere the f32 results may differ within the F32 case's tolerance, and a
// difference that straddles a rounding boundary of the 16-bit format moves the stored
// value to the neighbouring one: one unit in the last place, `ulp` relative (bf16 keeps 8
// significant bits: 2^-7; f16 11: 2^-10), on top of the F32 tolerance. An f32 output from
// 16-bit inputs has the F32 case's tolerance.
struct Storage {
  DType act;
  double ulp;
};
std::vector<Storage> model_storages() { return {{DType::BF16, 0x1p-7}, {DType::F16, 0x1p-10}}; }
std::string storage_name(const Storage& st) { return "activations " + std::string(dtype_name(st.act)); }

TEST_P(BackendOps, Storage16Embedding) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    const int64_t B = 2, T = 5, C = 24, V = 11, P = 7;
    Twin& tokens = ids({B, T}, random_ids(B * T, V));
    Twin& positions = ids({B, T}, random_ids(B * T, P));
    Twin& wte = normal_as(st.act, {V, C});
    Twin& wpe = normal_as(st.act, {P, C});
    Twin& out = normal_as(st.act, {B, T, C});
    run([&](Side s) { ops::embedding_forward(out[s], tokens[s], positions[s], wte[s], wpe[s], 0, 0); });
    expect_close("out", out, 0);  // one f32 add, rounded once, on both
    Twin& dout = normal_as(st.act, {B, T, C});
    Twin& dwte = normal({V, C});  // the fp32 main grads
    Twin& dwpe = normal({P, C});
    run([&](Side s) { ops::embedding_backward(dwte[s], dwpe[s], dout[s], tokens[s], positions[s], 0, 0); });
    expect_close("dwte", dwte, 0);  // rows added in row order on both
    expect_close("dwpe", dwpe, 0);
    // A 16-bit table gradient: the rows of each element add up in f32 and round once.
    Twin& dwte16 = normal_as(st.act, {V, C});
    run([&](Side s) { ops::embedding_backward(dwte16[s], Tensor(), dout[s], tokens[s], Tensor(), 0, 0); });
    expect_close("dwte (16-bit)", dwte16, st.ulp);  // the CPU's chains per row vs rows in order
  }
}

TEST_P(BackendOps, Storage16LayerNorm) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    const int64_t N = 9, C = 48;
    Twin& inp = normal_as(st.act, {N, C}, 2.0f, 3.0f);
    Twin& weight = normal_as(st.act, {C});
    Twin& bias = normal_as(st.act, {C});
    Twin& out16 = normal_as(st.act, {N, C});
    Twin& mean = zeros({N});
    Twin& rstd = zeros({N});
    run([&](Side s) { ops::layernorm_forward(out16[s], mean[s], rstd[s], inp[s], weight[s], bias[s], 1e-5f); });
    expect_close("mean", mean, 1e-6, 1e-6);  // as LayerNorm (F32): sums in another order
    expect_close("rstd", rstd, 1e-5);
    expect_close("out", out16, 1e-5 + st.ulp, 1e-5);
    copy_cpu_to_device(mean);
    copy_cpu_to_device(rstd);
    Twin& dout = normal_as(st.act, {N, C});
    Twin& dinp = normal_as(st.act, {N, C});
    Twin& dweight = normal({C});
    Twin& dbias = normal({C});
    run([&](Side s) {
      ops::layernorm_backward(dinp[s], dweight[s], dbias[s], dout[s], inp[s], weight[s], mean[s], rstd[s]);
    });
    expect_close("dinp", dinp, 1e-5 + st.ulp, 1e-5);
    expect_close("dweight", dweight, 1e-5, 1e-5);
    expect_close("dbias", dbias, 0);  // rows in order on both
  }
}

TEST_P(BackendOps, Storage16Linear) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    const int64_t N = 6, C = 40, OC = 33;
    Twin& inp = normal_as(st.act, {N, C});
    Twin& weight = normal_as(st.act, {OC, C}, 0.3f);
    Twin& bias = normal_as(st.act, {OC});
    Twin& out = normal_as(st.act, {N, OC});
    run([&](Side s) { ops::linear_forward(out[s], inp[s], weight[s], bias[s]); });
    // The products of 16-bit values are exact in f32; K = 40 of them summed in another
    // order (as LinearF32), then one rounding.
    expect_close("out", out, 1e-5 + st.ulp, 1e-5);
    Twin& dout = normal_as(st.act, {N, OC});
    Twin& dinp = normal_as(st.act, {N, C});
    Twin& dweight = normal({OC, C});
    Twin& dbias = normal({OC});
    run([&](Side s) { ops::linear_backward(dinp[s], dweight[s], dbias[s], dout[s], inp[s], weight[s]); });
    expect_close("dinp", dinp, 1e-5 + st.ulp, 1e-5);
    expect_close("dweight", dweight, 1e-5, 1e-5);  // f32 main grad: as LinearF32
    expect_close("dbias", dbias, 0);                 // column sums, rows in order on both
    // 16-bit parameter gradients (ops.h allows them): added in f32, rounded once.
    Twin& dweight16 = normal_as(st.act, {OC, C});
    Twin& dbias16 = normal_as(st.act, {OC});
    run([&](Side s) { ops::linear_backward(Tensor(), dweight16[s], dbias16[s], dout[s], inp[s], weight[s]); });
    expect_close("dweight (16-bit)", dweight16, 1e-5 + st.ulp, 1e-5);
    expect_close("dbias (16-bit)", dbias16, 0);
  }
}

// Operand and output dtypes that differ within one call (ops.h allows any mix). On CUDA
// these take the other paths of ops/cuda/linear.cpp: operands of different dtypes widened
// to f32, a 16-bit output or gradient that cuBLASLt cannot write from f32 operands (or
// with an f32 bias) going through f32 scratch. Tolerances as Storage16Linear.
TEST_P(BackendOps, Storage16LinearMixedDtypes) {
  const Storage st = model_storages()[0];
  const int64_t N = 6, C = 40, OC = 33;
  for (DType inp_dtype : {DType::F32, st.act}) {
    SCOPED_TRACE("inp " + std::string(dtype_name(inp_dtype)));
    Twin& inp = normal_as(inp_dtype, {N, C});
    Twin& weight = normal_as(st.act, {OC, C}, 0.3f);
    Twin& bias = normal({OC});  // an f32 bias with a 16-bit output
    Twin& out = normal_as(st.act, {N, OC});
    run([&](Side s) { ops::linear_forward(out[s], inp[s], weight[s], bias[s]); });
    expect_close("out", out, 1e-5 + st.ulp, 1e-5);
    Twin& dout = normal_as(st.act, {N, OC});
    Twin& dinp = normal_as(st.act, {N, C});
    Twin& dweight = normal_as(st.act, {OC, C});
    run([&](Side s) { ops::linear_backward(dinp[s], dweight[s], Tensor(), dout[s], inp[s], weight[s]); });
    expect_close("dinp", dinp, 1e-5 + st.ulp, 1e-5);
    expect_close("dweight", dweight, 1e-5 + st.ulp, 1e-5);
  }
}

// The OpenCL backend converts the weight in tiles of rows (64 at least, about 4M elements
// each); C = 4096 makes tiles of 1024 rows, so OC = 1100 takes two, the second partial.
TEST_P(BackendOps, Storage16LinearTiled) {
  const Storage st = model_storages()[0];
  const int64_t N = 3, C = 4096, OC = 1100;
  Twin& inp = normal_as(st.act, {N, C});
  Twin& weight = normal_as(st.act, {OC, C}, 0.02f);
  Twin& out = normal_as(st.act, {N, OC});
  run([&](Side s) { ops::linear_forward(out[s], inp[s], weight[s], Tensor()); });
  // K = 4096 products summed in another order: the F32 tolerance grows with K.
  expect_close("out", out, 1e-4 + st.ulp, 1e-4);
  Twin& dout = normal_as(st.act, {N, OC});
  Twin& dinp = normal_as(st.act, {N, C});
  Twin& dweight = normal({OC, C});
  run([&](Side s) { ops::linear_backward(dinp[s], dweight[s], Tensor(), dout[s], inp[s], weight[s]); });
  expect_close("dinp (both tiles' products)", dinp, 1e-4 + st.ulp, 1e-4);
  expect_close("dweight", dweight, 1e-5, 1e-5);  // K = N = 3
}

TEST_P(BackendOps, Storage16Attention) {
  for (const Storage& st : model_storages()) {
    for (float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(storage_name(st) + ", dropout " + std::to_string(p));
      const int64_t B = 2, T = 19, NH = 3, HD = 8;
      const ops::Dropout drop = dropout_of(p, 7, static_cast<uint64_t>(1 * T * T));
      const ops::AttentionBuffers buffers = ops::attention_buffers(device(), B, NH, T, st.act);
      EXPECT_EQ(buffers.saved_dtype, st.act) << "the probabilities are saved in the activation dtype";
      Twin& qkv = normal_as(st.act, {B, T, NH * 3 * HD});
      Twin& att = normal_as(buffers.saved_dtype, buffers.saved);
      Twin& out = normal_as(st.act, {B, T, NH * HD});
      run([&](Side s) { ops::attention_forward(out[s], att[s], qkv[s], drop); });
      // As Attention (F32), then one rounding of each stored value.
      expect_close("att", att, 1e-5 + st.ulp, 1e-7);
      expect_close("out", out, 1e-5 + st.ulp, 1e-6);
      copy_cpu_to_device(att);  // both backwards start from the same saved probabilities
      Twin& dout = normal_as(st.act, {B, T, NH * HD});
      Twin& dqkv = normal_as(st.act, {B, T, NH * 3 * HD});
      Twin& scratch = zeros(buffers.scratch);
      run([&](Side s) { ops::attention_backward(dqkv[s], scratch[s], dout[s], qkv[s], att[s], drop); });
      expect_close("dqkv", dqkv, 1e-4 + st.ulp, 1e-5);
    }
  }
}

TEST_P(BackendOps, Storage16ElementWise) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    const int64_t B = 3, S = 37;
    Twin& a = normal_as(st.act, {B, S}, 3.0f);
    Twin& b = normal_as(st.act, {B, S});
    Twin& out = normal_as(st.act, {B, S});
    // The same f32 operations as the F32 cases, each result rounded once: exact where
    // those are (residual, dropout, bias), within the GeLU's few f32 ulps plus one 16-bit
    // ulp for the GeLU.
    run([&](Side s) { ops::residual_forward(out[s], a[s], b[s]); });
    expect_close("residual out", out, 0);
    Twin& da = normal_as(st.act, {B, S});
    run([&](Side s) { ops::residual_backward(da[s], Tensor(), b[s]); });
    expect_close("residual da", da, 0);
    for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
      run([&](Side s) { ops::gelu_forward(out[s], a[s], kind); });
      expect_close("gelu out", out, 1e-6 + st.ulp, 1e-7);
      Twin& dinp = normal_as(st.act, {B, S});
      run([&](Side s) { ops::gelu_backward(dinp[s], b[s], a[s], kind); });
      expect_close("gelu dinp", dinp, 1e-6 + st.ulp, 1e-6);
    }
    const ops::Dropout drop = dropout_of(0.3f, 4, 6);
    run([&](Side s) { ops::dropout_forward(out[s], a[s], drop); });
    expect_close("dropout out", out, 0);
    Twin& dinp = normal_as(st.act, {B, S});
    run([&](Side s) { ops::dropout_backward(dinp[s], b[s], drop); });
    expect_close("dropout dinp", dinp, 0);
    Twin& bias = normal_as(st.act, {S});
    run([&](Side s) { ops::bias_add_forward(out[s], a[s], bias[s]); });
    expect_close("bias_add out", out, 0);
    Twin& dbias = normal({S});
    run([&](Side s) { ops::bias_add_backward(dbias[s], out[s]); });
    expect_close("bias_add dbias (f32)", dbias, 0);
    run([&](Side s) { ops::scale_inplace(a[s], 0.37f); });
    expect_close("scaled", a, 0);
    run([&](Side s) { ops::fill(b[s], 0.1f); });
    expect_close("filled", b, 0);
    Twin& w = normal_as(st.act, {6, 10});
    run([&](Side s) { ops::init_normal(w[s], 0.02f, 1234, 7, {0, 60, 60}); });
    expect_close("init_normal", w, 0);  // the same f32 draw, rounded once
    Twin& seq = normal_as(st.act, {B, 8, 5});
    Twin& rm16 = normal_as(st.act, {4, B * 2, 5});
    run([&](Side s) { ops::sequence_to_rank_major(rm16[s], seq[s], 4); });
    expect_close("rank-major", rm16, 0);  // copies
  }
}

// The Llama family's ops: RMSNorm as LayerNorm, SwiGLU as GeLU, the QKV layout as its F32
// case, each plus one 16-bit ulp where the F32 case is not exact.
TEST_P(BackendOps, Storage16LlamaOps) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    const int64_t N = 9, C = 48;
    Twin& inp = normal_as(st.act, {N, C}, 2.0f, 1.0f);
    Twin& weight = normal_as(st.act, {C});
    Twin& out = normal_as(st.act, {N, C});
    Twin& rstd = zeros({N});
    run([&](Side s) { ops::rmsnorm_forward(out[s], rstd[s], inp[s], weight[s], 1e-5f); });
    expect_close("rmsnorm rstd", rstd, 1e-5);
    expect_close("rmsnorm out", out, 1e-5 + st.ulp, 1e-5);
    copy_cpu_to_device(rstd);
    Twin& dout = normal_as(st.act, {N, C});
    Twin& dinp = normal_as(st.act, {N, C});
    Twin& dweight = normal({C});  // the fp32 main grad
    run([&](Side s) { ops::rmsnorm_backward(dinp[s], dweight[s], dout[s], inp[s], weight[s], rstd[s]); });
    expect_close("rmsnorm dinp", dinp, 1e-5 + st.ulp, 1e-5);
    expect_close("rmsnorm dweight", dweight, 1e-5, 1e-5);

    Twin& glu_in = normal_as(st.act, {N, 2 * C}, 3.0f);
    Twin& glu_out = normal_as(st.act, {N, C});
    run([&](Side s) { ops::swiglu_forward(glu_out[s], glu_in[s]); });
    expect_close("swiglu out", glu_out, 1e-6 + st.ulp, 1e-7);
    Twin& glu_din = normal_as(st.act, {N, 2 * C});
    run([&](Side s) { ops::swiglu_backward(glu_din[s], dout[s], glu_in[s]); });
    expect_close("swiglu dinp", glu_din, 1e-6 + st.ulp, 1e-6);

    for (const QkvCase& c : kQkvCases) {
      SCOPED_TRACE("NG " + std::to_string(c.NG) + " rope dim " + std::to_string(c.dim));
      const int64_t B = 2, T = 9, R = c.NH / c.NG;
      const ops::Rope rope{c.dim, c.base, c.scaling};
      Twin& qkv = normal_as(st.act, {B, T, c.NG * (R + 2) * c.HD});
      Twin& per_head = normal_as(st.act, {B, T, c.NH * 3 * c.HD});
      run([&](Side s) { ops::attention_qkv_forward(per_head[s], qkv[s], c.NG, rope); });
      const double tol = c.dim == 0 ? 0.0 : 1e-5;
      expect_close("qkv out", per_head, tol == 0 ? 0 : tol + st.ulp, tol);
      Twin& dqkv = normal_as(st.act, {B, T, c.NG * (R + 2) * c.HD});
      run([&](Side s) { ops::attention_qkv_backward(dqkv[s], per_head[s], c.NG, rope); });
      expect_close("dqkv", dqkv, tol == 0 ? 0 : tol + st.ulp, 2 * tol);
    }
  }
}

TEST_P(BackendOps, Storage16CrossEntropy) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    const int64_t N = 6, V = 75, vocab_start = 50, vocab_size = 150;
    Twin& logits = normal_as(st.act, {N, V}, 3.0f);
    std::vector<int32_t> tgt = random_ids(N, static_cast<int32_t>(vocab_size));
    tgt[0] = 60;
    tgt[1] = 10;
    Twin& targets = ids({N}, tgt);
    Twin& row_max = zeros({N});
    Twin& sum_exp = zeros({N});
    Twin& target_logit = zeros({N});
    Twin& losses = zeros({N});
    Twin& lse = zeros({N});
    run([&](Side s) {
      ops::cross_entropy_max(row_max[s], logits[s]);
      ops::cross_entropy_sums(sum_exp[s], target_logit[s], logits[s], targets[s], row_max[s], vocab_start,
                              vocab_size);
      ops::cross_entropy_finish(losses[s], lse[s], sum_exp[s], row_max[s], target_logit[s]);
    });
    // The f32 statistics of the widened logits: as CrossEntropy (F32).
    expect_close("row_max", row_max, 0);
    expect_close("sum_exp", sum_exp, 1e-6);
    expect_close("target_logit", target_logit, 0);
    expect_close("losses", losses, 1e-6, 1e-6);
    copy_cpu_to_device(lse);
    Twin& dlosses = normal({N});
    Twin& dlogits = normal_as(st.act, {N, V});
    run([&](Side s) {
      ops::cross_entropy_backward(dlogits[s], dlosses[s], logits[s], targets[s], lse[s], vocab_start, vocab_size);
    });
    expect_close("dlogits", dlogits, 1e-5 + st.ulp, 1e-6);
  }
}

TEST_P(BackendOps, Storage16OptimizerAndNorm) {
  for (const Storage& st : model_storages()) {
    SCOPED_TRACE(storage_name(st));
    // fp32 main params and Adam state; a 16-bit gradient is widened as it is read.
    const int64_t n = 1000;
    Twin& param = normal({n});
    Twin& grad = normal_as(st.act, {n}, 0.1f);
    Twin& m = normal({n}, 0.01f);
    Twin& v = zeros({n});
    for (int64_t step = 1; step <= 2; ++step)
      run([&](Side s) {
        ops::adamw_update(param[s], grad[s], m[s], v[s], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
      });
    expect_close("param", param, 0);  // as AdamW: the same bits
    expect_close("m", m, 0);
    expect_close("v", v, 0);
    Twin& buf = zeros({n});
    run([&](Side s) { ops::sgd_update(param[s], grad[s], buf[s], 0.01f, 0.9f, 1e-4f, 1, 1.0f); });
    expect_close("param (sgd)", param, 0);
    // The 16-bit parameters are the main params converted (convert is tested bit for bit).
    Twin& p16 = normal_as(st.act, {n});
    run([&](Side s) { ops::convert(p16[s], param[s]); });
    expect_same_bits("param -> 16-bit copy", p16);
    const double start[1] = {0.5};
    Twin& sums = make(DType::I64, {1}, start);
    run([&](Side s) { ops::sum_squares(sums[s], 0, grad[s]); });
    EXPECT_EQ(doubles(sums[kCpu]), doubles(sums[kDev])) << "squares of the widened values, the CPU's order";
  }
}

TEST_P(BackendOps, Storage16DtypeErrorsNameOpArgumentAndDtype) {
  Twin& x = normal_as(DType::BF16, {4, 8});
  Twin& w = normal_as(DType::BF16, {8});
  Twin& out = normal_as(DType::BF16, {4, 8});
  Twin& mean16 = normal_as(DType::BF16, {4});
  Twin& rstd = zeros({4});
  Twin& tok = ids({4, 8}, std::vector<int32_t>(32, 1));
  for (Side s : {kCpu, kDev}) {
    SCOPED_TRACE(s == kCpu ? "cpu" : GetParam());
    expect_error([&] { ops::layernorm_forward(out[s], mean16[s], rstd[s], x[s], w[s], Tensor(), 1e-5f); },
                 "layernorm_forward: mean has dtype bf16; it must be f32");
    expect_error([&] { ops::residual_forward(out[s], x[s], tok[s]); }, "has dtype i32");
    expect_error([&] { ops::adamw_update(w[s], w[s], w[s], w[s], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 1, 1.0f); },
                 "param has dtype bf16; it must be f32");
  }
}

// The backend sizes attention's saved state; the kernels above run on what it asks for.
TEST_P(BackendOps, AttentionBuffers) {
  const ops::AttentionBuffers b = ops::attention_buffers(device(), 2, 3, 5, DType::F32);
  EXPECT_FALSE(b.saved.empty());
  EXPECT_EQ(b.saved[0], 2);
  EXPECT_EQ(b.saved[1], 3);
  EXPECT_EQ(b.scratch.empty() ? 2 : b.scratch[0], 2);
}

// The harness itself: a device result one ulp off in one element fails a tolerance-0
// comparison (so the exact cases above can fail).
TEST_P(BackendOps, HarnessDetectsDifferences) {
  Twin& x = normal({5});
  std::vector<float> host = read(x[kDev]);
  host[3] = std::nextafter(host[3], 10.0f);
  copy_from_host(x[kDev], host.data(), host.size() * sizeof(float));
  EXPECT_NONFATAL_FAILURE(expect_close("x", x, 0), "1 of 5 elements differ");
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name)
    if (c == ':') c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOps, ::testing::ValuesIn(backends_under_test()), test_name);

// ---- contract properties, on every backend (the CPU included) ---------------------------
// What ops.h promises about layouts holds on each backend by itself: a tensor-parallel or
// sequence-parallel shard computes, bit for bit, its slice of the unsharded result on the
// same backend, and grad_scale is a prior scale_inplace. (Moved here from ops_test.cpp,
// which keeps the CPU kernels' checks against formulas and finite differences.)

class OpContract : public ::testing::TestWithParam<std::string> {
 protected:
  Device& device() { return open_device(GetParam()); }
  Tensor upload(DType dtype, const Shape& shape, const void* host) {
    buffers_.emplace_back(device(), std::max<size_t>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), 1));
    Tensor t = tensor_at(buffers_.back(), 0, dtype, shape);
    if (host) copy_from_host(t, host, t.bytes());
    return t;
  }
  Tensor f32(const Shape& shape, const std::vector<float>& v) { return upload(DType::F32, shape, v.data()); }
  Tensor zeros(const Shape& shape) { return upload(DType::F32, shape, nullptr); }
  Tensor ids(const Shape& shape, const std::vector<int32_t>& v) { return upload(DType::I32, shape, v.data()); }
  std::vector<float> normal_values(int64_t n, float std = 1.0f) {
    std::normal_distribution<float> dist(0.0f, std);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(gen_);
    return v;
  }
  Tensor normal(const Shape& shape, float std = 1.0f) { return f32(shape, normal_values(shape_numel(shape), std)); }
  static std::vector<float> read(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    copy_to_host(v.data(), v.size() * sizeof(float), t);
    return v;
  }

  std::mt19937 gen_{99};
  std::vector<Buffer> buffers_;
};

std::vector<std::string> all_backends() {
  std::vector<std::string> specs = backends_under_test();
  specs.insert(specs.begin(), "cpu");
  return specs;
}

TEST_P(OpContract, EmbeddingVocabShardsSumToFullEmbedding) {
  // Two tensor-parallel ranks hold wte rows [0, 3) and [3, 7); rank 0 also adds wpe. The
  // sum of their outputs (the all-reduce) is the unsharded embedding bit for bit: for each
  // row exactly one rank contributes the token row, so the sum is a+b either way. Tokens
  // sit on both sides of the boundary (2, 3) and at the ends (0, 6).
  const int64_t B = 2, T = 4, C = 5, V = 7, P = 4, split = 3;
  const Tensor tokens = ids({B, T}, {2, 3, 0, 6, 3, 3, 5, 2});
  const Tensor positions = ids({B, T}, {0, 1, 2, 3, 0, 1, 2, 3});
  const std::vector<float> wte_v = normal_values(V * C);
  const Tensor wte = f32({V, C}, wte_v), wpe = normal({P, C});
  const Tensor full = zeros({B, T, C});
  ops::embedding_forward(full, tokens, positions, wte, wpe, 0, 0);
  const Tensor shard_w[2] = {f32({split, C}, std::vector<float>(wte_v.begin(), wte_v.begin() + split * C)),
                             f32({V - split, C}, std::vector<float>(wte_v.begin() + split * C, wte_v.end()))};
  const int64_t start[2] = {0, split};
  const Tensor part[2] = {normal({B, T, C}), normal({B, T, C})};  // garbage: must be overwritten
  for (int r = 0; r < 2; ++r)
    ops::embedding_forward(part[r], tokens, positions, shard_w[r], r == 0 ? wpe : Tensor(), start[r], V);
  const Tensor sum = zeros({B, T, C});
  ops::residual_forward(sum, part[0], part[1]);
  EXPECT_EQ(read(sum), read(full));
  // Backward: each shard's gradient gets exactly its rows of the unsharded gradient (the
  // same rows added in the same order from the same start).
  const Tensor R = normal({B, T, C});
  const std::vector<float> prefill = normal_values(V * C);
  const Tensor dfull = f32({V, C}, prefill);
  ops::embedding_backward(dfull, Tensor(), R, tokens, positions, 0, 0);
  const std::vector<float> full_grad = read(dfull);
  for (int r = 0; r < 2; ++r) {
    const int64_t rows = r == 0 ? split : V - split;
    const Tensor dshard =
        f32({rows, C}, std::vector<float>(prefill.begin() + start[r] * C, prefill.begin() + (start[r] + rows) * C));
    ops::embedding_backward(dshard, Tensor(), R, tokens, positions, start[r], V);
    EXPECT_EQ(read(dshard), std::vector<float>(full_grad.begin() + start[r] * C,
                                               full_grad.begin() + (start[r] + rows) * C))
        << "shard " << r;
  }
}

TEST_P(OpContract, AttentionHeadShardMatchesFullComputation) {
  // A tensor-parallel rank holding heads [2, 4) of 4 computes exactly that slice of the
  // full result, dropout included, when element_offset places its heads: 2 * T * T.
  const int64_t B = 2, T = 5, NH = 4, HD = 3, h0 = 2, NHs = 2;
  const std::vector<float> qkv_v = normal_values(B * T * NH * 3 * HD);
  const Tensor qkv = f32({B, T, NH * 3 * HD}, qkv_v), out = zeros({B, T, NH * HD}), att = zeros({B, NH, T, T});
  ops::Dropout d;
  d.p = 0.4f;
  d.key = {.seed = 7, .iteration = 2, .site = 3};
  d.sample0 = 4;
  ops::attention_forward(out, att, qkv, d);
  std::vector<float> shard_v;
  for (int64_t bt = 0; bt < B * T; ++bt)
    shard_v.insert(shard_v.end(), qkv_v.begin() + bt * NH * 3 * HD + h0 * 3 * HD,
                   qkv_v.begin() + bt * NH * 3 * HD + (h0 + NHs) * 3 * HD);
  const Tensor qkv_s = f32({B, T, NHs * 3 * HD}, shard_v), out_s = zeros({B, T, NHs * HD}),
               att_s = zeros({B, NHs, T, T});
  ops::Dropout ds = d;
  ds.element_offset = static_cast<uint64_t>(h0 * T * T);
  ops::attention_forward(out_s, att_s, qkv_s, ds);
  const std::vector<float> full_out = read(out), full_att = read(att), got_out = read(out_s), got_att = read(att_s);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t i = 0; i < NHs * HD; ++i)
      ASSERT_EQ(got_out[bt * NHs * HD + i], full_out[bt * NH * HD + h0 * HD + i]) << "row " << bt << " col " << i;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < NHs * T * T; ++i)
      ASSERT_EQ(got_att[b * NHs * T * T + i], full_att[(b * NH + h0) * T * T + i]) << "sample " << b;
  // And the shard must differ from the unshifted draw (else element_offset is ignored).
  const Tensor out_wrong = zeros({B, T, NHs * HD});
  ops::attention_forward(out_wrong, att_s, qkv_s, d);
  EXPECT_NE(read(out_wrong), got_out);
}

TEST_P(OpContract, AttentionQkvGroupShardMatchesFullComputation) {
  // Tensor parallelism splits the query groups (Megatron's QKV layout, rows by group): a
  // rank holding groups [1, 3) of 3 computes exactly heads [2, 6) of the full result, and
  // its dqkv is exactly those groups' slice of the full gradient.
  const int64_t B = 2, T = 5, NG = 3, R = 2, HD = 6, g0 = 1, NGs = 2;
  const ops::Rope rope{4, 10000.0f};
  const int64_t in_row = NG * (R + 2) * HD, out_row = NG * R * 3 * HD;
  const int64_t in_shard = NGs * (R + 2) * HD, out_shard = NGs * R * 3 * HD;
  // Rows [b*T+t] of `full` (width `row`), columns [first, first + width).
  auto columns = [&](const std::vector<float>& full, int64_t row, int64_t first, int64_t width) {
    std::vector<float> v;
    for (int64_t bt = 0; bt < B * T; ++bt)
      v.insert(v.end(), full.begin() + bt * row + first, full.begin() + bt * row + first + width);
    return v;
  };
  const std::vector<float> qkv_v = normal_values(B * T * in_row), dout_v = normal_values(B * T * out_row),
                           prefill = normal_values(B * T * in_row);
  const Tensor qkv = f32({B, T, in_row}, qkv_v), out = zeros({B, T, out_row});
  const Tensor dqkv = f32({B, T, in_row}, prefill);
  ops::attention_qkv_forward(out, qkv, NG, rope);
  ops::attention_qkv_backward(dqkv, f32({B, T, out_row}, dout_v), NG, rope);
  const Tensor qkv_s = f32({B, T, in_shard}, columns(qkv_v, in_row, g0 * (R + 2) * HD, in_shard));
  const Tensor out_s = zeros({B, T, out_shard});
  const Tensor dqkv_s = f32({B, T, in_shard}, columns(prefill, in_row, g0 * (R + 2) * HD, in_shard));
  ops::attention_qkv_forward(out_s, qkv_s, NGs, rope);
  ops::attention_qkv_backward(dqkv_s, f32({B, T, out_shard}, columns(dout_v, out_row, g0 * R * 3 * HD, out_shard)),
                              NGs, rope);
  EXPECT_EQ(read(out_s), columns(read(out), out_row, g0 * R * 3 * HD, out_shard));
  EXPECT_EQ(read(dqkv_s), columns(read(dqkv), in_row, g0 * (R + 2) * HD, in_shard));
}

TEST_P(OpContract, DropoutShardsDrawTheFullTensorsMask) {
  // A sequence-parallel rank holding rows [r0, r0+Rs) of each sample's [R, C] tensor, and a
  // data-parallel rank holding samples [1, 3) of the batch, both reproduce their slice of
  // the full computation bit for bit. C = 5 so the shard starts mid Philox group.
  const int64_t B = 3, R = 8, C = 5, r0 = 3, Rs = 4;
  const std::vector<float> x_v = normal_values(B * R * C);
  const Tensor x = f32({B, R, C}, x_v), y = zeros({B, R, C});
  ops::Dropout d;
  d.p = 0.5f;
  d.key = {.seed = 11, .iteration = 5, .site = 1};
  ops::dropout_forward(y, x, d);
  const std::vector<float> full = read(y);
  std::vector<float> xs_v, want;
  for (int64_t b = 0; b < B; ++b) {
    xs_v.insert(xs_v.end(), x_v.begin() + (b * R + r0) * C, x_v.begin() + (b * R + r0 + Rs) * C);
    want.insert(want.end(), full.begin() + (b * R + r0) * C, full.begin() + (b * R + r0 + Rs) * C);
  }
  const Tensor xs = f32({B, Rs, C}, xs_v), ys = zeros({B, Rs, C});
  ops::Dropout ds = d;
  ds.element_offset = static_cast<uint64_t>(r0 * C);
  ops::dropout_forward(ys, xs, ds);
  EXPECT_EQ(read(ys), want);
  const Tensor yb = zeros({2, R, C});
  ops::Dropout db = d;
  db.sample0 += 1;
  ops::dropout_forward(yb, x.slice_rows(1, 2), db);
  EXPECT_EQ(read(yb), std::vector<float>(full.begin() + R * C, full.end()));
}

TEST_P(OpContract, GradScaleEqualsScalingTheGradientFirst) {
  // Clipping folded into the update must give the bits of clipping first.
  const int64_t n = 1000;
  const float coeff = 0.37f;
  const std::vector<float> g_v = normal_values(n), p_v = normal_values(n), m_v = normal_values(n),
                           b_v = normal_values(n);
  std::vector<float> v_v = normal_values(n);
  for (float& v : v_v) v = std::fabs(v);
  const Tensor g = f32({n}, g_v), g_scaled = f32({n}, g_v);
  ops::scale_inplace(g_scaled, coeff);
  const Tensor p1 = f32({n}, p_v), p2 = f32({n}, p_v), p3 = f32({n}, p_v), p4 = f32({n}, p_v);
  const Tensor m1 = f32({n}, m_v), m2 = f32({n}, m_v), v1 = f32({n}, v_v), v2 = f32({n}, v_v);
  const Tensor b3 = f32({n}, b_v), b4 = f32({n}, b_v);
  ops::adamw_update(p1, g_scaled, m1, v1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f);
  ops::adamw_update(p2, g, m2, v2, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, coeff);
  ops::sgd_update(p3, g_scaled, b3, 0.1f, 0.9f, 0.01f, 2, 1.0f);
  ops::sgd_update(p4, g, b4, 0.1f, 0.9f, 0.01f, 2, coeff);
  EXPECT_EQ(read(p1), read(p2));
  EXPECT_EQ(read(m1), read(m2));
  EXPECT_EQ(read(v1), read(v2));
  EXPECT_EQ(read(p3), read(p4));
  EXPECT_EQ(read(b3), read(b4));
  EXPECT_EQ(read(g), g_v) << "the gradient itself is left alone";
}

INSTANTIATE_TEST_SUITE_P(Backends, OpContract, ::testing::ValuesIn(all_backends()), test_name);

}  // namespace
