// The per-element arithmetic of CUDA's native kernels (ops/cuda/element_math.h), compiled here
// by the host compiler, against the CPU kernels it must agree with: AdamW's step gives
// adamw_update's bits, dropout_factor gives dropout_forward's mask bit for bit, gelu_grad is
// within backend_ops_test's bound of gelu_backward (1e-6 relative to 1 + |value|), and
// swiglu_value / swiglu_grads and cross_entropy_grad within its bounds of swiglu_forward /
// swiglu_backward and cross_entropy_backward. The work items of the native attention_qkv (RoPE)
// and embedding-backward kernels (rope_math.h, embedding_math.h) run here over every item
// (CudaIndexMath): the embedding's sorted runs give embedding_backward's bits (the op is
// Exact), the qkv items attention_qkv_forward's and _backward's values within a few f32 ulp
// (OrderFree: the CPU may contract the rotation differently); what this proves is their
// indexing (groups, partial rotation, odd head dims, k and v summed over heads in order).
// (The kernels' launch geometry and reductions need a GPU: cuda.backend_ops and
// cuda.train_parity run them.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/cuda/element_math.h"
#include "tessera/ops/cuda/embedding_math.h"
#include "tessera/ops/cuda/rope_math.h"
#include "tessera/ops/ops.h"

using namespace tessera;
using tessera::ops::cuda::native::AdamwStep;
using tessera::ops::cuda::native::DropoutArgs;
namespace native = tessera::ops::cuda::native;

namespace {

std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor host_tensor(std::vector<float>& v) {
  return Tensor(v.data(), DType::F32, {static_cast<int64_t>(v.size())}, &cpu_device());
}

Tensor host(void* p, DType d, Shape s) { return Tensor(p, d, std::move(s), &cpu_device()); }

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

}  // namespace

TEST(CudaElementMath, AdamwStepGivesAdamwUpdatesBits) {
  const size_t n = 4096;
  const float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.37f;
  for (int64_t step : {1, 2, 7, 1000}) {
    std::vector<float> p = random_values(n, 1.0f, 1), g = random_values(n, 0.1f, 2);
    std::vector<float> m = random_values(n, 0.01f, 3), v = random_values(n, 0.001f, 4);
    for (float& x : v) x = std::fabs(x);
    std::vector<float> p2 = p, m2 = m, v2 = v;
    ops::adamw_update(host_tensor(p), host_tensor(g), host_tensor(m), host_tensor(v), lr, beta1, beta2, eps, wd, step,
                      grad_scale);
    float s[ops::kGradScale];
    ops::step_scalars(s, lr, wd, 1.0, beta1, beta2, step);
    // The host constants, as optimizer_updates.cpp passes them.
    const float w1 = static_cast<float>(1.0 - static_cast<double>(beta1));
    const AdamwStep adamw{s[ops::kAdamDecay], grad_scale, w1, 1.0f - w1, beta2,
                          static_cast<float>(1.0 - static_cast<double>(beta2)), s[ops::kAdamStepSize],
                          s[ops::kAdamBc2Sqrt], eps, w1 < 0.5f};
    for (size_t i = 0; i < n; ++i) {
      const float pi = adamw(p2[i], m2[i], v2[i], g[i]);
      ASSERT_EQ(bits(pi), bits(p[i])) << "step " << step << " element " << i;
      ASSERT_EQ(bits(m2[i]), bits(m[i])) << "step " << step << " element " << i;
      ASSERT_EQ(bits(v2[i]), bits(v[i])) << "step " << step << " element " << i;
    }
  }
}

TEST(CudaElementMath, DropoutFactorIsDropoutForwardsMask) {
  const int64_t B = 3, S = 1001;  // odd sizes: lanes of Philox groups cross samples and the offset
  std::vector<float> ones(static_cast<size_t>(B * S), 1.0f), out(ones.size());
  ops::Dropout dropout;
  dropout.p = 0.3f;
  dropout.key = {1234u, 17u, 5u};
  dropout.sample0 = 40;
  dropout.element_offset = 6;
  const Shape shape = {B, S};
  ops::dropout_forward(Tensor(out.data(), DType::F32, shape, &cpu_device()),
                       Tensor(ones.data(), DType::F32, shape, &cpu_device()), dropout);
  const DropoutArgs d{dropout.p,        1.0f / (1.0f - dropout.p), dropout.key.seed, dropout.key.site,
                      dropout.key.iteration, dropout.sample0,       dropout.element_offset, S};
  // The iteration read from a device scalar instead (Dropout::iteration): the same mask.
  const uint32_t iteration = dropout.key.iteration;
  DropoutArgs from_scalar = d;
  from_scalar.iteration = 0;
  from_scalar.iteration_at = &iteration;
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < S; ++e) {
      const float f = ops::cuda::native::dropout_factor(d, b, static_cast<uint64_t>(e));
      ASSERT_EQ(bits(f), bits(out[static_cast<size_t>(b * S + e)])) << "sample " << b << " element " << e;
      ASSERT_EQ(bits(ops::cuda::native::dropout_factor(from_scalar, b, static_cast<uint64_t>(e))), bits(f));
      dropped += f == 0.0f;
    }
  EXPECT_GT(dropped, B * S / 5);  // the mask drops about p of the elements
  EXPECT_LT(dropped, B * S * 2 / 5);
}

TEST(CudaElementMath, GeluGradWithinTheBackendBoundOfGeluBackward) {
  std::vector<float> x = random_values(4096, 3.0f, 9), ones(x.size(), 1.0f), grad(x.size());
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    ops::gelu_backward(host_tensor(grad), host_tensor(ones), host_tensor(x), kind, ops::GradWrite::Assign);
    for (size_t i = 0; i < x.size(); ++i) {
      const float got = ops::cuda::native::gelu_grad(x[i], kind == ops::GeluKind::Erf);
      // backend_ops_test's bound for gelu_backward across backends (other exp, other order).
      EXPECT_NEAR(got, grad[i], 1e-6f * (1.0f + std::fabs(grad[i]))) << "x " << x[i];
    }
  }
}

TEST(CudaElementMath, SwigluWithinTheBackendBoundsOfTheCpuOp) {
  const size_t N = 8, F = 512;
  std::vector<float> inp = random_values(N * 2 * F, 3.0f, 11), dout = random_values(N * F, 1.0f, 12);
  std::vector<float> out(N * F), dinp(N * 2 * F);
  const Tensor in_t(inp.data(), DType::F32, {int64_t{N}, int64_t{2 * F}}, &cpu_device());
  const Tensor dinp_t(dinp.data(), DType::F32, {int64_t{N}, int64_t{2 * F}}, &cpu_device());
  const Tensor out_t(out.data(), DType::F32, {int64_t{N}, int64_t{F}}, &cpu_device());
  const Tensor dout_t(dout.data(), DType::F32, {int64_t{N}, int64_t{F}}, &cpu_device());
  ops::swiglu_forward(out_t, in_t);
  ops::swiglu_backward(dinp_t, dout_t, in_t, ops::GradWrite::Assign);
  for (size_t n = 0; n < N; ++n)
    for (size_t f = 0; f < F; ++f) {
      const float gate = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f], dy = dout[n * F + f];
      const float want = out[n * F + f], want_dgate = dinp[n * 2 * F + f], want_dup = dinp[n * 2 * F + F + f];
      // backend_ops_test's bounds for swiglu across backends (other exp, other contraction).
      EXPECT_NEAR(ops::cuda::native::swiglu_value(gate, up), want, 1e-7f + 1e-6f * std::fabs(want)) << "gate " << gate;
      const ops::cuda::native::SwigluGrads g = ops::cuda::native::swiglu_grads(gate, up, dy);
      EXPECT_NEAR(g.dgate, want_dgate, 1e-6f + 1e-6f * std::fabs(want_dgate)) << "gate " << gate;
      EXPECT_NEAR(g.dup, want_dup, 1e-6f + 1e-6f * std::fabs(want_dup)) << "gate " << gate;
    }
}

TEST(CudaElementMath, CrossEntropyGradWithinTheBackendBoundOfTheCpuOp) {
  const int64_t N = 4, V = 300;
  std::vector<float> logits = random_values(static_cast<size_t>(N * V), 3.0f, 13), dlosses = random_values(N, 1.0f, 14);
  std::vector<float> lse(N), dlogits(logits.size());
  std::vector<int32_t> targets = {0, 17, 299, 150};
  for (int64_t n = 0; n < N; ++n) {  // logsumexp in double
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[static_cast<size_t>(n * V + v)]));
    lse[static_cast<size_t>(n)] = static_cast<float>(std::log(sum));
  }
  const auto t = [&](void* p, DType d, Shape s) { return Tensor(p, d, s, &cpu_device()); };
  ops::cross_entropy_backward(t(dlogits.data(), DType::F32, {N, V}), t(dlosses.data(), DType::F32, {N}),
                              t(logits.data(), DType::F32, {N, V}), t(targets.data(), DType::I32, {N}),
                              t(lse.data(), DType::F32, {N}), 0, V, ops::GradWrite::Assign);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(n * V + v);
      const float got = ops::cuda::native::cross_entropy_grad(logits[i], lse[static_cast<size_t>(n)],
                                                              dlosses[static_cast<size_t>(n)], v == targets[n]);
      // backend_ops_test's bound for cross_entropy_backward (exp of the same arguments).
      EXPECT_NEAR(got, dlogits[i], 1e-6f + 1e-5f * std::fabs(dlogits[i])) << "row " << n << " column " << v;
    }
}

namespace {

struct Load {
  const float* p;
  float operator()(int64_t i) const { return p[i]; }
};
struct Store {
  float* p;
  void operator()(int64_t i, float v) const { p[i] = v; }
};

struct QkvCase {
  int64_t B, T, NG, R, HD, rope_dim;
  float scaling;  // Llama 3.1's factor, 0: none
};

native::RopeFreqs freqs_of(const ops::Rope& rope) {
  native::RopeFreqs f{};
  for (int64_t i = 0; i < rope.dim / 2; ++i) f.inv_freq[i] = ops::rope_inv_freq(rope, i);
  return f;
}

// Every item of a launch, as rope_kernels.cu enumerates them.
template <typename Item>
void for_each_qkv_item(const native::QkvShape& s, int64_t rows, Item item) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t g = 0; g < s.NG; ++g)
      for (int64_t slot = 0; slot < s.R + 2; ++slot)
        for (int64_t j = 0; j < s.pairs(); ++j) item(row, g, slot, j);
}

// A few f32 ulp of the CPU's value: both rotate the same f32 inputs by the same cos and sin;
// the CPU may fuse a multiply-add the items do not (or the other way).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 4e-7f * (1.0f + std::fabs(want[i]))) << what << " element " << i;
}

}  // namespace

TEST(CudaIndexMath, QkvItemsMatchTheCpuOpForwardAndBackward) {
  // GPT's layout (R = 1, no rope), Llama's (groups of several heads, full rotation, scaled),
  // a partial rotation (rotary percent) and an odd head dim with plain channels past the pairs.
  for (const QkvCase c : {QkvCase{2, 5, 3, 1, 8, 0, 0.0f}, QkvCase{1, 9, 2, 3, 16, 16, 8.0f},
                          QkvCase{2, 7, 2, 2, 10, 6, 0.0f}, QkvCase{1, 6, 1, 2, 7, 4, 0.0f}}) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " NG " + std::to_string(c.NG) + " R " +
                 std::to_string(c.R) + " HD " + std::to_string(c.HD) + " rope " + std::to_string(c.rope_dim));
    ops::Rope rope;
    rope.dim = c.rope_dim;
    rope.base = 500.0f;  // large angles at small T
    rope.scaling.factor = c.scaling;
    rope.scaling.original_max_positions = 16.0f;
    const native::QkvShape s{c.T, c.NG, c.R, c.HD, c.rope_dim / 2};
    const int64_t rows = c.B * c.T;
    std::vector<float> qkv = random_values(static_cast<size_t>(rows * s.grouped_row()), 1.0f, 1);
    std::vector<float> want(static_cast<size_t>(rows * s.per_head_row())), got(want.size(), NAN);
    ops::attention_qkv_forward(host(want.data(), DType::F32, {c.B, c.T, s.per_head_row()}),
                               host(qkv.data(), DType::F32, {c.B, c.T, s.grouped_row()}), c.NG, rope);
    const native::RopeFreqs f = freqs_of(rope);
    for_each_qkv_item(s, rows, [&](int64_t row, int64_t g, int64_t slot, int64_t j) {
      native::qkv_forward_item(s, f.inv_freq, row, g, slot, j, Load{qkv.data()}, Store{got.data()});
    });
    expect_close(got, want, "forward");  // NaN where an item missed an element

    // The backward accumulates onto a filled dqkv.
    const std::vector<float> dout = random_values(want.size(), 1.0f, 2), dqkv0 = random_values(qkv.size(), 1.0f, 3);
    std::vector<float> dwant = dqkv0, dgot = dqkv0;
    ops::attention_qkv_backward(host(dwant.data(), DType::F32, {c.B, c.T, s.grouped_row()}),
                                host(const_cast<float*>(dout.data()), DType::F32, {c.B, c.T, s.per_head_row()}),
                                c.NG, rope);
    for_each_qkv_item(s, rows, [&](int64_t row, int64_t g, int64_t slot, int64_t j) {
      native::qkv_backward_item(s, f.inv_freq, row, g, slot, j, Load{dout.data()}, Load{dgot.data()},
                                Store{dgot.data()});
    });
    expect_close(dgot, dwant, "backward");
  }
}

TEST(CudaIndexMath, RopeCosSinAreTheCpuTablesBits) {
  // rope_table's steps: the f32 angle, double cos and sin rounded once.
  ops::Rope rope;
  rope.dim = 64;
  for (int64_t t : {0, 1, 17, 1023, 4095})
    for (int64_t i = 0; i < 32; ++i) {
      const float f = ops::rope_inv_freq(rope, i);
      const double theta = static_cast<float>(t) * f;
      const native::CosSin cs = native::rope_cos_sin(t, f);
      ASSERT_EQ(bits(cs.cos), bits(static_cast<float>(std::cos(theta)))) << "t " << t << " i " << i;
      ASSERT_EQ(bits(cs.sin), bits(static_cast<float>(std::sin(theta)))) << "t " << t << " i " << i;
    }
}

namespace {

// embedding_table_backward on the host: keys, a stable sort (CUB's radix sort is stable), every
// (sorted index, channel) item. table and dout are f32 arrays standing for any storage: load
// and store round through `round` (bf16 or none) as the kernel's typed access does.
template <typename Round>
void embedding_items(std::vector<float>& table, int64_t rows, const std::vector<float>& dout, int64_t C,
                     const std::vector<int32_t>& ids, int64_t start, Round round) {
  const int64_t N = static_cast<int64_t>(ids.size());
  std::vector<uint32_t> keys(ids.size());
  std::vector<int32_t> order(ids.size());
  for (int64_t n = 0; n < N; ++n) keys[n] = native::embedding_key(ids[n], start, rows);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
  std::vector<uint32_t> sorted(ids.size());
  for (int64_t i = 0; i < N; ++i) sorted[i] = keys[order[i]];
  const auto load = [&](int64_t i) { return table[i]; };
  const auto store = [&](int64_t i, float v) { table[i] = round(v); };
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c)
      native::run_sum_item(sorted.data(), order.data(), N, rows, C, i, c, load, store, Load{dout.data()});
}

}  // namespace

TEST(CudaIndexMath, EmbeddingRunsGiveTheCpuBackwardsBits) {
  const int64_t B = 3, T = 40, N = B * T, C = 24, V = 64, P = 48;
  const int64_t shard_start = 16, shard_rows = 20;  // a vocabulary shard: most tokens are elsewhere
  std::mt19937 gen(7);
  std::vector<int32_t> tokens(N), positions(N);
  for (int64_t n = 0; n < N; ++n) {
    tokens[n] = static_cast<int32_t>(gen() % 28 + 10);  // repeats, both sides of the shard
    positions[n] = static_cast<int32_t>(n % T);
  }
  const std::vector<float> dout = random_values(static_cast<size_t>(N * C), 1.0f, 8);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 tables" : "f32 tables");
    std::vector<float> wte = random_values(static_cast<size_t>(shard_rows * C), 0.1f, 9);
    std::vector<float> wpe = random_values(static_cast<size_t>(P * C), 0.1f, 10);
    const auto round = [bf16](float x) { return bf16 ? ops::cpu::round_bf16(x) : x; };
    for (float& x : wte) x = round(x);
    for (float& x : wpe) x = round(x);
    // The CPU op on the tables in their dtype.
    const DType dt = bf16 ? DType::BF16 : DType::F32;
    std::vector<uint16_t> wte16(wte.size()), wpe16(wpe.size());
    for (size_t i = 0; i < wte.size(); ++i) wte16[i] = ops::cpu::bf16_bits(wte[i]);
    for (size_t i = 0; i < wpe.size(); ++i) wpe16[i] = ops::cpu::bf16_bits(wpe[i]);
    const std::vector<float> wte_before = wte;
    std::vector<float> wte_want = wte, wpe_want = wpe;
    ops::embedding_backward(host(bf16 ? static_cast<void*>(wte16.data()) : wte_want.data(), dt, {shard_rows, C}),
                            host(bf16 ? static_cast<void*>(wpe16.data()) : wpe_want.data(), dt, {P, C}),
                            host(const_cast<float*>(dout.data()), DType::F32, {B, T, C}),
                            host(tokens.data(), DType::I32, {B, T}), host(positions.data(), DType::I32, {B, T}),
                            shard_start, V);
    if (bf16) {
      for (size_t i = 0; i < wte.size(); ++i) wte_want[i] = bf16_to_f32(wte16[i]);
      for (size_t i = 0; i < wpe.size(); ++i) wpe_want[i] = bf16_to_f32(wpe16[i]);
    }
    embedding_items(wte, shard_rows, dout, C, tokens, shard_start, round);
    embedding_items(wpe, P, dout, C, positions, 0, round);
    int64_t changed = 0;
    for (size_t i = 0; i < wte.size(); ++i) {
      ASSERT_EQ(bits(wte[i]), bits(wte_want[i])) << "wte element " << i;
      changed += wte[i] != wte_before[i];
    }
    EXPECT_GT(changed, 0);  // the shard got rows
    for (size_t i = 0; i < wpe.size(); ++i) ASSERT_EQ(bits(wpe[i]), bits(wpe_want[i])) << "wpe element " << i;
  }
}

TEST(CudaIndexMath, EmbeddingKeyBitsCoverTheSentinel) {
  for (int64_t rows : {1, 2, 3, 4, 50257, 50304, 65535, 65536, 128256}) {
    const int bits = native::embedding_key_bits(rows);
    EXPECT_GT(int64_t{1} << bits, rows) << rows;  // the sentinel `rows` sorts after every row
    EXPECT_LE(int64_t{1} << (bits - 1), rows) << rows;
  }
}
