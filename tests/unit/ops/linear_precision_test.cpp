// The linear layer on 16-bit tensors (ops.h: the GEMMs follow the tensors' dtypes) on the
// CPU backend, and the rounding routines it and storage.h rely on:
// - the scalar rounding routines (cpu/low_precision.h) against known bit patterns, the
//   F16C conversion instructions where the build has them, and core/dtype.h;
// - linear forward/backward on BF16 and F16 tensors (the model's mix: f32 weight and bias
//   gradients) against a double-precision GEMM of the widened values: only f32
//   accumulation error allowed before the one rounding into each 16-bit result;
// - an F16 result beyond the half range is inf (BF16 has the f32 range); tiling of the
//   weight rows; all-F32 tensors are one sgemm bit for bit; steady-state workspaces;
//   concurrent callers; the bf16 GEMM (oneDNN where this CPU has a bf16 kernel) against
//   the reference, and the linear through it against the widen+sgemm path; the bf16 weight
//   gradient on AMX tiles (default mode, shapes that fit) and through oneDNN (other shapes,
//   --deterministic-mode).
// Tolerances sit next to their checks with their reasons.
#include <gtest/gtest.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/ops/cpu/amx_gemm.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/ops.h"

using namespace tessera;
using ops::cpu::bf16_bits;
using ops::cpu::fp16_bits;
using ops::cpu::fp16_to_f32;

namespace {

// ---------------------------------------------------------------------------------------
// Helpers

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// Element i of a float tensor, widened (exact); and stored rounded once to its dtype.
float get(const Tensor& t, int64_t i) {
  if (t.dtype == DType::F32) return t.f32()[i];
  const uint16_t h = t.host<uint16_t>()[i];
  return t.dtype == DType::BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
}
void set(Tensor& t, int64_t i, float x) {
  if (t.dtype == DType::F32) t.f32()[i] = x;
  else t.host<uint16_t>()[i] = t.dtype == DType::BF16 ? bf16_bits(x) : fp16_bits(x);
}
std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = get(t, i);
  return v;
}
// x rounded to d, as f32.
float round_to(float x, DType d) {
  return d == DType::BF16 ? ops::cpu::round_bf16(x) : d == DType::F16 ? ops::cpu::round_fp16(x) : x;
}
const char* name(DType d) { return d == DType::BF16 ? "BF16" : d == DType::F16 ? "F16" : "F32"; }
class Arena {
 public:
  Tensor make(DType d, Shape s) {
    Tensor t(nullptr, d, std::move(s), &cpu_device());
    buffers_.emplace_back(cpu_device(), std::max<size_t>(t.bytes(), 1));
    t.handle = buffers_.back().handle();
    return t;
  }
  Tensor f32(Shape s) { return make(DType::F32, std::move(s)); }
  // Normal values rounded to d (any float dtype).
  Tensor normal(DType d, Shape s, uint32_t seed) {
    const Tensor v = normal(s, seed);
    Tensor t = make(d, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, v.f32()[i]);
    return t;
  }
  Tensor filled(DType d, Shape s, std::vector<float> v) {
    Tensor t = make(d, std::move(s));
    EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
    for (int64_t i = 0; i < t.numel(); ++i) set(t, i, v[static_cast<size_t>(i)]);
    return t;
  }
  Tensor normal(Shape s, uint32_t seed, float std = 1.0f) {
    Tensor t = f32(std::move(s));
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, std);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(gen);
    return t;
  }
  Tensor filled(Shape s, std::vector<float> v) {
    Tensor t = f32(std::move(s));
    EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
    std::copy(v.begin(), v.end(), t.f32());
    return t;
  }
  Tensor copy(const Tensor& src) {
    Tensor t = make(src.dtype, src.shape);
    std::memcpy(t.host<void>(), src.host<void>(), src.bytes());
    return t;
  }
  Tensor zeros_like(const Tensor& src) {
    Tensor t = f32(src.shape);
    std::memset(t.host<void>(), 0, t.bytes());
    return t;
  }

 private:
  std::vector<Buffer> buffers_;
};

bool same_bits(const Tensor& a, const Tensor& b) { return std::memcmp(a.host<void>(), b.host<void>(), a.bytes()) == 0; }

// An exact (double) sum of products and the sum of their magnitudes, which scales the f32
// accumulation error.
struct Exact {
  double value = 0.0, magnitude = 0.0;
  void add(double a, double b) {
    value += a * b;
    magnitude += std::fabs(a * b);
  }
};

// f32 accumulation of the K products a GEMM sums: the error is a few 2^-24 times the sum
// of the magnitudes of the terms in the worst realistic case (K <= 100 here; a
// random-walk estimate gives ~0.3 * 2^-24, the deterministic bound K * 2^-24 = 6e-6 at
// K = 100). 1e-6 is tight enough that any operand rounded differently (2^-9 relative for
// bf16, 2^-12 for half, on one product of ~K) or a dropped term shows.
constexpr double kAccumulation = 1e-6;

// got is `exact` accumulated in f32, then rounded once to d. For a 16-bit d the result
// must equal the exact value rounded to d, except where the exact value lies within the
// accumulation error of a rounding tie between got and the other neighbour.
void expect_result(float got, const Exact& exact, DType d, const std::string& what) {
  const double tol = kAccumulation * exact.magnitude + 1e-30;
  if (d == DType::F32) {
    EXPECT_NEAR(got, exact.value, tol) << what;
    return;
  }
  const float want = round_to(static_cast<float>(exact.value), d);
  if (bits(got) == bits(want)) return;
  const double tie = 0.5 * (static_cast<double>(got) + static_cast<double>(want));
  EXPECT_LE(std::fabs(exact.value - tie), tol)
      << what << ": got " << got << ", exact " << exact.value << " rounds to " << want
      << " and is not within the f32 accumulation error of the tie between them";
}

// Sets the tile budget for one scope.
struct TileElements {
  int64_t saved;
  explicit TileElements(int64_t e) : saved(ops::cpu::set_lowp_tile_elements(e)) {}
  ~TileElements() { ops::cpu::set_lowp_tile_elements(saved); }
};

// ---------------------------------------------------------------------------------------
// Rounding routines against known bit patterns

TEST(OpsPrecisionRounding, Bf16KnownBits) {
  // bf16 keeps 7 mantissa bits: ulp(1) = 2^-7.
  EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-8f), 0x3F80);                   // tie: to even (1.0)
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-7f + 0x1p-8f), 0x3F82);         // tie: to even (1 + 2^-6)
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);        // above the tie: up
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-8f - 0x1p-23f), 0x3F80);        // below the tie: down
  EXPECT_EQ(bf16_bits(3.14159265f), 0x4049);                      // torch.tensor(pi).bfloat16() = 3.140625
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // beyond the largest bf16: inf
  EXPECT_EQ(bf16_bits(std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7F);   // just below the tie: largest bf16
  EXPECT_EQ(bf16_bits(std::bit_cast<float>(0x00018000u)), 0x0002);   // f32 subnormal tie: to even
  EXPECT_EQ(bf16_bits(std::bit_cast<float>(0x00008000u)), 0x0000);   // half the least bf16 subnormal: 0
  // NaN stays NaN, even a signalling NaN whose payload sits in the discarded bits.
  EXPECT_TRUE(std::isnan(bf16_to_f32(bf16_bits(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_bits(std::bit_cast<float>(0xFFC00000u)), 0xFFC0);
}

TEST(OpsPrecisionRounding, Fp16KnownBits) {
  EXPECT_EQ(fp16_bits(1.0f), 0x3C00);
  EXPECT_EQ(fp16_bits(-2.0f), 0xC000);
  EXPECT_EQ(fp16_bits(0.1f), 0x2E66);  // numpy.float16(0.1).view(uint16)
  EXPECT_EQ(fp16_bits(1.0f + 0x1p-11f), 0x3C00);                // tie: to even
  EXPECT_EQ(fp16_bits(1.0f + 0x1p-10f + 0x1p-11f), 0x3C02);     // tie: to even
  EXPECT_EQ(fp16_bits(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);     // above the tie
  // The top of the range: 65504 is the largest half; 65520 (the tie with 2^16) is inf.
  EXPECT_EQ(fp16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(fp16_bits(65519.996f), 0x7BFF);
  EXPECT_EQ(fp16_bits(65520.0f), 0x7C00);
  EXPECT_EQ(fp16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(fp16_bits(1e10f), 0x7C00);
  EXPECT_EQ(fp16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_f32(0x7C00)));
  // The bottom: 2^-14 the least normal; subnormals in steps of 2^-24.
  EXPECT_EQ(fp16_bits(0x1p-14f), 0x0400);
  EXPECT_EQ(fp16_bits(0x1p-24f), 0x0001);                       // least subnormal
  EXPECT_EQ(fp16_bits(0x1p-25f), 0x0000);                       // tie with 0: to even
  EXPECT_EQ(fp16_bits(0x1p-25f + 0x1p-40f), 0x0001);            // above the tie
  EXPECT_EQ(fp16_bits(3 * 0x1p-25f), 0x0002);                   // tie between 1 and 2: to 2
  EXPECT_EQ(fp16_bits(5 * 0x1p-25f), 0x0002);                   // tie between 2 and 3: to 2
  EXPECT_EQ(fp16_bits(1023 * 0x1p-24f), 0x03FF);                // largest subnormal
  EXPECT_EQ(fp16_bits(1023.5f * 0x1p-24f), 0x0400);             // tie up into the least normal
  EXPECT_EQ(fp16_bits(-1e-30f), 0x8000);
  EXPECT_EQ(fp16_bits(std::bit_cast<float>(0x00000001u)), 0x0000);  // f32 subnormal
  EXPECT_EQ(fp16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_f32(0x83FF), -1023 * 0x1p-24f);
  EXPECT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(fp16_to_f32(fp16_bits(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_EQ(fp16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
}

TEST(OpsPrecisionRounding, HalfRoundTripsAndMatchesF16cOnAllHalves) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF) != 0;
    if (!nan) ASSERT_EQ(fp16_bits(f), h) << std::hex << h;
    else ASSERT_TRUE(std::isnan(f)) << std::hex << h;
#if defined(__F16C__)
    ASSERT_EQ(bits(f), bits(_cvtsh_ss(static_cast<unsigned short>(h)))) << std::hex << h;
#endif
  }
}

// The scalar routines against the hardware and core/dtype.h's f32_to_f16, over a sweep of
// every 101st f32 bit pattern plus, for every half, the f32 values at, just below and just
// above the tie with its successor.
TEST(OpsPrecisionRounding, ScalarRoutinesMatchHardwareAndCore) {
  std::vector<float> src;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const double lo = fp16_to_f32(static_cast<uint16_t>(h | sign));
      const double hi = h + 1 == 0x7C00 ? (sign ? -65536.0 : 65536.0) : fp16_to_f32(static_cast<uint16_t>((h + 1) | sign));
      const float tie = static_cast<float>(0.5 * (lo + hi));  // exact in f32
      src.push_back(tie);
      src.push_back(std::nextafter(tie, 0.0f));
      src.push_back(std::nextafter(tie, std::numeric_limits<float>::infinity() * (sign ? -1.0f : 1.0f)));
    }
  }
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 101) src.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  int64_t mismatches = 0;
  for (const float x : src) {
    bool ok = fp16_bits(x) == f32_to_f16(x) && bf16_bits(x) == f32_to_bf16(x);  // core/dtype.h
#if defined(__F16C__)
    ok = ok && fp16_bits(x) == _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    if (!ok && ++mismatches <= 5) ADD_FAILURE() << "input bits " << std::hex << bits(x) << ": half " << fp16_bits(x);
  }
  EXPECT_EQ(mismatches, 0) << "of " << src.size() << " inputs";
}

// ---------------------------------------------------------------------------------------
// The bf16 GEMM

TEST(OpsPrecisionGemm, Bf16GemmMatchesReferenceOnOddShapes) {
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{1, 1, 1}, {3, 5, 7}, {67, 131, 45}, {130, 77, 200}};
  for (const Case& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f}) {
          const float alpha = beta == 0.0f ? 1.0f : 0.5f;
          const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K, lda = a_cols + 3;
          const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N, ldb = b_cols + 5;
          const int64_t ldc = c.N + 2;
          Arena arena;
          Tensor A = arena.normal({a_rows, lda}, 21), B = arena.normal({b_rows, ldb}, 22);
          std::vector<uint16_t> a16(static_cast<size_t>(A.numel())), b16(static_cast<size_t>(B.numel()));
          for (int64_t i = 0; i < A.numel(); ++i) {
            a16[static_cast<size_t>(i)] = bf16_bits(A.f32()[i]);
            A.f32()[i] = bf16_to_f32(a16[static_cast<size_t>(i)]);
          }
          for (int64_t i = 0; i < B.numel(); ++i) {
            b16[static_cast<size_t>(i)] = bf16_bits(B.f32()[i]);
            B.f32()[i] = bf16_to_f32(b16[static_cast<size_t>(i)]);
          }
          Tensor C0 = arena.normal({c.M, ldc}, 23);
          if (beta == 0.0f) C0.f32()[0] = std::numeric_limits<float>::quiet_NaN();  // must be ignored
          Tensor fast = arena.copy(C0), ref = arena.copy(C0);
          ops::cpu::gemm_bf16(ta, tb, c.M, c.N, c.K, alpha, a16.data(), lda, b16.data(), ldb, beta, fast.f32(), ldc);
          ops::cpu::sgemm_reference(ta, tb, c.M, c.N, c.K, alpha, A.f32(), lda, B.f32(), ldb, beta, ref.f32(), ldc);
          for (int64_t i = 0; i < c.M; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float f = fast.f32()[i * ldc + j], r = ref.f32()[i * ldc + j];
              if (j >= c.N) {
                ASSERT_EQ(bits(f), bits(C0.f32()[i * ldc + j])) << "wrote outside C";
                continue;
              }
              // The reference sums the same (exact) products in double: only f32
              // accumulation error remains (see kAccumulation), scaled by sum |a b| <= K
              // * 4 for these N(0,1) operands (bounded loosely by K * 10), plus beta * C.
              ASSERT_NEAR(f, r, kAccumulation * 10 * c.K + 1e-7 * std::fabs(r))
                  << "M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << ta << " tb=" << tb
                  << " beta=" << beta << " at " << i << "," << j;
            }
          }
        }
      }
    }
  }
}


// ---------------------------------------------------------------------------------------
// Linear on BF16 / F16 tensors against double references of the widened values

struct LinearCase {
  int64_t B = 2, T = 19, C = 67, OC = 45;
  int64_t N() const { return B * T; }
};

// Forward: out = round_d(inp @ W^T + bias), everything of dtype d.
void check_forward(DType d, const LinearCase& lc, uint32_t seed) {
  Arena arena;
  const int64_t N = lc.N(), C = lc.C, OC = lc.OC;
  Tensor inp = arena.normal(d, {lc.B, lc.T, C}, seed), w = arena.normal(d, {OC, C}, seed + 1);
  Tensor bias = arena.normal(d, {OC}, seed + 2);
  Tensor out = arena.make(d, {lc.B, lc.T, OC}), out_nb = arena.make(d, {lc.B, lc.T, OC});
  set(out, 0, std::numeric_limits<float>::quiet_NaN());  // old contents must not leak in
  ops::linear_forward(out, inp, w, bias);
  ops::linear_forward(out_nb, inp, w, Tensor());
  const std::vector<double> x = values(inp), wv = values(w);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      Exact e;
      for (int64_t c = 0; c < C; ++c) e.add(x[static_cast<size_t>(n * C + c)], wv[static_cast<size_t>(o * C + c)]);
      const std::string at = " at " + std::to_string(n) + "," + std::to_string(o);
      expect_result(get(out_nb, n * OC + o), e, d, "no bias" + at);
      e.add(get(bias, o), 1.0);
      expect_result(get(out, n * OC + o), e, d, "bias" + at);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Backward onto pre-filled gradients: dinp (dtype d) and dweight, dbias (dtype g: F32 is
// the model's mix, Megatron's fp32 main grads) are each round_g(old + exact sum), rounded
// once; with GradWrite::Assign dinp is round_d(exact sum), whatever it held (NaN).
void check_backward(DType d, DType g, const LinearCase& lc, uint32_t seed,
                    ops::GradWrite write = ops::GradWrite::Accumulate) {
  Arena arena;
  const int64_t N = lc.N(), C = lc.C, OC = lc.OC;
  Tensor inp = arena.normal(d, {lc.B, lc.T, C}, seed), w = arena.normal(d, {OC, C}, seed + 1);
  Tensor dout = arena.normal(d, {lc.B, lc.T, OC}, seed + 2);
  Tensor dinp = arena.normal(d, inp.shape, seed + 3), dw = arena.normal(g, w.shape, seed + 4);
  Tensor db = arena.normal(g, {OC}, seed + 5);
  Tensor dinp0 = arena.copy(dinp);
  if (write == ops::GradWrite::Assign) {  // nothing of the old dinp may show: as if it were 0
    for (int64_t i = 0; i < dinp.numel(); ++i) {
      set(dinp, i, std::numeric_limits<float>::quiet_NaN());
      set(dinp0, i, 0.0f);
    }
  }
  const Tensor dw0 = arena.copy(dw), db0 = arena.copy(db);
  ops::linear_backward(dinp, dw, db, dout, inp, w, write);
  const std::vector<double> x = values(inp), wv = values(w), gv = values(dout);

  std::vector<Exact> e_dinp(static_cast<size_t>(N * C)), e_dw(static_cast<size_t>(OC * C)),
      e_db(static_cast<size_t>(OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t o = 0; o < OC; ++o)
        e_dinp[static_cast<size_t>(n * C + c)].add(gv[static_cast<size_t>(n * OC + o)], wv[static_cast<size_t>(o * C + c)]);
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t c = 0; c < C; ++c)
      for (int64_t n = 0; n < N; ++n)
        e_dw[static_cast<size_t>(o * C + c)].add(gv[static_cast<size_t>(n * OC + o)], x[static_cast<size_t>(n * C + c)]);
    for (int64_t n = 0; n < N; ++n) e_db[static_cast<size_t>(o)].add(gv[static_cast<size_t>(n * OC + o)], 1.0);
  }
  auto expect_accumulated = [](const Tensor& got, const Tensor& old, std::vector<Exact> e, const char* what) {
    for (int64_t i = 0; i < got.numel(); ++i) {
      Exact& x = e[static_cast<size_t>(i)];
      x.add(get(old, i), 1.0);
      expect_result(get(got, i), x, got.dtype, std::string(what) + " element " + std::to_string(i));
      if (::testing::Test::HasFailure()) return;
    }
  };
  expect_accumulated(dinp, dinp0, e_dinp, "dinp");
  expect_accumulated(dw, dw0, e_dw, "dweight");
  expect_accumulated(db, db0, e_db, "dbias");
}

TEST(OpsPrecisionLinear, Bf16TensorsMatchDoubleReference) {
  check_forward(DType::BF16, {}, 1);
  check_backward(DType::BF16, DType::F32, {}, 11);
  check_backward(DType::BF16, DType::BF16, {}, 13);
}
TEST(OpsPrecisionLinear, F16TensorsMatchDoubleReference) {
  check_forward(DType::F16, {}, 21);
  check_backward(DType::F16, DType::F32, {}, 31);
  check_backward(DType::F16, DType::F16, {}, 33);
}

// The weight rows in several tiles (the LM head's case, forced on small shapes with a
// tiny tile budget: tiles of 64 rows, the last one ragged) give the same function.
TEST(OpsPrecisionLinear, TiledWeightRowsMatchReference) {
  TileElements tiny(1);
  LinearCase lc;
  lc.OC = 150;  // tiles of 64, 64, 22
  for (DType d : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(name(d));
    check_forward(d, lc, 41);
    check_backward(d, DType::F32, lc, 51);
  }
}

// A vocabulary-sized OC (more than four of the packed K tiles of dinp's GEMM, the last one
// ragged) with an f32 weight gradient: the bf16 backward's LM-head path, accumulating and
// assigning.
TEST(OpsPrecisionLinear, LongOutputDimensionBackwardMatchesReference) {
  LinearCase lc;
  lc.B = 1, lc.T = 5, lc.C = 24, lc.OC = 5 * 1024 + 77;
  check_backward(DType::BF16, DType::F32, lc, 81);
  check_backward(DType::BF16, DType::F32, lc, 83, ops::GradWrite::Assign);
}

// A data gradient with a long sum dimension K (over 1536; GPT-2's fc1 has 3072) goes
// through oneDNN's bf16 matmul in even K tiles, each tile's products added onto the
// ones before: the same function as the double reference, and bit for bit one gemm_bf16
// per tile on the tile's columns copied contiguous; in --deterministic-mode one gemm_bf16
// over the whole K, as before the tiles.
TEST(OpsPrecisionLinear, LongSumDimensionInKTiles) {
  LinearCase lc;
  lc.B = 1, lc.T = 9, lc.C = 40, lc.OC = 1600;  // dinp's K = OC = 1600: tiles of 832 and 768
  check_backward(DType::BF16, DType::F32, lc, 93);
  check_backward(DType::BF16, DType::BF16, lc, 94);
  check_forward(DType::BF16, lc, 91);  // K = C: one GEMM
  if (!ops::cpu::bf16_uses_onednn()) GTEST_SKIP() << "no oneDNN bf16 kernel on this CPU";
  // The data gradient dinp[N,C] = dout[N,K] @ W[K,C], assigned into an f32 dinp.
  Arena arena;
  const int64_t N = 9, K = 1600, C = 40, tile = 832;
  const Tensor dout = arena.normal(DType::BF16, {N, K}, 95), w = arena.normal(DType::BF16, {K, C}, 96);
  const Tensor inp = arena.normal(DType::BF16, {N, C}, 97);
  const uint16_t* g = dout.host<uint16_t>();
  const uint16_t* wb = w.host<uint16_t>();
  Tensor tiled = arena.f32({N, C}), whole = arena.f32({N, C}), dinp = arena.f32({N, C});
  for (int64_t k0 = 0; k0 < K; k0 += tile) {
    const int64_t len = std::min(tile, K - k0);
    std::vector<uint16_t> packed(static_cast<size_t>(N * len));
    for (int64_t n = 0; n < N; ++n) std::copy(g + n * K + k0, g + n * K + k0 + len, packed.begin() + n * len);
    ops::cpu::gemm_bf16(false, false, N, C, len, 1.0f, packed.data(), len, wb + k0 * C, C, k0 == 0 ? 0.0f : 1.0f,
                        tiled.f32(), C);
  }
  ops::cpu::gemm_bf16(false, false, N, C, K, 1.0f, g, K, wb, C, 0.0f, whole.f32(), C);
  ASSERT_FALSE(same_bits(tiled, whole)) << "the case cannot tell tiles from one GEMM";
  ops::linear_backward(dinp, Tensor(), Tensor(), dout, inp, w, ops::GradWrite::Assign);
  EXPECT_TRUE(same_bits(dinp, tiled)) << "default mode: K tiles";
  cpu_device().set_deterministic_mode(true);
  ops::linear_backward(dinp, Tensor(), Tensor(), dout, inp, w, ops::GradWrite::Assign);
  cpu_device().set_deterministic_mode(false);
  EXPECT_TRUE(same_bits(dinp, whole)) << "--deterministic-mode: one GEMM over the whole K";
}

// A linear of bf16 bits with f32 results, run by the linear ops in default mode or in
// --deterministic-mode, and its products run directly (dout, inp and W contiguous): the
// forward out[N,OC] = inp @ W^T + bias and the weight gradient dW[OC,C] += dout^T @ inp, dW
// starting from `start`.
struct AmxLinearCase {
  Arena arena;
  int64_t N, C, OC;
  Tensor inp, w, bias, dout, start;
  AmxLinearCase(int64_t N_, int64_t C_, int64_t OC_, uint32_t seed)
      : N(N_), C(C_), OC(OC_), inp(arena.normal(DType::BF16, {N_, C_}, seed)),
        w(arena.normal(DType::BF16, {OC_, C_}, seed + 1)), bias(arena.normal({OC_}, seed + 2)),
        dout(arena.normal(DType::BF16, {N_, OC_}, seed + 3)), start(arena.normal({OC_, C_}, seed + 4)) {}
  Tensor forward(bool deterministic) {
    Tensor out = arena.f32({N, OC});
    cpu_device().set_deterministic_mode(deterministic);
    ops::linear_forward(out, inp, w, bias);
    cpu_device().set_deterministic_mode(false);
    return out;
  }
  Tensor weight_gradient(bool deterministic) {
    Tensor dw = arena.copy(start);
    cpu_device().set_deterministic_mode(deterministic);
    ops::linear_backward(Tensor(), dw, Tensor(), dout, inp, w);
    cpu_device().set_deterministic_mode(false);
    return dw;
  }
  // y = x w^T + bias through product(y, x, w) onto y holding the broadcast bias.
  template <typename Product>
  Tensor forward_by(Product product) {
    Tensor out = arena.f32({N, OC});
    for (int64_t n = 0; n < N; ++n) std::copy(bias.f32(), bias.f32() + OC, out.f32() + n * OC);
    product(out.f32(), inp.host<uint16_t>(), w.host<uint16_t>());
    return out;
  }
  // dW = start + dy^T x through product(dW, dy, x) onto a copy of start.
  template <typename Product>
  Tensor weight_gradient_by(Product product) {
    Tensor dw = arena.copy(start);
    product(dw.f32(), dout.host<uint16_t>(), inp.host<uint16_t>());
    return dw;
  }
  Tensor forward_onednn() {
    return forward_by([&](float* y, const uint16_t* x, const uint16_t* wb) {
      ops::cpu::gemm_bf16(false, true, N, OC, C, 1.0f, x, C, wb, C, 1.0f, y, OC);
    });
  }
  Tensor weight_gradient_onednn() {
    return weight_gradient_by([&](float* dw, const uint16_t* dy, const uint16_t* x) {
      ops::cpu::gemm_bf16(true, false, OC, C, N, 1.0f, dy, OC, x, C, 1.0f, dw, C);
    });
  }
  // Each element within linear's OrderFree bound of float64 (precision_test.cpp's table:
  // (8 + terms) * 2^-24 * the sum of the terms' magnitudes, the bias or start included).
  void expect_forward_float64(const Tensor& out, const char* what) const {
    const std::vector<double> x = values(inp), wv = values(w);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OC; ++o) {
        Exact e;
        e.add(bias.f32()[o], 1.0);
        for (int64_t c = 0; c < C; ++c) e.add(x[static_cast<size_t>(n * C + c)], wv[static_cast<size_t>(o * C + c)]);
        expect_order_free(out.f32()[n * OC + o], e, C + 1, what, n, o);
      }
  }
  void expect_weight_gradient_float64(const Tensor& dw, const char* what) const {
    const std::vector<double> x = values(inp), g = values(dout);
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) {
        Exact e;
        e.add(start.f32()[o * C + c], 1.0);
        for (int64_t n = 0; n < N; ++n) e.add(g[static_cast<size_t>(n * OC + o)], x[static_cast<size_t>(n * C + c)]);
        expect_order_free(dw.f32()[o * C + c], e, N + 1, what, o, c);
      }
  }
  static void expect_order_free(float got, const Exact& e, int64_t terms, const char* what, int64_t i, int64_t j) {
    const double bound = (8.0 + static_cast<double>(terms)) * 0x1p-24 * e.magnitude;
    ASSERT_LE(std::fabs(got - e.value), bound) << what << " at " << i << "," << j;
  }
};

bool amx_and_onednn_bf16() { return ops::cpu::bf16_uses_onednn() && ops::cpu::amx_linear_fits(32, 32, 32); }

// Default mode runs a bf16 weight gradient that fits (N, C, OC multiples of 32) on AMX tiles,
// bit for bit amx_linear_dweight; --deterministic-mode keeps one gemm_bf16, bit for bit; both
// within the OrderFree bound of float64. Skipped without AMX or oneDNN's bf16 kernel.
TEST(OpsPrecisionLinear, Bf16WeightGradientOnAmxTilesWhereItFits) {
  if (!amx_and_onednn_bf16()) GTEST_SKIP() << "no AMX or no oneDNN bf16 kernel here";
  AmxLinearCase lc(96, 160, 224, 101);
  const Tensor amx = lc.weight_gradient(false), onednn = lc.weight_gradient(true);
  EXPECT_TRUE(same_bits(amx, lc.weight_gradient_by([&](float* dw, const uint16_t* dy, const uint16_t* x) {
    ops::cpu::amx_linear_dweight(dw, dy, lc.OC, x, lc.N, lc.C, lc.OC, true);
  }))) << "default mode: the AMX kernel";
  EXPECT_TRUE(same_bits(onednn, lc.weight_gradient_onednn())) << "--deterministic-mode: one gemm_bf16";
  EXPECT_FALSE(same_bits(amx, onednn)) << "the case cannot tell the AMX kernel from oneDNN";
  lc.expect_weight_gradient_float64(amx, "AMX");
  lc.expect_weight_gradient_float64(onednn, "oneDNN");
}

// A shape the AMX kernel does not take (N = 94 rows) stays with gemm_bf16 in default mode.
TEST(OpsPrecisionLinear, Bf16WeightGradientOfOtherShapesStaysWithOneDnn) {
  if (!ops::cpu::bf16_uses_onednn()) GTEST_SKIP() << "no oneDNN bf16 kernel on this CPU";
  AmxLinearCase lc(94, 160, 224, 111);
  const Tensor dw = lc.weight_gradient(false);
  EXPECT_TRUE(same_bits(dw, lc.weight_gradient_onednn()));
  lc.expect_weight_gradient_float64(dw, "oneDNN");
}

// A bf16 forward with a long K (C = 2080 >= 2048) runs on AMX tiles in default mode, onto the
// broadcast bias, bit for bit amx_linear_forward; --deterministic-mode and a short K (C = 992)
// keep one gemm_bf16; all within the OrderFree bound of float64. (With fewer rows, oneDNN's
// brgemm sums in the kernel's order: N = 256, the step's, tells them apart.)
TEST(OpsPrecisionLinear, Bf16ForwardWithLongSumDimensionOnAmxTiles) {
  if (!amx_and_onednn_bf16()) GTEST_SKIP() << "no AMX or no oneDNN bf16 kernel here";
  AmxLinearCase lc(256, 2080, 96, 121);
  const Tensor amx = lc.forward(false), onednn = lc.forward(true);
  EXPECT_TRUE(same_bits(amx, lc.forward_by([&](float* y, const uint16_t* x, const uint16_t* wb) {
    ops::cpu::amx_linear_forward(y, lc.OC, x, wb, lc.N, lc.C, lc.OC, true);
  }))) << "default mode: the AMX kernel";
  EXPECT_TRUE(same_bits(onednn, lc.forward_onednn())) << "--deterministic-mode: one gemm_bf16";
  EXPECT_FALSE(same_bits(amx, onednn)) << "the case cannot tell the AMX kernel from oneDNN";
  lc.expect_forward_float64(amx, "AMX");
  lc.expect_forward_float64(onednn, "oneDNN");
  AmxLinearCase short_k(256, 992, 96, 131);
  const Tensor out = short_k.forward(false);
  EXPECT_TRUE(same_bits(out, short_k.forward_onednn())) << "short K: one gemm_bf16";
  short_k.expect_forward_float64(out, "short K");
}

// BF16 tensors through oneDNN's bf16 matmul and through widen+sgemm compute the same
// function (only summation order differs). Skipped on CPUs without a oneDNN bf16 kernel,
// where widen+sgemm is the only path (and is what the tests above check).
TEST(OpsPrecisionLinear, Bf16OneDnnAndWidenedSgemmAgree) {
  if (!ops::cpu::onednn_bf16_available())
    GTEST_SKIP() << "no oneDNN bf16 kernel on this CPU (oneDNN picks " << ops::cpu::onednn_bf16_impl()
                 << "): BF16 tensors go through widen+sgemm";
  ASSERT_TRUE(ops::cpu::bf16_uses_onednn());
  const bool saved = ops::cpu::set_bf16_use_onednn(false);
  check_forward(DType::BF16, {}, 61);
  check_backward(DType::BF16, DType::F32, {}, 71);
  ops::cpu::set_bf16_use_onednn(saved);
  Arena arena;
  Tensor inp = arena.normal(DType::BF16, {64, 96}, 1), w = arena.normal(DType::BF16, {200, 96}, 2);
  Tensor a = arena.f32({64, 200}), b = arena.f32({64, 200});
  ops::linear_forward(a, inp, w, Tensor());
  ops::cpu::set_bf16_use_onednn(false);
  ops::linear_forward(b, inp, w, Tensor());
  ops::cpu::set_bf16_use_onednn(saved);
  // 96-term sums of exact products in f32, two orders: ~1e-6 * sum |a b| (<= ~96 * 4).
  // Not bit-equal either: that would mean the switch did not change the path.
  bool differ = false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_NEAR(a.f32()[i], b.f32()[i], 4e-4) << i;
    differ |= bits(a.f32()[i]) != bits(b.f32()[i]);
  }
  EXPECT_TRUE(differ) << "oneDNN's bf16 matmul and sgemm gave the same bits everywhere: was oneDNN used?";
}

// ---------------------------------------------------------------------------------------
// Overflow of F16 results

TEST(OpsPrecisionLinear, F16ResultBeyondTheHalfRangeIsInf) {
  const float inf = std::numeric_limits<float>::infinity();
  Arena arena;
  // Forward, K = 2, inp = [1, 1]. Rows of W (all half values):
  //   [32752, 32752]   -> 65504, the largest half: finite
  //   [32752, 32768]   -> 65520: rounds to inf
  //   [-32752, -32768] -> -inf
  //   [40000, 40000]   -> 80000: inf (in bf16: finite)
  //   [65504, 0]       -> 65504: finite
  const std::vector<float> wv{32752, 32752, 32752, 32768, -32752, -32768, 40000, 40000, 65504, 0};
  Tensor inp = arena.filled(DType::F16, {1, 2}, {1, 1}), w = arena.filled(DType::F16, {5, 2}, wv);
  Tensor out = arena.make(DType::F16, {1, 5});
  ops::linear_forward(out, inp, w, Tensor());
  EXPECT_EQ(values(out), (std::vector<double>{65504, inf, -inf, inf, 65504}));
  // A bias pushing a finite product over the top.
  Tensor b = arena.filled(DType::F16, {5}, {16, 0, 0, 0, -65504});
  ops::linear_forward(out, inp, w, b);
  EXPECT_EQ(values(out), (std::vector<double>{inf, inf, -inf, inf, 0}));  // 65504 + 16 = 65520
  // BF16 has the f32 range: all finite (the operands as bf16: 32752 -> 32768, 40000 -> 39936,
  // 65504 -> 65536; the results are bf16 values, so exact).
  Tensor inp_b = arena.filled(DType::BF16, {1, 2}, {1, 1}), w_b = arena.filled(DType::BF16, {5, 2}, wv);
  Tensor out_b = arena.make(DType::BF16, {1, 5});
  ops::linear_forward(out_b, inp_b, w_b, Tensor());
  EXPECT_EQ(values(out_b), (std::vector<double>{65536, 65536, -65536, 79872, 65536}));

  // Backward, N = 2, C = 2, OC = 1: dout = [[40000], [40000]], W = [[2, 1]],
  // inp = [[2, 0.5], [1, 0.25]], every gradient pre-filled with 1:
  //   dinp rows = 1 + 40000 * [2, 1] = [80001 -> inf, 40001 -> 40000]
  //   dW = 1 + 40000 * [2 + 1, 0.5 + 0.25] = [120001 -> inf, 30001 -> 30000]
  //   dbias = 1 + 80000 -> inf
  // and with f32 weight and bias gradients (the model's mix) those stay finite.
  for (DType g : {DType::F16, DType::F32}) {
    SCOPED_TRACE(name(g));
    Tensor dout = arena.filled(DType::F16, {2, 1}, {40000, 40000}), w1 = arena.filled(DType::F16, {1, 2}, {2, 1});
    Tensor inp2 = arena.filled(DType::F16, {2, 2}, {2, 0.5f, 1, 0.25f});
    Tensor dinp = arena.filled(DType::F16, {2, 2}, {1, 1, 1, 1}), dw = arena.filled(g, {1, 2}, {1, 1});
    Tensor db = arena.filled(g, {1}, {1});
    ops::linear_backward(dinp, dw, db, dout, inp2, w1);
    EXPECT_EQ(values(dinp), (std::vector<double>{inf, 40000, inf, 40000}));
    EXPECT_EQ(values(dw), g == DType::F16 ? (std::vector<double>{inf, 30000}) : (std::vector<double>{120001, 30001}));
    EXPECT_EQ(values(db), g == DType::F16 ? (std::vector<double>{inf}) : (std::vector<double>{80001}));
  }
  // The same in BF16 (dout 40000 -> 39936): finite. dinp: 1 + 79872 and 1 + 39936 round
  // back to the bf16 values 79872 and 39936; f32 dW and dbias keep the 1.
  Tensor dout = arena.filled(DType::BF16, {2, 1}, {40000, 40000}), w1 = arena.filled(DType::BF16, {1, 2}, {2, 1});
  Tensor inp2 = arena.filled(DType::BF16, {2, 2}, {2, 0.5f, 1, 0.25f});
  Tensor dinp = arena.filled(DType::BF16, {2, 2}, {1, 1, 1, 1}), dw = arena.filled(DType::F32, {1, 2}, {1, 1});
  Tensor db = arena.filled(DType::F32, {1}, {1});
  ops::linear_backward(dinp, dw, db, dout, inp2, w1);
  EXPECT_EQ(values(dinp), (std::vector<double>{79872, 39936, 79872, 39936}));
  EXPECT_EQ(values(dw), (std::vector<double>{119809, 29953}));
  EXPECT_EQ(values(db), (std::vector<double>{79873}));
}

// ---------------------------------------------------------------------------------------
// F32 tensors, workspaces, concurrent callers

// All-F32 calls are the bias broadcast plus one sgemm with beta = 1, and accumulating
// sgemms plus bias_add_backward, bit for bit.
TEST(OpsPrecisionLinear, F32TensorsAreOneSgemmBitForBit) {
  Arena arena;
  Tensor inp = arena.normal({3, 40, 70}, 1), w = arena.normal({90, 70}, 2), b = arena.normal({90}, 3);
  Tensor a = arena.f32({3, 40, 90}), direct = arena.f32({120, 90});
  ops::linear_forward(a, inp, w, b);
  for (int n = 0; n < 120; ++n) std::copy(b.f32(), b.f32() + 90, direct.f32() + n * 90);
  ops::cpu::sgemm(false, true, 120, 90, 70, 1.0f, inp.f32(), 70, w.f32(), 70, 1.0f, direct.f32(), 90);
  EXPECT_TRUE(same_bits(a, direct));
  Tensor dout = arena.normal({3, 40, 90}, 4);
  Tensor di1 = arena.normal(inp.shape, 5), dw1 = arena.normal(w.shape, 6), db1 = arena.normal(b.shape, 7);
  Tensor di2 = arena.copy(di1), dw2 = arena.copy(dw1), db2 = arena.copy(db1);
  ops::linear_backward(di1, dw1, db1, dout, inp, w);
  ops::cpu::sgemm(false, false, 120, 70, 90, 1.0f, dout.f32(), 90, w.f32(), 70, 1.0f, di2.f32(), 70);
  ops::cpu::sgemm(true, false, 90, 70, 120, 1.0f, dout.f32(), 90, inp.f32(), 70, 1.0f, dw2.f32(), 70);
  ops::bias_add_backward(db2, dout);
  EXPECT_TRUE(same_bits(di1, di2) && same_bits(dw1, dw2) && same_bits(db1, db2));
}

TEST(OpsPrecisionLinear, WorkspacesDoNotGrowInSteadyState) {
  Arena arena;
  std::vector<std::vector<Tensor>> sets;  // inp, w, b, out, dout, di, dw, db per dtype
  for (DType d : {DType::BF16, DType::F16})
    sets.push_back({arena.normal(d, {64, 96}, 1), arena.normal(d, {160, 96}, 2), arena.normal(d, {160}, 3),
                    arena.make(d, {64, 160}), arena.normal(d, {64, 160}, 4), arena.normal(d, {64, 96}, 5),
                    arena.normal({160, 96}, 6), arena.normal({160}, 7)});
  auto step = [&] {
    for (const std::vector<Tensor>& t : sets) {
      ops::linear_forward(t[3], t[0], t[1], t[2]);
      ops::linear_backward(t[5], t[6], t[7], t[4], t[0], t[1]);
      ops::linear_forward(t[3], t[0], t[1], Tensor());
      ops::linear_backward(t[5], t[6], Tensor(), t[4], t[0], t[1]);
    }
  };
  step();
  const uint64_t after_first = ops::cpu::workspace_allocations();
  step();
  step();
  EXPECT_EQ(ops::cpu::workspace_allocations(), after_first);
}

// Ranks run as threads (the in-process communicator) call the linears concurrently: each
// caller widens into its own workspaces, so results equal the serial ones bit for bit
// (one OpenMP thread per caller in both, so oneDNN blocks the same way).
TEST(OpsPrecisionLinear, ConcurrentCallersGetSerialResults) {
  constexpr int kCallers = 3;
  Arena arena;
  struct Job {
    Tensor inp, w, b, dout, out, di, dw, db;
  };
  std::vector<Job> jobs, serial;
  for (int j = 0; j < kCallers; ++j) {
    const uint32_t s = 100 * static_cast<uint32_t>(j);
    const DType d = j % 2 ? DType::F16 : DType::BF16;
    const int64_t N = 50 + 7 * j, C = 80, OC = 130;
    Job job{arena.normal(d, {N, C}, s), arena.normal(d, {OC, C}, s + 1), arena.normal(d, {OC}, s + 2),
            arena.normal(d, {N, OC}, s + 3), arena.make(d, {N, OC}), arena.normal(d, {N, C}, s + 4),
            arena.normal({OC, C}, s + 5), arena.normal({OC}, s + 6)};
    jobs.push_back(job);
    Job copy = job;
    copy.out = arena.make(d, {N, OC});
    copy.di = arena.copy(job.di);
    copy.dw = arena.copy(job.dw);
    copy.db = arena.copy(job.db);
    serial.push_back(copy);
  }
  auto run = [](const Job& j) {
    for (int rep = 0; rep < 5; ++rep) {
      ops::linear_forward(j.out, j.inp, j.w, j.b);
      ops::linear_backward(j.di, j.dw, j.db, j.dout, j.inp, j.w);
    }
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const Job& j : serial) run(j);
  omp_set_num_threads(saved);
  std::vector<std::thread> threads;
  for (const Job& j : jobs)
    threads.emplace_back([&run, &j] {
      omp_set_num_threads(1);
      run(j);
    });
  for (std::thread& t : threads) t.join();
  for (int j = 0; j < kCallers; ++j) {
    EXPECT_TRUE(same_bits(jobs[j].out, serial[j].out)) << j;
    EXPECT_TRUE(same_bits(jobs[j].di, serial[j].di) && same_bits(jobs[j].dw, serial[j].dw) &&
                same_bits(jobs[j].db, serial[j].db))
        << j;
  }
}

}  // namespace
