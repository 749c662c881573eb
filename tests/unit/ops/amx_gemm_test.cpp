// The linear layer's AMX GEMMs (ops/cpu/amx_gemm.h) against a double-precision GEMM of the same
// bf16 values: forward (assigned and accumulated onto a bias-like start, y with a wider leading
// dimension) and weight gradient (accumulated), on shapes whose block counts are odd (multiples of 32, not of
// 64) and on dy with a leading dimension wider than OC. Random operands: a tile stored in the
// wrong place or order is off by O(1), far beyond the f32 summation bound checked here.
// Skipped where the CPU or the build has no AMX.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/ops/cpu/amx_gemm.h"

namespace {

using tessera::ops::cpu::amx_linear_dweight;
using tessera::ops::cpu::amx_linear_fits;
using tessera::ops::cpu::amx_linear_forward;

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& e : v) e = tessera::f32_to_bf16(u(rng));
  return v;
}

std::vector<float> random_f32(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& e : v) e = u(rng);
  return v;
}

double value(uint16_t bits) { return tessera::bf16_to_f32(bits); }

// got[i] against want[i] = start[i] + sum_k terms, |error| within f32 summation of K products:
// K * 2^-23 * sum |terms| (plus the start's own rounding).
struct Expected {
  double sum = 0.0, magnitude = 0.0;
  void add(double t) { sum += t, magnitude += std::fabs(t); }
};
void expect_near(const Expected& e, double start, float got, int64_t K, const char* what, int64_t i) {
  const double bound = K * std::ldexp(1.0, -23) * (e.magnitude + std::fabs(start)) + 1e-30;
  ASSERT_LE(std::fabs(got - (start + e.sum)), bound) << what << " element " << i;
}

struct Shape {
  int64_t N, C, OC;
};

class AmxLinear : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!amx_linear_fits(32, 32, 32)) GTEST_SKIP() << "no AMX-BF16 here";
  }
};

TEST_P(AmxLinear, ForwardAssignsAndAccumulatesIntoStridedY) {
  const auto [N, C, OC] = GetParam();
  std::mt19937 rng(1);
  const auto x = random_bf16(N * C, rng), w = random_bf16(OC * C, rng);
  const int64_t ldy = OC + 32;
  for (bool accumulate : {false, true}) {
    const auto start = random_f32(N * ldy, rng);
    std::vector<float> y = start;
    amx_linear_forward(y.data(), ldy, x.data(), w.data(), N, C, OC, accumulate);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < ldy; ++o) {
        const int64_t i = n * ldy + o;
        if (o >= OC) {
          ASSERT_EQ(y[i], start[i]) << "forward wrote past OC at " << i;
          continue;
        }
        Expected e;
        for (int64_t c = 0; c < C; ++c) e.add(value(x[n * C + c]) * value(w[o * C + c]));
        expect_near(e, accumulate ? start[i] : 0.0, y[i], C, "forward", i);
      }
  }
}

TEST_P(AmxLinear, WeightGradientAssignsAndAccumulates) {
  const auto [N, C, OC] = GetParam();
  std::mt19937 rng(3);
  const int64_t lddy = OC + 32;
  const auto dy = random_bf16(N * lddy, rng), x = random_bf16(N * C, rng);
  for (bool accumulate : {false, true}) {
    const auto start = random_f32(OC * C, rng);
    std::vector<float> dw = start;
    amx_linear_dweight(dw.data(), dy.data(), lddy, x.data(), N, C, OC, accumulate);
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < C; ++c) {
        Expected e;
        for (int64_t n = 0; n < N; ++n) e.add(value(dy[n * lddy + o]) * value(x[n * C + c]));
        expect_near(e, accumulate ? start[o * C + c] : 0.0, dw[o * C + c], N, "dW", o * C + c);
      }
  }
}

// Odd block counts (96 = 3 x 32), one block, and long output dimensions (OC = 1216, 2400).
INSTANTIATE_TEST_SUITE_P(Shapes, AmxLinear,
                         ::testing::Values(Shape{32, 32, 32}, Shape{96, 160, 224}, Shape{64, 96, 1216},
                                           Shape{32, 64, 2400}));

TEST(AmxLinearFits, OnlyMultiplesOf32) {
  const bool amx = amx_linear_fits(32, 32, 32);
  EXPECT_EQ(amx_linear_fits(256, 768, 2304), amx);
  EXPECT_FALSE(amx_linear_fits(48, 32, 32));
  EXPECT_FALSE(amx_linear_fits(32, 48, 32));
  EXPECT_FALSE(amx_linear_fits(32, 32, 16));
  EXPECT_FALSE(amx_linear_fits(0, 32, 32));
}

}  // namespace
