// The linear layers' math modes (ops.h MathMode) on the CPU backend:
// - the rounding routines (cpu/low_precision.h) against known bit patterns, against the
//   F16C conversion instructions where the build has them, and the array versions
//   against the scalar ones;
// - BF16 and FP16 linear forward/backward against a double-precision GEMM of operands
//   rounded the same way by the scalar routines (only f32 accumulation error allowed,
//   and for FP16 the rounding of the result to half), and against the F32 result within
//   each format's error;
// - FP16 overflow gives inf; F32 mode is the old code bit for bit; tiling of the weight
//   rows, steady-state workspaces, concurrent callers; the bf16 GEMM (oneDNN where this
//   CPU has a bf16 kernel, the f32-expansion fallback where not) against the reference.
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
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/ops.h"

using namespace tessera;
using ops::MathMode;
using ops::cpu::bf16_bits;
using ops::cpu::fp16_bits;
using ops::cpu::fp16_to_f32;

namespace {

// ---------------------------------------------------------------------------------------
// Helpers

class Arena {
 public:
  Tensor f32(Shape s) {
    Tensor t(nullptr, DType::F32, std::move(s), &cpu_device());
    buffers_.emplace_back(cpu_device(), std::max<size_t>(t.bytes(), 1));
    t.handle = buffers_.back().handle();
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
    Tensor t = f32(src.shape);
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

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
bool same_bits(const Tensor& a, const Tensor& b) { return std::memcmp(a.host<void>(), b.host<void>(), a.bytes()) == 0; }

// The operand values a mode multiplies, by the scalar routines.
float rounded(float x, MathMode mode) {
  return mode == MathMode::BF16 ? ops::cpu::round_bf16(x) : mode == MathMode::FP16 ? ops::cpu::round_fp16(x) : x;
}
std::vector<double> rounded(const Tensor& t, MathMode mode) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = rounded(t.f32()[i], mode);
  return v;
}

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

// got (f32) is `exact` accumulated in f32, then (half_out) rounded to half. For half the
// result must be a half value and equal to the exact value rounded to half, except where
// the exact value lies within the accumulation error of a rounding tie between got and
// the other neighbour.
void expect_result(float got, const Exact& exact, bool half_out, const std::string& what) {
  const double tol = kAccumulation * exact.magnitude + 1e-30;
  if (!half_out) {
    EXPECT_NEAR(got, exact.value, tol) << what;
    return;
  }
  EXPECT_EQ(bits(ops::cpu::round_fp16(got)), bits(got)) << what << ": " << got << " is not a half value";
  const float want = ops::cpu::round_fp16(static_cast<float>(exact.value));
  if (bits(got) == bits(want)) return;
  const double tie = 0.5 * (static_cast<double>(got) + static_cast<double>(want));
  EXPECT_LE(std::fabs(exact.value - tie), tol)
      << what << ": got " << got << ", exact " << exact.value << " rounds to " << want
      << " and is not within the f32 accumulation error of the tie between them";
}

// Relative L2 distance of a to b.
double relative_error(const Tensor& a, const Tensor& b) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(a.f32()[i]) - b.f32()[i];
    num += d * d;
    den += static_cast<double>(b.f32()[i]) * b.f32()[i];
  }
  return std::sqrt(num / den);
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

// The scalar routines against the hardware and core/dtype.h's f32_to_f16, and the array routines (vector instructions,
// OpenMP, tails) against the scalar ones, over a sweep of every 101st f32 bit pattern plus,
// for every half, the f32 values at, just below and just above the tie with its
// successor.
TEST(OpsPrecisionRounding, ArraysMatchScalarRoutinesAndHardware) {
  std::vector<float> ties;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const double lo = fp16_to_f32(static_cast<uint16_t>(h | sign));
      const double hi = h + 1 == 0x7C00 ? (sign ? -65536.0 : 65536.0) : fp16_to_f32(static_cast<uint16_t>((h + 1) | sign));
      const float tie = static_cast<float>(0.5 * (lo + hi));  // exact in f32
      ties.push_back(tie);
      ties.push_back(std::nextafter(tie, 0.0f));
      ties.push_back(std::nextafter(tie, std::numeric_limits<float>::infinity() * (sign ? -1.0f : 1.0f)));
    }
  }
  int64_t mismatches = 0, checked = 0;
  std::vector<float> src, half, bf;
  std::vector<uint16_t> bfbits;
  auto check = [&] {
    const int64_t n = static_cast<int64_t>(src.size());
    half.resize(src.size());
    bf.resize(src.size());
    bfbits.resize(src.size());
    ops::cpu::round_fp16(half.data(), src.data(), 1, n, n);
    ops::cpu::round_bf16(bf.data(), src.data(), 1, n, n);
    ops::cpu::convert_bf16(bfbits.data(), src.data(), 1, n, n);
    for (size_t i = 0; i < src.size(); ++i) {
      const float x = src[i];
      const uint32_t want_half = bits(ops::cpu::round_fp16(x)), want_bf = bits(ops::cpu::round_bf16(x));
      bool ok = bits(half[i]) == want_half && bits(bf[i]) == want_bf && bfbits[i] == bf16_bits(x);
      ok = ok && fp16_bits(x) == f32_to_f16(x);  // core/dtype.h, through GCC's _Float16
#if defined(__F16C__)
      ok = ok && fp16_bits(x) == _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
      if (!ok && ++mismatches <= 5)
        ADD_FAILURE() << "input bits " << std::hex << bits(x) << ": half " << bits(half[i]) << " vs scalar "
                      << want_half << ", bf16 " << bits(bf[i]) << " vs " << want_bf;
    }
    checked += n;
    src.clear();
  };
  src = ties;
  check();
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 101) {
    src.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
    if (src.size() == (1u << 20)) check();
  }
  check();
  EXPECT_EQ(mismatches, 0) << "of " << checked << " inputs";
  // A strided block (rows with a leading dimension) and an in-place contiguous one.
  std::vector<float> block(7 * 40), got(7 * 33), in_place;
  for (size_t i = 0; i < block.size(); ++i) block[i] = ties[i * 9973 % ties.size()];
  ops::cpu::round_fp16(got.data(), block.data(), 7, 33, 40);
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 33; ++c)
      ASSERT_EQ(bits(got[r * 33 + c]), bits(ops::cpu::round_fp16(block[r * 40 + c])));
  in_place = block;
  ops::cpu::round_fp16(in_place.data(), in_place.data(), 7, 40, 40);
  for (size_t i = 0; i < block.size(); ++i) ASSERT_EQ(bits(in_place[i]), bits(ops::cpu::round_fp16(block[i])));

  // Several conversions in one region: a broadcast (ld = 0), a strided block, a large
  // contiguous one (many chunks) and bf16 bits.
  using ops::cpu::Conversion;
  const int64_t big = 100000;
  std::vector<float> bcast(5 * 33), strided(7 * 33), flat(static_cast<size_t>(big));
  std::vector<uint16_t> b16(7 * 33);
  const Conversion jobs[] = {{Conversion::Fp16Round, bcast.data(), block.data(), 5, 33, 0},
                             {Conversion::Bf16Round, strided.data(), block.data(), 7, 33, 40},
                             {Conversion::Fp16Round, flat.data(), ties.data(), 1, big, big},
                             {Conversion::Bf16Bits, b16.data(), block.data(), 7, 33, 40},
                             {Conversion::Copy, got.data(), block.data(), 7, 33, 40}};
  ops::cpu::convert_all(jobs, 5);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 33; ++c) ASSERT_EQ(bits(bcast[r * 33 + c]), bits(ops::cpu::round_fp16(block[c])));
  for (int r = 0; r < 7; ++r) {
    for (int c = 0; c < 33; ++c) {
      ASSERT_EQ(bits(strided[r * 33 + c]), bits(ops::cpu::round_bf16(block[r * 40 + c])));
      ASSERT_EQ(b16[r * 33 + c], bf16_bits(block[r * 40 + c]));
      ASSERT_EQ(bits(got[r * 33 + c]), bits(block[r * 40 + c]));
    }
  }
  for (int64_t i = 0; i < big; ++i) ASSERT_EQ(bits(flat[i]), bits(ops::cpu::round_fp16(ties[i])));
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
// Linear in BF16 / FP16 against double references on the rounded operands

struct LinearCase {
  int64_t B = 2, T = 19, C = 67, OC = 45;
  int64_t N() const { return B * T; }
};

// Forward: out = inp_r @ W_r^T + b (b_r for FP16), then for FP16 rounded to half.
void check_forward(MathMode mode, const LinearCase& lc, uint32_t seed) {
  Arena arena;
  const int64_t N = lc.N(), C = lc.C, OC = lc.OC;
  Tensor inp = arena.normal({lc.B, lc.T, C}, seed), w = arena.normal({OC, C}, seed + 1);
  Tensor bias = arena.normal({OC}, seed + 2);
  Tensor out = arena.f32({lc.B, lc.T, OC}), out_nb = arena.f32({lc.B, lc.T, OC});
  out.f32()[0] = std::numeric_limits<float>::quiet_NaN();  // old contents must not leak in
  ops::linear_forward(out, inp, w, bias, mode);
  ops::linear_forward(out_nb, inp, w, Tensor(), mode);
  const std::vector<double> x = rounded(inp, mode), wr = rounded(w, mode);
  const bool half = mode == MathMode::FP16;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      Exact e;
      for (int64_t c = 0; c < C; ++c) e.add(x[static_cast<size_t>(n * C + c)], wr[static_cast<size_t>(o * C + c)]);
      const std::string at = " at " + std::to_string(n) + "," + std::to_string(o);
      expect_result(out_nb.f32()[n * OC + o], e, half, "no bias" + at);
      e.add(rounded(bias.f32()[o], half ? MathMode::FP16 : MathMode::F32), 1.0);
      expect_result(out.f32()[n * OC + o], e, half, "bias" + at);
      if (::testing::Test::HasFailure()) return;
    }
  }
  // Against the F32 result: the operand rounding (relative 2^-9 per bf16 operand, 2^-12
  // per half, uniform) gives a relative L2 error of ~0.8 u: ~3e-3 for bf16 and ~4e-4 for
  // half (plus half the output rounding). Bounds: 1e-2 and 1e-3.
  Tensor ref = arena.f32(out.shape);
  ops::linear_forward(ref, inp, w, bias, MathMode::F32);
  const double err = relative_error(out, ref);
  EXPECT_LE(err, half ? 1e-3 : 1e-2);
  EXPECT_GT(err, half ? 1e-5 : 1e-4) << "the operands were not rounded";
}

// Backward onto pre-filled gradients. BF16: dinp/dW are the f32-accumulated exact sums
// added to the old values, dbias the F32 mode's bits. FP16: each contribution (checked
// on zeroed gradients) is the exact sum rounded to half, and pre-filled gradients get
// exactly old + contribution.
void check_backward(MathMode mode, const LinearCase& lc, uint32_t seed) {
  Arena arena;
  const int64_t N = lc.N(), C = lc.C, OC = lc.OC;
  Tensor inp = arena.normal({lc.B, lc.T, C}, seed), w = arena.normal({OC, C}, seed + 1);
  Tensor dout = arena.normal({lc.B, lc.T, OC}, seed + 2);
  Tensor dinp = arena.normal(inp.shape, seed + 3), dw = arena.normal(w.shape, seed + 4);
  Tensor db = arena.normal({OC}, seed + 5);
  const Tensor dinp0 = arena.copy(dinp), dw0 = arena.copy(dw), db0 = arena.copy(db);
  ops::linear_backward(dinp, dw, db, dout, inp, w, mode);
  const std::vector<double> x = rounded(inp, mode), wr = rounded(w, mode), g = rounded(dout, mode);
  const bool half = mode == MathMode::FP16;

  std::vector<Exact> e_dinp(static_cast<size_t>(N * C)), e_dw(static_cast<size_t>(OC * C)),
      e_db(static_cast<size_t>(OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t o = 0; o < OC; ++o)
        e_dinp[static_cast<size_t>(n * C + c)].add(g[static_cast<size_t>(n * OC + o)], wr[static_cast<size_t>(o * C + c)]);
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t c = 0; c < C; ++c)
      for (int64_t n = 0; n < N; ++n)
        e_dw[static_cast<size_t>(o * C + c)].add(g[static_cast<size_t>(n * OC + o)], x[static_cast<size_t>(n * C + c)]);
    for (int64_t n = 0; n < N; ++n) e_db[static_cast<size_t>(o)].add(g[static_cast<size_t>(n * OC + o)], 1.0);
  }

  if (!half) {
    // old + contribution, one more f32 rounding of a sum of size ~|old| + |contribution|.
    auto expect_accumulated = [](const Tensor& got, const Tensor& old, std::vector<Exact> e, const char* what) {
      for (int64_t i = 0; i < got.numel(); ++i) {
        Exact& x = e[static_cast<size_t>(i)];
        x.add(old.f32()[i], 1.0);
        expect_result(got.f32()[i], x, false, std::string(what) + " element " + std::to_string(i));
        if (::testing::Test::HasFailure()) return;
      }
    };
    expect_accumulated(dinp, dinp0, e_dinp, "dinp");
    expect_accumulated(dw, dw0, e_dw, "dweight");
    Tensor db_f32 = arena.copy(db0);
    ops::linear_backward(Tensor(), Tensor(), db_f32, dout, inp, w, MathMode::F32);
    EXPECT_TRUE(same_bits(db, db_f32)) << "BF16's dbias must be F32's column sums";
  } else {
    Tensor zi = arena.zeros_like(dinp), zw = arena.zeros_like(dw), zb = arena.zeros_like(db);
    ops::linear_backward(zi, zw, zb, dout, inp, w, mode);
    auto expect_contribution = [&](const Tensor& fresh, const Tensor& got, const Tensor& old,
                                   const std::vector<Exact>& e, const char* what) {
      for (int64_t i = 0; i < got.numel(); ++i) {
        expect_result(fresh.f32()[i], e[static_cast<size_t>(i)], true, std::string(what) + " element " + std::to_string(i));
        ASSERT_EQ(bits(got.f32()[i]), bits(old.f32()[i] + fresh.f32()[i])) << what << " accumulation at " << i;
        if (::testing::Test::HasFailure()) return;
      }
    };
    expect_contribution(zi, dinp, dinp0, e_dinp, "dinp");
    expect_contribution(zw, dw, dw0, e_dw, "dweight");
    expect_contribution(zb, db, db0, e_db, "dbias");
  }

  // Against F32 (contributions only, from zeroed buffers): as for the forward.
  Tensor fi = arena.zeros_like(dinp), fw = arena.zeros_like(dw), mi = arena.zeros_like(dinp), mw = arena.zeros_like(dw);
  ops::linear_backward(fi, fw, Tensor(), dout, inp, w, MathMode::F32);
  ops::linear_backward(mi, mw, Tensor(), dout, inp, w, mode);
  for (auto [m, f] : {std::pair{mi, fi}, std::pair{mw, fw}}) {
    const double err = relative_error(m, f);
    EXPECT_LE(err, half ? 1e-3 : 1e-2);
    EXPECT_GT(err, half ? 1e-5 : 1e-4) << "the operands were not rounded";
  }
}

TEST(OpsPrecisionLinear, Bf16ForwardMatchesRoundedDoubleReference) { check_forward(MathMode::BF16, {}, 1); }
TEST(OpsPrecisionLinear, Bf16BackwardMatchesRoundedDoubleReference) { check_backward(MathMode::BF16, {}, 11); }
TEST(OpsPrecisionLinear, Fp16ForwardMatchesRoundedDoubleReference) { check_forward(MathMode::FP16, {}, 21); }
TEST(OpsPrecisionLinear, Fp16BackwardMatchesRoundedDoubleReference) { check_backward(MathMode::FP16, {}, 31); }

// The weight rows in several tiles (the LM head's case, forced on small shapes with a
// tiny tile budget: tiles of 64 rows, the last one ragged) give the same function.
TEST(OpsPrecisionLinear, TiledWeightRowsMatchReference) {
  TileElements tiny(1);
  LinearCase lc;
  lc.OC = 150;  // tiles of 64, 64, 22
  for (MathMode mode : {MathMode::BF16, MathMode::FP16}) {
    SCOPED_TRACE(mode == MathMode::BF16 ? "BF16" : "FP16");
    check_forward(mode, lc, 41);
    check_backward(mode, lc, 51);
  }
}

// The bf16 GEMM through oneDNN and the rounded-f32 emulation compute the same function
// (only summation order differs). Skipped on CPUs without a oneDNN bf16 kernel, where
// the emulation is the only path (and is what the tests above check).
TEST(OpsPrecisionLinear, Bf16OneDnnAndEmulationAgree) {
  if (!ops::cpu::onednn_bf16_available()) GTEST_SKIP() << "no oneDNN bf16 kernel on this CPU";
  const bool saved = ops::cpu::set_bf16_use_onednn(false);
  check_forward(MathMode::BF16, {}, 61);
  check_backward(MathMode::BF16, {}, 71);
  ops::cpu::set_bf16_use_onednn(saved);
  ASSERT_TRUE(ops::cpu::bf16_uses_onednn());
  Arena arena;
  Tensor inp = arena.normal({64, 96}, 1), w = arena.normal({200, 96}, 2), a = arena.f32({64, 200}),
         b = arena.f32({64, 200});
  ops::linear_forward(a, inp, w, Tensor(), MathMode::BF16);
  ops::cpu::set_bf16_use_onednn(false);
  ops::linear_forward(b, inp, w, Tensor(), MathMode::BF16);
  ops::cpu::set_bf16_use_onednn(saved);
  // 96-term sums of exact products in f32, two orders: ~1e-6 * sum |a b| (<= ~96 * 4).
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.f32()[i], b.f32()[i], 4e-4) << i;
}

// ---------------------------------------------------------------------------------------
// FP16 overflow

TEST(OpsPrecisionLinear, Fp16OverflowIsInf) {
  const float inf = std::numeric_limits<float>::infinity();
  Arena arena;
  // Forward, K = 2, inp = [1, 1]. Rows of W (all halves unless said):
  //   [32752, 32752]  -> 65504, the largest half: finite
  //   [32752, 32768]  -> 65520: the result rounds to inf
  //   [-32752, -32768] -> -inf
  //   [65520, 0]      -> the operand itself rounds to inf
  //   [65519, 0]      -> the operand rounds to 65504: finite
  //   [40000, 40000]  -> 80000: inf (bf16: finite)
  Tensor inp = arena.filled({1, 2}, {1, 1});
  Tensor w = arena.filled({6, 2}, {32752, 32752, 32752, 32768, -32752, -32768, 65520, 0, 65519, 0, 40000, 40000});
  Tensor out = arena.f32({1, 6});
  ops::linear_forward(out, inp, w, Tensor(), MathMode::FP16);
  EXPECT_EQ(out.f32()[0], 65504.0f);
  EXPECT_EQ(out.f32()[1], inf);
  EXPECT_EQ(out.f32()[2], -inf);
  EXPECT_EQ(out.f32()[3], inf);
  EXPECT_EQ(out.f32()[4], 65504.0f);
  EXPECT_EQ(out.f32()[5], inf);
  // A bias pushing a finite product over the top; and a bias beyond the range.
  Tensor b = arena.filled({6}, {16, 0, 0, 0, -65504, 70000});
  ops::linear_forward(out, inp, w, b, MathMode::FP16);
  EXPECT_EQ(out.f32()[0], inf);        // 65504 + 16 = 65520
  EXPECT_EQ(out.f32()[4], 0.0f);       // 65504 - 65504
  EXPECT_EQ(out.f32()[5], inf);
  // BF16 has the f32 range: all finite, and exact here (bf16 values with short mantissas).
  ops::linear_forward(out, inp, w, Tensor(), MathMode::BF16);
  EXPECT_EQ(std::vector<float>(out.f32(), out.f32() + 6),
            (std::vector<float>{65536, 65536, -65536, 65536, 65536, 79872}));  // bf16(32752) = 32768, bf16(40000) = 39936

  // Backward, N = 2, C = 2, OC = 1: dout = [[40000], [40000]], W = [[2, 1]], inp = [[2, 0.5], [1, 0.25]].
  //   dinp rows = 40000 * [2, 1] = [80000 -> inf, 40000]
  //   dW = 40000 * [2 + 1, 0.5 + 0.25] = [120000 -> inf, 30000]
  //   dbias = 80000 -> inf
  Tensor dout = arena.filled({2, 1}, {40000, 40000}), w1 = arena.filled({1, 2}, {2, 1});
  Tensor inp2 = arena.filled({2, 2}, {2, 0.5f, 1, 0.25f});
  Tensor dinp = arena.filled({2, 2}, {1, 1, 1, 1}), dw = arena.filled({1, 2}, {1, 1}), db = arena.filled({1}, {1});
  ops::linear_backward(dinp, dw, db, dout, inp2, w1, MathMode::FP16);
  EXPECT_EQ(std::vector<float>(dinp.f32(), dinp.f32() + 4), (std::vector<float>{inf, 40001, inf, 40001}));
  EXPECT_EQ(std::vector<float>(dw.f32(), dw.f32() + 2), (std::vector<float>{inf, 30001}));
  EXPECT_EQ(db.f32()[0], inf);
  // The same in BF16: finite (f32 gradients; the operands are bf16 values except 40000 -> 39936).
  Tensor dinp_b = arena.filled({2, 2}, {1, 1, 1, 1}), dw_b = arena.filled({1, 2}, {1, 1}), db_b = arena.filled({1}, {1});
  ops::linear_backward(dinp_b, dw_b, db_b, dout, inp2, w1, MathMode::BF16);
  EXPECT_EQ(std::vector<float>(dinp_b.f32(), dinp_b.f32() + 4), (std::vector<float>{79873, 39937, 79873, 39937}));
  EXPECT_EQ(std::vector<float>(dw_b.f32(), dw_b.f32() + 2), (std::vector<float>{119809, 29953}));
  EXPECT_EQ(db_b.f32()[0], 80001.0f);  // dbias in f32 from the f32 dout
}

// ---------------------------------------------------------------------------------------
// F32 unchanged, workspaces, concurrent callers

TEST(OpsPrecisionLinear, F32ModeIsTheDefaultBitForBit) {
  Arena arena;
  Tensor inp = arena.normal({3, 40, 70}, 1), w = arena.normal({90, 70}, 2), b = arena.normal({90}, 3);
  Tensor a = arena.f32({3, 40, 90}), e = arena.f32({3, 40, 90}), direct = arena.f32({120, 90});
  ops::linear_forward(a, inp, w, b);
  ops::linear_forward(e, inp, w, b, MathMode::F32);
  EXPECT_TRUE(same_bits(a, e));
  // ... and is the bias broadcast plus one sgemm with beta = 1.
  for (int n = 0; n < 120; ++n) std::copy(b.f32(), b.f32() + 90, direct.f32() + n * 90);
  ops::cpu::sgemm(false, true, 120, 90, 70, 1.0f, inp.f32(), 70, w.f32(), 70, 1.0f, direct.f32(), 90);
  EXPECT_TRUE(same_bits(a, direct));
  Tensor dout = arena.normal({3, 40, 90}, 4);
  Tensor di1 = arena.normal(inp.shape, 5), dw1 = arena.normal(w.shape, 6), db1 = arena.normal(b.shape, 7);
  Tensor di2 = arena.copy(di1), dw2 = arena.copy(dw1), db2 = arena.copy(db1);
  ops::linear_backward(di1, dw1, db1, dout, inp, w);
  ops::linear_backward(di2, dw2, db2, dout, inp, w, MathMode::F32);
  EXPECT_TRUE(same_bits(di1, di2) && same_bits(dw1, dw2) && same_bits(db1, db2));
}

TEST(OpsPrecisionLinear, WorkspacesDoNotGrowInSteadyState) {
  Arena arena;
  Tensor inp = arena.normal({64, 96}, 1), w = arena.normal({160, 96}, 2), b = arena.normal({160}, 3);
  Tensor out = arena.f32({64, 160}), dout = arena.normal({64, 160}, 4);
  Tensor di = arena.f32(inp.shape), dw = arena.f32(w.shape), db = arena.f32(b.shape);
  auto step = [&] {
    for (MathMode mode : {MathMode::BF16, MathMode::FP16}) {
      ops::linear_forward(out, inp, w, b, mode);
      ops::linear_backward(di, dw, db, dout, inp, w, mode);
      ops::linear_forward(out, inp, w, Tensor(), mode);
      ops::linear_backward(di, dw, Tensor(), dout, inp, w, mode);
    }
  };
  step();
  const uint64_t after_first = ops::cpu::workspace_allocations();
  step();
  step();
  EXPECT_EQ(ops::cpu::workspace_allocations(), after_first);
}

// Ranks run as threads (the in-process communicator) call the linears concurrently: each
// caller converts into its own workspaces, so results equal the serial ones bit for bit
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
    const int64_t N = 50 + 7 * j, C = 80, OC = 130;
    Job job{arena.normal({N, C}, s), arena.normal({OC, C}, s + 1), arena.normal({OC}, s + 2),
            arena.normal({N, OC}, s + 3), arena.f32({N, OC}), arena.normal({N, C}, s + 4),
            arena.normal({OC, C}, s + 5), arena.normal({OC}, s + 6)};
    jobs.push_back(job);
    Job copy = job;
    copy.out = arena.f32({N, OC});
    copy.di = arena.copy(job.di);
    copy.dw = arena.copy(job.dw);
    copy.db = arena.copy(job.db);
    serial.push_back(copy);
  }
  auto run = [](const Job& j) {
    for (int rep = 0; rep < 5; ++rep) {
      for (MathMode mode : {MathMode::BF16, MathMode::FP16}) {
        ops::linear_forward(j.out, j.inp, j.w, j.b, mode);
        ops::linear_backward(j.di, j.dw, j.db, j.dout, j.inp, j.w, mode);
      }
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
