// The ops on 16-bit storage (ops.h: any float tensor may be F32, BF16 or F16; ops compute in
// f32 and round each stored result once) on the CPU backend.
//
// Every case runs an op twice: on 16-bit tensors, and on F32 tensors holding their widened
// values (the reference: the F32 path, itself checked against formulas and finite
// differences in ops_test.cpp). Each 16-bit output must equal the reference output rounded
// once to its dtype. Unless a case says otherwise the tolerance is ZERO: the CPU kernels
// run the same f32 operations in the same order on the widened values, so rounding the
// result is the only difference; a kernel that rounded twice (an accumulation rounded
// before the add, an intermediate stored in 16 bits) or read a 16-bit tensor as f32 fails.
// Gradient outputs are pre-filled with random values, so a kernel that sets instead of
// accumulating, or rounds the old value separately, fails too. The parameter gradients
// the model keeps in fp32 (Megatron's main grads) are F32 in the "model mix" cases.
// No finite differences here: a 16-bit forward is a step function at the scale of its
// rounding, and the exact equality with the F32 backward (finite-difference checked in
// ops_test.cpp) is the stronger statement.
// Then the dtype errors (ops.h: an Error naming the op, the argument and the dtype).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

// ---------------------------------------------------------------------------------------
// Helpers

uint16_t to_bits(float x, DType d) { return d == DType::BF16 ? ops::cpu::bf16_bits(x) : ops::cpu::fp16_bits(x); }
float from_bits(uint16_t h, DType d) { return d == DType::BF16 ? bf16_to_f32(h) : ops::cpu::fp16_to_f32(h); }

// A tensor of the dtype under test (`lo`) and the F32 reference holding its widened values
// (`ref`). An F32 pair holds two identical F32 tensors.
struct Pair {
  Tensor lo, ref;
};

class Arena {
 public:
  Tensor make(DType type, Shape s) {
    Tensor t(nullptr, type, std::move(s), &cpu_device());
    buffers_.emplace_back(cpu_device(), std::max<size_t>(t.bytes(), 1));
    t.handle = buffers_.back().handle();
    return t;
  }
  // Normal(mean, std) values representable in `type`.
  Pair normal(DType type, Shape s, uint32_t seed, float std = 1.0f, float mean = 0.0f) {
    Pair p{make(type, s), make(DType::F32, s)};
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(mean, std);
    for (int64_t i = 0; i < p.ref.numel(); ++i) {
      const float x = dist(gen);
      if (type == DType::F32) {
        p.lo.f32()[i] = p.ref.f32()[i] = x;
      } else {
        const uint16_t h = to_bits(x, type);
        p.lo.host<uint16_t>()[i] = h;
        p.ref.f32()[i] = from_bits(h, type);
      }
    }
    return p;
  }
  Pair zeros(DType type, Shape s) {
    Pair p{make(type, s), make(DType::F32, s)};
    std::memset(p.lo.host<void>(), 0, p.lo.bytes());
    std::memset(p.ref.host<void>(), 0, p.ref.bytes());
    return p;
  }
  Tensor ints(Shape s, const std::vector<int32_t>& v) {
    Tensor t = make(DType::I32, std::move(s));
    EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
    std::memcpy(t.host<void>(), v.data(), v.size() * sizeof(int32_t));
    return t;
  }
  Tensor doubles(int64_t n) {
    Tensor t = make(DType::I64, {n});
    std::memset(t.host<void>(), 0, t.bytes());
    return t;
  }

 private:
  std::vector<Buffer> buffers_;
};

// Every element of p.lo is p.ref rounded once to p.lo's dtype, within `ulps` units in the
// last place of that dtype (bit patterns compared as ordered integers); an F32 p.lo
// within f32_tol * max |p.ref| (0: bit-equal).
void expect_rounded(const Pair& p, const char* what, int ulps = 0, double f32_tol = 0.0) {
  double max_abs = 0.0;
  for (int64_t i = 0; i < p.ref.numel(); ++i) max_abs = std::max(max_abs, std::fabs(double{p.ref.f32()[i]}));
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < p.ref.numel(); ++i) {
    const float r = p.ref.f32()[i];
    bool ok;
    if (p.lo.dtype == DType::F32) {
      const float got = p.lo.f32()[i];
      ok = f32_tol == 0.0 ? std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(r)
                          : std::fabs(double{got} - r) <= f32_tol * max_abs;
    } else {
      const auto ordered = [](uint16_t h) { return (h & 0x8000) ? -int64_t{h & 0x7FFF} : int64_t{h}; };
      ok = std::llabs(ordered(p.lo.host<uint16_t>()[i]) - ordered(to_bits(r, p.lo.dtype))) <= ulps;
    }
    if (!ok && first < 0) first = i;
    bad += !ok;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << p.ref.numel() << " elements differ, first at " << first
                    << " (reference " << (first >= 0 ? p.ref.f32()[first] : 0.0f) << ")";
}

// After a checked op, the reference takes the 16-bit values (widened), so that the next op
// of a chain starts from the same inputs on both sides.
void settle(const Pair& p) {
  if (p.lo.dtype == DType::F32) return;
  for (int64_t i = 0; i < p.ref.numel(); ++i) p.ref.f32()[i] = from_bits(p.lo.host<uint16_t>()[i], p.lo.dtype);
}

// The dtypes under test: activations and parameters in `act`; parameter gradients in `grad`
// (F32 for the model's mix, `act` for the all-16-bit case).
struct Dtypes {
  DType act, grad;
};
std::string name(const testing::TestParamInfo<Dtypes>& info) {
  return std::string(dtype_name(info.param.act)) + "_grads_" + std::string(dtype_name(info.param.grad));
}

class StorageOps : public testing::TestWithParam<Dtypes> {
 protected:
  DType act() const { return GetParam().act; }
  DType grad() const { return GetParam().grad; }
  Arena arena;
};

INSTANTIATE_TEST_SUITE_P(Dtypes, StorageOps,
                         testing::Values(Dtypes{DType::BF16, DType::F32}, Dtypes{DType::F16, DType::F32},
                                         Dtypes{DType::BF16, DType::BF16}, Dtypes{DType::F16, DType::F16}),
                         name);

// ---------------------------------------------------------------------------------------
// Element-wise ops

TEST_P(StorageOps, Gelu) {
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    const Pair x = arena.normal(act(), {3, 70}, 1, 2.0f), y = arena.zeros(act(), {3, 70});
    const Pair dy = arena.normal(act(), {3, 70}, 2), dx = arena.normal(act(), {3, 70}, 3);
    for (bool lo : {true, false}) {
      const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
      ops::gelu_forward(t(y), t(x), kind);
      ops::gelu_backward(t(dx), t(dy), t(x), kind);
    }
    expect_rounded(y, "gelu out");
    expect_rounded(dx, "gelu dinp");
  }
}

TEST_P(StorageOps, ResidualAndDropout) {
  // More elements than one staging chunk (storage.h kChunkElements = 16384).
  const Shape s{2, 9000};
  const Pair a = arena.normal(act(), s, 1), b = arena.normal(act(), s, 2), out = arena.zeros(act(), s);
  const Pair dout = arena.normal(act(), s, 3), da = arena.normal(act(), s, 4), db = arena.normal(act(), s, 5);
  const Pair dropped = arena.zeros(act(), s), ddrop = arena.normal(act(), s, 6);
  ops::Dropout drop{.p = 0.25f, .key = {7, 1, 2}};
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::residual_forward(t(out), t(a), t(b));
    ops::residual_backward(t(da), t(db), t(dout));
  }
  expect_rounded(out, "residual out");
  settle(out);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::dropout_forward(t(dropped), t(out), drop);
    ops::dropout_backward(t(ddrop), t(dout), drop);
  }
  expect_rounded(ddrop, "dropout dinp");
  settle(ddrop);
  for (bool lo : {true, false}) ops::dropout_backward(lo ? ddrop.lo : ddrop.ref, lo ? dout.lo : dout.ref, {});  // p = 0
  expect_rounded(da, "residual da");
  expect_rounded(db, "residual db");
  expect_rounded(dropped, "dropout out");
  expect_rounded(ddrop, "dropout dinp, p = 0");
}

TEST_P(StorageOps, InitFillAndScale) {
  const Pair w = arena.zeros(act(), {5, 40}), f = arena.zeros(act(), {33});
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::init_normal(t(w), 0.02f, 1234, 7, {.first = 40, .cols = 40, .full_cols = 40});
    ops::fill(t(f), 0.1f);  // 0.1 is not representable: the fill must round it once
  }
  expect_rounded(w, "init_normal");
  expect_rounded(f, "fill");
  settle(w);
  // scale_inplace rounds x * s once (0.3 is no power of two, so most products round).
  for (bool lo : {true, false}) ops::scale_inplace(lo ? w.lo : w.ref, 0.3f);
  expect_rounded(w, "scale_inplace");
}

TEST_P(StorageOps, SumSquares) {
  // Over two 65536-element chunks: the sums of the widened values in double are equal.
  const Pair x = arena.normal(act(), {70000}, 1);
  Tensor lo = arena.doubles(2), ref = arena.doubles(2);
  ops::sum_squares(lo, 1, x.lo);
  ops::sum_squares(ref, 1, x.ref);
  EXPECT_EQ(lo.host<double>()[1], ref.host<double>()[1]);
  EXPECT_GT(lo.host<double>()[1], 60000.0);
}

TEST_P(StorageOps, OptimizerUpdatesTakeAnyGradient) {
  // param, m, v stay f32; the gradient is `grad()` (or the activations' dtype when that is
  // F32: a bf16/f16 gradient is what an unfused model would hand over).
  const DType g_type = grad() == DType::F32 ? act() : grad();
  const Pair g = arena.normal(g_type, {3000}, 1);
  for (bool adamw : {true, false}) {
    const Pair p = arena.normal(DType::F32, {3000}, 2), m = arena.normal(DType::F32, {3000}, 3, 0.1f);
    const Pair v = arena.normal(DType::F32, {3000}, 4, 0.1f, 1.0f);
    for (bool lo : {true, false}) {
      const auto& t = [lo](const Pair& x) { return lo ? x.lo : x.ref; };
      if (adamw)
        ops::adamw_update(t(p), t(g), t(m), t(v), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
      else
        ops::sgd_update(t(p), t(g), t(m), 0.1f, 0.9f, 0.01f, 2, 0.5f);
    }
    expect_rounded(p, adamw ? "adamw param" : "sgd param");
    expect_rounded(m, adamw ? "adamw m" : "sgd momentum");
    if (adamw) expect_rounded(v, "adamw v");
  }
}

// ---------------------------------------------------------------------------------------
// Layers

TEST_P(StorageOps, LayerNorm) {
  const int64_t N = 7, C = 100;  // C not a multiple of the backward's 64-channel blocks
  const Pair x = arena.normal(act(), {N, C}, 1, 2.0f, 3.0f), w = arena.normal(act(), {C}, 2, 0.5f, 1.0f);
  const Pair b = arena.normal(act(), {C}, 3), y = arena.zeros(act(), {N, C});
  const Pair mean = arena.zeros(DType::F32, {N}), rstd = arena.zeros(DType::F32, {N});
  const Pair dy = arena.normal(act(), {N, C}, 4), dx = arena.normal(act(), {N, C}, 5);
  const Pair dw = arena.normal(grad(), {C}, 6), db = arena.normal(grad(), {C}, 7);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::layernorm_forward(t(y), t(mean), t(rstd), t(x), t(w), t(b), 1e-5f);
    ops::layernorm_backward(t(dx), t(dw), t(db), t(dy), t(x), t(w), t(mean), t(rstd));
  }
  expect_rounded(y, "layernorm out");
  expect_rounded(mean, "layernorm mean");
  expect_rounded(rstd, "layernorm rstd");
  expect_rounded(dx, "layernorm dinp");
  expect_rounded(dw, "layernorm dweight");
  expect_rounded(db, "layernorm dbias");
}

// Runs linear forward and backward on 16-bit tensors and on the widened F32 reference.
void linear_case(Arena& arena, DType act, DType grad, int ulps, double f32_tol) {
  const int64_t N = 6, C = 40, OC = 72;
  const Pair x = arena.normal(act, {2, 3, C}, 1), w = arena.normal(act, {OC, C}, 2, 0.2f);
  const Pair b = arena.normal(act, {OC}, 3), y = arena.zeros(act, {2, 3, OC});
  const Pair dy = arena.normal(act, {N, OC}, 4), dx = arena.normal(act, {N, C}, 5);
  const Pair dw = arena.normal(grad, {OC, C}, 6), db = arena.normal(grad, {OC}, 7);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::linear_forward(t(y), t(x), t(w), t(b));
    ops::linear_backward(t(dx), t(dw), t(db), t(dy), t(x), t(w));
  }
  expect_rounded(y, "linear out", ulps, f32_tol);
  expect_rounded(dx, "linear dinp", ulps, f32_tol);
  expect_rounded(dw, "linear dweight", ulps, f32_tol);
  expect_rounded(db, "linear dbias");  // column sums: the same f32 additions on every path
}

TEST_P(StorageOps, RmsNorm) {
  const int64_t N = 7, C = 100;  // C not a multiple of the backward's 64-channel blocks
  const Pair x = arena.normal(act(), {N, C}, 1, 2.0f, 1.0f), w = arena.normal(act(), {C}, 2, 0.5f, 1.0f);
  const Pair y = arena.zeros(act(), {N, C}), rstd = arena.zeros(DType::F32, {N});
  const Pair dy = arena.normal(act(), {N, C}, 4), dx = arena.normal(act(), {N, C}, 5);
  const Pair dw = arena.normal(grad(), {C}, 6);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::rmsnorm_forward(t(y), t(rstd), t(x), t(w), 1e-5f);
    ops::rmsnorm_backward(t(dx), t(dw), t(dy), t(x), t(w), t(rstd));
  }
  expect_rounded(y, "rmsnorm out");
  expect_rounded(rstd, "rmsnorm rstd");
  expect_rounded(dx, "rmsnorm dinp");
  expect_rounded(dw, "rmsnorm dweight");
}

TEST_P(StorageOps, Swiglu) {
  const Pair x = arena.normal(act(), {3, 140}, 1, 2.0f), y = arena.zeros(act(), {3, 70});
  const Pair dy = arena.normal(act(), {3, 70}, 2), dx = arena.normal(act(), {3, 140}, 3);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::swiglu_forward(t(y), t(x));
    ops::swiglu_backward(t(dx), t(dy), t(x));
  }
  expect_rounded(y, "swiglu out");
  expect_rounded(dx, "swiglu dinp");
}

TEST_P(StorageOps, AttentionQkv) {
  // 2 groups of 3 query heads, head dim 8, half of it rotated.
  const int64_t B = 2, T = 5, NG = 2, R = 3, HD = 8;
  const ops::Rope rope{4, 10000.0f};
  const Shape grouped{B, T, NG * (R + 2) * HD}, per_head{B, T, NG * R * 3 * HD};
  const Pair qkv = arena.normal(act(), grouped, 1), out = arena.zeros(act(), per_head);
  const Pair dout = arena.normal(act(), per_head, 2), dqkv = arena.normal(act(), grouped, 3);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::attention_qkv_forward(t(out), t(qkv), NG, rope);
    ops::attention_qkv_backward(t(dqkv), t(dout), NG, rope);
  }
  expect_rounded(out, "attention_qkv out");
  expect_rounded(dqkv, "attention_qkv dqkv");
}

TEST_P(StorageOps, Linear) {
  // Widened operands and sgemm (oneDNN's bf16 kernel switched off): one weight tile (the
  // default tile holds far more than 72 rows), the same sgemm calls on the same values as
  // the F32 path, so exact.
  const bool saved = ops::cpu::set_bf16_use_onednn(false);
  linear_case(arena, act(), grad(), 0, 0.0);
  ops::cpu::set_bf16_use_onednn(saved);
}

TEST_P(StorageOps, LinearThroughOnednnBf16) {
  if (act() != DType::BF16 || !ops::cpu::onednn_bf16_available())
    GTEST_SKIP() << "bf16 tensors through oneDNN's bf16 matmul need a CPU with AVX512-BF16 or AMX";
  // oneDNN's bf16 matmul multiplies the bf16 bits straight from the tensors: the same exact
  // products, summed in f32 in its own order (and in blocks), so an f32 result may differ
  // from sgemm's by a few f32 roundings of the partial sums: within 1e-6 of the largest
  // result (the sums here have at most 40 terms of size ~1, each rounding ~6e-8 relative),
  // and a 16-bit result by at most 1 ulp (a last-bit f32 difference can move the final
  // rounding to the neighbouring 16-bit value).
  ASSERT_TRUE(ops::cpu::bf16_uses_onednn());
  linear_case(arena, act(), grad(), 1, 1e-6);
}

TEST_P(StorageOps, LinearTiledLikeTheLmHead) {
  // Weight rows in tiles of 64 (as the [50304, C] LM head is, in tiles of lowp_tile_elements):
  // each tile is its own GEMM, whose f32 sums may be ordered differently from one GEMM over
  // all rows (dinp also adds the tiles' products one tile at a time), so an f32 result may
  // differ by a few f32 ulps before its final rounding, which can then land on the
  // neighbouring 16-bit value: 1 ulp of the 16-bit format; an f32 gradient within 1e-6 of
  // its largest element (48-term sums of size ~1). bf16 runs through oneDNN's bf16 matmul
  // where this CPU has it (the same tolerances, see LinearThroughOnednnBf16).
  const int64_t saved = ops::cpu::set_lowp_tile_elements(64);
  const int64_t N = 5, C = 48, OC = 200;
  const Pair x = arena.normal(act(), {N, C}, 1), w = arena.normal(act(), {OC, C}, 2, 0.2f);
  const Pair y = arena.zeros(act(), {N, OC});
  const Pair dy = arena.normal(act(), {N, OC}, 4), dx = arena.normal(act(), {N, C}, 5);
  const Pair dw = arena.normal(grad(), {OC, C}, 6);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::linear_forward(t(y), t(x), t(w), Tensor{});
    ops::linear_backward(t(dx), t(dw), Tensor{}, t(dy), t(x), t(w));
  }
  ops::cpu::set_lowp_tile_elements(saved);
  expect_rounded(y, "tiled linear out", 1);
  expect_rounded(dx, "tiled linear dinp", 1);
  expect_rounded(dw, "tiled linear dweight", 1, 1e-6);
}

TEST_P(StorageOps, BiasAdd) {
  const Pair x = arena.normal(act(), {4, 30}, 1), b = arena.normal(act(), {30}, 2), y = arena.zeros(act(), {4, 30});
  const Pair dy = arena.normal(act(), {4, 30}, 3), db = arena.normal(grad(), {30}, 4);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::bias_add_forward(t(y), t(x), t(b));
    ops::bias_add_backward(t(db), t(dy));
  }
  expect_rounded(y, "bias_add out");
  expect_rounded(db, "bias_add dbias");
}

TEST_P(StorageOps, Attention) {
  const int64_t B = 2, T = 19, NH = 3, HD = 20;  // T and HD not multiples of the 16-key blocks
  const ops::AttentionBuffers buffers = ops::attention_buffers(cpu_device(), B, NH, T, act());
  EXPECT_EQ(buffers.saved_dtype, act());
  for (float p : {0.0f, 0.2f}) {
    const ops::Dropout drop{.p = p, .key = {3, 4, 5}};
    const Pair qkv = arena.normal(act(), {B, T, NH * 3 * HD}, 1), out = arena.zeros(act(), {B, T, NH * HD});
    const Pair att = arena.zeros(buffers.saved_dtype, buffers.saved);
    for (bool lo : {true, false}) ops::attention_forward(lo ? out.lo : out.ref, lo ? att.lo : att.ref, lo ? qkv.lo : qkv.ref, drop);
    expect_rounded(out, "attention out");
    expect_rounded(att, "attention probabilities");
    // The backward reads the saved probabilities: the reference gets them widened.
    for (int64_t i = 0; i < att.ref.numel(); ++i) att.ref.f32()[i] = from_bits(att.lo.host<uint16_t>()[i], act());
    const Pair dout = arena.normal(act(), {B, T, NH * HD}, 2), dqkv = arena.normal(act(), {B, T, NH * 3 * HD}, 3);
    const Pair scratch = arena.zeros(DType::F32, buffers.scratch);
    for (bool lo : {true, false}) {
      const auto& t = [lo](const Pair& x) { return lo ? x.lo : x.ref; };
      ops::attention_backward(t(dqkv), t(scratch), t(dout), t(qkv), t(att), drop);
    }
    expect_rounded(dqkv, "attention dqkv");
  }
}

TEST_P(StorageOps, EmbeddingWithRepeatedTokens) {
  const int64_t C = 70, V = 9, P = 6;
  // Token 4 appears four times: its gradient row sums four rows of dout before one rounding.
  const Tensor tokens = arena.ints({2, 4}, {4, 1, 4, 8, 4, 0, 4, 2});
  const Tensor positions = arena.ints({2, 4}, {0, 1, 2, 3, 0, 1, 2, 3});
  const Pair wte = arena.normal(act(), {V, C}, 1), wpe = arena.normal(act(), {P, C}, 2);
  const Pair out = arena.zeros(act(), {2, 4, C}), dout = arena.normal(act(), {2, 4, C}, 3);
  const Pair dwte = arena.normal(grad(), {V, C}, 4), dwpe = arena.normal(grad(), {P, C}, 5);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::embedding_forward(t(out), tokens, positions, t(wte), t(wpe), 0, 0);
    ops::embedding_backward(t(dwte), t(dwpe), t(dout), tokens, positions, 0, 0);
  }
  expect_rounded(out, "embedding out");
  expect_rounded(dwte, "embedding dwte");
  expect_rounded(dwpe, "embedding dwpe");
}

TEST_P(StorageOps, CrossEntropy) {
  // 64 rows, pre-filled dlogits of size ~1: a kernel that rounded a row before adding the
  // target's -dloss (two roundings of the target element) differs in many rows.
  const int64_t N = 64, V = 300;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[static_cast<size_t>(n)] = static_cast<int32_t>((n * 37) % V);
  const Tensor targets = arena.ints({N}, ids);
  const Pair logits = arena.normal(act(), {N, V}, 1, 3.0f), dlogits = arena.normal(act(), {N, V}, 2);
  const Pair row_max = arena.zeros(DType::F32, {N}), sum_exp = arena.zeros(DType::F32, {N});
  const Pair target_logit = arena.zeros(DType::F32, {N}), lse = arena.zeros(DType::F32, {N});
  const Pair losses = arena.zeros(DType::F32, {N}), dlosses = arena.normal(DType::F32, {N}, 3);
  for (bool lo : {true, false}) {
    const auto& t = [lo](const Pair& p) { return lo ? p.lo : p.ref; };
    ops::cross_entropy_max(t(row_max), t(logits));
    ops::cross_entropy_sums(t(sum_exp), t(target_logit), t(logits), targets, t(row_max), 0, 0);
    ops::cross_entropy_finish(t(losses), t(lse), t(sum_exp), t(row_max), t(target_logit));
    ops::cross_entropy_backward(t(dlogits), t(dlosses), t(logits), targets, t(lse), 0, 0);
  }
  expect_rounded(row_max, "row_max");
  expect_rounded(sum_exp, "sum_exp");
  expect_rounded(target_logit, "target_logit");
  expect_rounded(losses, "losses");
  expect_rounded(dlogits, "dlogits");
}

// In-process ranks are threads that call ops concurrently; each stages into its own
// thread-local workspaces (and so does each OpenMP worker). Two threads running the same
// 16-bit attention and LayerNorm calls on their own tensors get the single-thread bits.
TEST(StorageOpsThreads, ConcurrentCallersStageIntoTheirOwnWorkspaces) {
  const int64_t B = 2, T = 40, NH = 2, HD = 24, C = NH * HD;
  struct Run {
    Arena arena;
    Pair qkv, out, att, x, y, mean, rstd, w;
    Run() {
      qkv = arena.normal(DType::BF16, {B, T, 3 * C}, 1), out = arena.zeros(DType::BF16, {B, T, C});
      att = arena.zeros(DType::BF16, {B, NH, T, T}), x = arena.normal(DType::F16, {B * T, C}, 2);
      y = arena.zeros(DType::F16, {B * T, C}), mean = arena.zeros(DType::F32, {B * T});
      rstd = arena.zeros(DType::F32, {B * T}), w = arena.normal(DType::F16, {C}, 3);
    }
    void go() {
      for (int i = 0; i < 20; ++i) {
        ops::attention_forward(out.lo, att.lo, qkv.lo, {});
        ops::layernorm_forward(y.lo, mean.lo, rstd.lo, x.lo, w.lo, Tensor{}, 1e-5f);
      }
    }
  };
  Run serial, a, b;
  serial.go();
  std::thread ta([&] { a.go(); }), tb([&] { b.go(); });
  ta.join();
  tb.join();
  for (const Run* r : {&a, &b}) {
    EXPECT_EQ(std::memcmp(r->out.lo.host<void>(), serial.out.lo.host<void>(), serial.out.lo.bytes()), 0);
    EXPECT_EQ(std::memcmp(r->att.lo.host<void>(), serial.att.lo.host<void>(), serial.att.lo.bytes()), 0);
    EXPECT_EQ(std::memcmp(r->y.lo.host<void>(), serial.y.lo.host<void>(), serial.y.lo.bytes()), 0);
  }
}

// ---------------------------------------------------------------------------------------
// Dtype errors

// The Error of calling f names the op, the argument and the offending dtype.
template <typename F>
void expect_dtype_error(F f, const std::string& op, const std::string& arg, const std::string& dtype) {
  try {
    f();
    ADD_FAILURE() << op << " accepted " << arg << " of dtype " << dtype;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(op), std::string::npos) << what;
    EXPECT_NE(what.find(arg + " has dtype " + dtype), std::string::npos) << what;
  }
}

TEST(StorageOpsErrors, NameTheOpTheArgumentAndTheDtype) {
  Arena a;
  const Tensor x = a.normal(DType::BF16, {2, 8}, 1).lo, w = a.normal(DType::BF16, {8}, 2).lo;
  const Tensor y = a.zeros(DType::BF16, {2, 8}).lo, stats16 = a.zeros(DType::BF16, {2}).lo;
  const Tensor stats = a.zeros(DType::F32, {2}).lo, ids = a.ints({2, 8}, std::vector<int32_t>(16, 1));
  expect_dtype_error([&] { ops::layernorm_forward(y, stats16, stats, x, w, Tensor{}, 1e-5f); }, "layernorm_forward",
                     "mean", "bf16");
  expect_dtype_error([&] { ops::gelu_forward(y, ids, ops::GeluKind::Tanh); }, "gelu_forward", "inp", "i32");
  expect_dtype_error([&] { ops::rmsnorm_forward(y, stats16, x, w, 1e-5f); }, "rmsnorm_forward", "rstd", "bf16");
  const Tensor half_rows = a.zeros(DType::BF16, {2, 4}).lo;
  expect_dtype_error([&] { ops::swiglu_forward(half_rows, ids); }, "swiglu_forward", "inp", "i32");
  const Tensor heads = a.ints({1, 2, 6}, std::vector<int32_t>(12, 0)), grouped = a.zeros(DType::BF16, {1, 2, 6}).lo;
  expect_dtype_error([&] { ops::attention_qkv_forward(heads, grouped, 1, {}); }, "attention_qkv_forward", "out",
                     "i32");
  expect_dtype_error([&] { ops::cross_entropy_max(stats16, x); }, "cross_entropy_max", "row_max", "bf16");
  const Tensor p16 = a.zeros(DType::F16, {16}).lo, g = a.zeros(DType::F32, {16}).lo;
  expect_dtype_error([&] { ops::adamw_update(p16, g, g, g, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f); }, "adamw_update",
                     "param", "f16");
  const Tensor scratch16 = a.zeros(DType::BF16, {1, 1, 2, 2}).lo, att = a.zeros(DType::BF16, {1, 1, 2, 2}).lo;
  const Tensor qkv = a.zeros(DType::BF16, {1, 2, 3}).lo, out = a.zeros(DType::BF16, {1, 2, 1}).lo;
  expect_dtype_error([&] { ops::attention_backward(qkv, scratch16, out, qkv, att, {}); }, "attention_backward",
                     "scratch", "bf16");
}

}  // namespace
