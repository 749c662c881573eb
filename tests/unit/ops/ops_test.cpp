// The CPU kernels of ops.h against independent references:
// - every backward against central finite differences of L = sum(out * R) (R fixed and
//   random), perturbing inputs and parameters; gradient buffers are pre-filled with
//   random values so a kernel that sets instead of accumulating fails;
// - forwards against direct formulas evaluated in double;
// - the oneDNN GEMM against the triple-loop reference GEMM;
// - dropout masks against core/rng.h's scalar Philox, and their key/shard properties;
// - AdamW / SGD against the torch update rules stepped in double;
// - the tensor-parallel pieces (vocabulary shards of the embedding and cross-entropy,
//   sequence-parallel regrouping) against their unsharded versions, the reductions
//   between ranks done by hand; index and shape checks as death tests.
// Each tolerance sits next to its case with the reason for its size. The first tests
// check that the finite-difference checker itself rejects wrong gradients.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/rng.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/ops/cpu/fast_math.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/ops.h"
#include "float64_reference.h"
#include "grad_check.h"

using namespace tessera;
using namespace tessera::ops_test;

namespace {

// ---------------------------------------------------------------------------------------
// The checker itself must fail on wrong gradients (sign, factor, set-vs-accumulate).

TEST(OpsGradCheck, RejectsWrongGradients) {
  Arena arena;
  Tensor x = arena.normal({4, 6}, 1), out = arena.f32({4, 6}), R = arena.normal({4, 6}, 2);
  auto fwd = [&] { ops::gelu_forward(out, x, ops::GeluKind::Tanh); };
  auto loss = [&] { fwd(); return weighted_sum(out, R); };
  Grad g(arena, x, 3);
  ops::gelu_backward(g.t, R, x, ops::GeluKind::Tanh);
  std::vector<double> right = g.analytic(), negated = right, doubled = right, overwritten = right;
  for (size_t i = 0; i < right.size(); ++i) {
    negated[i] = -right[i];
    doubled[i] = 2 * right[i];
    overwritten[i] = right[i] - g.prefill[i];  // what a kernel that sets instead of adds would give
  }
  EXPECT_TRUE(compare_gradient(x, right, loss, 1e-3f, 2e-4, 1e-3).ok);
  EXPECT_FALSE(compare_gradient(x, negated, loss, 1e-3f, 2e-4, 1e-3).ok);
  EXPECT_FALSE(compare_gradient(x, doubled, loss, 1e-3f, 2e-4, 1e-3).ok);
  EXPECT_FALSE(compare_gradient(x, overwritten, loss, 1e-3f, 2e-4, 1e-3).ok);
}

// ---------------------------------------------------------------------------------------
// Fast math

TEST(OpsFastMath, ExpMatchesLibmWithinTwoUlp) {
  // Cephes' polynomial is good to ~1 ulp on the reduced range; the range reduction and
  // the final rounding add at most another, so 2 ulp (2^-22 relative) with margin 2.5.
  float worst = 0.0f;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + (88.3f + 87.0f) * static_cast<float>(i) / 200000.0f;
    const double ref = std::exp(static_cast<double>(x));
    const double rel = std::fabs(ops::cpu::exp_approx(x) - ref) / ref;
    worst = std::max(worst, static_cast<float>(rel));
  }
  EXPECT_LT(worst, 2.5f * 1.1920929e-7f);
  EXPECT_EQ(ops::cpu::exp_approx(0.0f), 1.0f);
  EXPECT_EQ(ops::cpu::exp_approx(-10000.0f), 0.0f);  // Megatron's mask fill underflows to 0
  EXPECT_EQ(ops::cpu::exp_approx(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(ops::cpu::exp_approx(std::numeric_limits<float>::quiet_NaN())));
}

TEST(OpsFastMath, ExpFastMatchesLibmWithinOneUlp) {
  // The minimax polynomial's error is 1.9e-9 relative, so the roundings dominate: measured
  // worst 0.98 ulp over [-87.3, 88]; bound 1.5 ulp (a Taylor polynomial of the same degree
  // is off by ~3 ulp at the range's ends). Each lane of a vector gives the scalar's bits.
  typedef float V4 __attribute__((vector_size(4 * sizeof(float))));
  typedef int32_t I4 __attribute__((vector_size(4 * sizeof(int32_t))));
  double worst = 0.0;
  for (int i = 0; i <= 400000; ++i) {
    const float x = -87.3f + (88.0f + 87.3f) * static_cast<float>(i) / 400000.0f;
    const double ref = std::exp(static_cast<double>(x));
    const float ulp = std::nextafter(static_cast<float>(ref), INFINITY) - static_cast<float>(ref);
    worst = std::max(worst, std::fabs(ops::cpu::exp_fast(x) - ref) / ulp);
    const V4 lanes = ops::cpu::exp_fast_of<V4, I4>(V4{x, x, x, x});
    ASSERT_EQ(lanes[3], ops::cpu::exp_fast(x)) << x;
  }
  EXPECT_LT(worst, 1.5);
  EXPECT_EQ(ops::cpu::exp_fast(0.0f), 1.0f);  // the online softmax's unchanged max
  EXPECT_EQ(ops::cpu::exp_fast(-88.0f), 0.0f);
  EXPECT_EQ(ops::cpu::exp_fast(-std::numeric_limits<float>::infinity()), 0.0f);  // masked scores
  EXPECT_GT(ops::cpu::exp_fast(-87.3f), 0.0f);
  EXPECT_EQ(ops::cpu::exp_fast(1000.0f), ops::cpu::exp_fast(88.0f));  // saturates
  EXPECT_TRUE(std::isnan(ops::cpu::exp_fast(std::numeric_limits<float>::quiet_NaN())));
}

TEST(OpsFastMath, ErfWithinAbramowitzStegunBound) {
  // A&S 7.1.26 is good to 1.5e-7 absolute in exact arithmetic. In float, 1 - t P(t)
  // exp(-x^2) subtracts a term close to 1 near x = 0, whose ~4 roundings (6e-8 each)
  // add up to ~3e-7 absolute (measured worst: 4.7e-7). Bound 6e-7; GeLU multiplies
  // the error by |x|/2, so it is harmless there (and PyTorch's CPU GeLU has the same).
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -6.0f + 12.0f * static_cast<float>(i) / 200000.0f;
    worst = std::max(worst, std::fabs(ops::cpu::erf_approx(x) - std::erf(static_cast<double>(x))));
  }
  EXPECT_LT(worst, 6e-7);
  EXPECT_EQ(ops::cpu::erf_approx(0.0f), 0.0f);
  EXPECT_EQ(ops::cpu::erf_approx(20.0f), 1.0f);
  EXPECT_EQ(ops::cpu::erf_approx(-20.0f), -1.0f);
}

// ---------------------------------------------------------------------------------------
// GEMM: oneDNN against the reference, all transpose combinations, odd shapes, padded
// leading dimensions, alpha/beta.

TEST(OpsGemm, OneDnnMatchesReferenceOnOddShapes) {
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{1, 1, 1}, {3, 5, 7}, {67, 131, 45}, {256, 77, 513}, {129, 1, 300}};
  for (const Case& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 1.0f}) {
          const float alpha = beta == 0.0f ? 1.0f : 0.5f;
          // Row-major storage of op(A)[M,K]: A is [M,K] or [K,M]; pad the rows by 3.
          const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K, lda = a_cols + 3;
          const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N, ldb = b_cols + 3;
          const int64_t ldc = c.N + 3;
          Arena arena;
          Tensor A = arena.normal({a_rows, lda}, 11), B = arena.normal({b_rows, ldb}, 12);
          Tensor C0 = arena.normal({c.M, ldc}, 13);
          if (beta == 0.0f) C0.f32()[0] = std::numeric_limits<float>::quiet_NaN();  // must be ignored
          Tensor fast = arena.copy(C0), ref = arena.copy(C0);
          ops::cpu::sgemm(ta, tb, c.M, c.N, c.K, alpha, A.f32(), lda, B.f32(), ldb, beta, fast.f32(), ldc);
          ops::cpu::sgemm_reference(ta, tb, c.M, c.N, c.K, alpha, A.f32(), lda, B.f32(), ldb, beta, ref.f32(), ldc);
          double worst = 0.0;
          for (int64_t i = 0; i < c.M; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float f = fast.f32()[i * ldc + j], r = ref.f32()[i * ldc + j];
              if (j >= c.N) {  // the padding must be untouched
                ASSERT_EQ(std::memcmp(&f, &C0.f32()[i * ldc + j], 4), 0) << "wrote outside C";
                continue;
              }
              // Float dot products of length K with N(0,1) entries: error ~ sqrt(K) * 2^-24 *
              // sum|a b| typically, K * 2^-24 * sum|a b| at worst; sum|a b| ~ 0.64 K. Bound:
              // 1e-5 * K (+ beta * |C| rounding), about 10x the typical error, while a
              // wrong transpose or a lost beta gives errors of order sqrt(K).
              const double tol = 1e-5 * static_cast<double>(c.K) + 1e-6 * std::fabs(r);
              worst = std::max(worst, std::fabs(static_cast<double>(f) - r) / tol);
            }
          }
          EXPECT_LE(worst, 1.0) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << ta << " tb=" << tb
                                << " beta=" << beta;
        }
      }
    }
  }
}

TEST(OpsGemm, ReferenceIsRight) {
  // The reference itself, on a product small enough to write down: [[1,2],[3,4]] @ [[5,6],[7,8]].
  const float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8};
  float C[] = {1, 1, 1, 1};
  ops::cpu::sgemm_reference(false, false, 2, 2, 2, 1.0f, A, 2, B, 2, 1.0f, C, 2);
  EXPECT_EQ(std::vector<float>(C, C + 4), (std::vector<float>{20, 23, 44, 51}));
  float Ct[] = {0, 0, 0, 0};
  ops::cpu::sgemm_reference(true, true, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, Ct, 2);  // A^T B^T = (BA)^T
  EXPECT_EQ(std::vector<float>(Ct, Ct + 4), (std::vector<float>{23, 31, 34, 46}));
}

// ---------------------------------------------------------------------------------------
// Embedding

TEST(OpsEmbedding, ForwardAndGradients) {
  Arena arena;
  const int64_t B = 2, T = 3, C = 5, V = 7, P = 4;
  // Token 3 and position 1 repeat: their gradient rows must sum several contributions.
  Tensor tokens = arena.ints({B, T}, {3, 0, 3, 6, 3, 1});
  Tensor positions = arena.ints({B, T}, {0, 1, 2, 0, 1, 1});
  Tensor wte = arena.normal({V, C}, 1), wpe = arena.normal({P, C}, 2);
  Tensor out = arena.f32({B, T, C}), R = arena.normal({B, T, C}, 3);
  ops::embedding_forward(out, tokens, positions, wte, wpe, 0, 0);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(out.f32()[n * C + c], wte.f32()[tokens.i32()[n] * C + c] + wpe.f32()[positions.i32()[n] * C + c]);

  Grad dwte(arena, wte, 4), dwpe(arena, wpe, 5);
  ops::embedding_backward(dwte.t, dwpe.t, R, tokens, positions, 0, 0);
  auto loss = [&] {
    ops::embedding_forward(out, tokens, positions, wte, wpe, 0, 0);
    return weighted_sum(out, R);
  };
  // L is linear in the tables, so central differences are exact up to the float rounding
  // of out (~6e-8 |out| per element, a few elements touched): with eps = 0.1 the numeric
  // gradient is good to ~1e-5; atol 1e-4 is 10x that, while gradients are O(1).
  expect_gradient("dwte", wte, dwte, loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dwpe", wpe, dwpe, loss, 0.1f, 1e-4, 1e-4);
  // Untouched rows (tokens 2, 4, 5; position 3) keep their pre-filled gradient exactly.
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(dwte.t.f32()[2 * C + c], dwte.prefill[2 * C + c]);
    EXPECT_EQ(dwpe.t.f32()[3 * C + c], dwpe.prefill[3 * C + c]);
  }
}

TEST(OpsEmbedding, ShardGradientsAndAbsentTables) {
  Arena arena;
  const int64_t B = 2, T = 3, C = 4, V = 9, P = 3, start = 3, rows = 4;  // shard [3, 7) of 9
  Tensor tokens = arena.ints({B, T}, {3, 8, 6, 0, 3, 5});
  Tensor positions = arena.ints({B, T}, {0, 1, 2, 1, 1, 0});
  Tensor wte = arena.normal({rows, C}, 1), wpe = arena.normal({P, C}, 2);
  Tensor out = arena.f32({B, T, C}), R = arena.normal({B, T, C}, 3);
  Grad dwte(arena, wte, 4), dwpe(arena, wpe, 5);
  ops::embedding_backward(dwte.t, dwpe.t, R, tokens, positions, start, V);
  auto loss = [&] {
    ops::embedding_forward(out, tokens, positions, wte, wpe, start, V);
    return weighted_sum(out, R);
  };
  // Linear in the tables, as in ForwardAndGradients: eps = 0.1, atol 1e-4.
  expect_gradient("dwte shard", wte, dwte, loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dwpe", wpe, dwpe, loss, 0.1f, 1e-4, 1e-4);
  // Row 3 of the shard (token 6) has one contribution, row 2 (token 5) one, row 1 (token 4)
  // none: it keeps its pre-filled value exactly.
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwte.t.f32()[1 * C + c], dwte.prefill[1 * C + c]);

  // wte absent: out is wpe's rows (tokens not read: an empty tensor is fine).
  ops::embedding_forward(out, Tensor(), positions, Tensor(), wpe, 0, 0);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out.f32()[n * C + c], wpe.f32()[positions.i32()[n] * C + c]);
  // wpe absent: the shard's rows or zeros.
  ops::embedding_forward(out, tokens, Tensor(), wte, Tensor(), start, V);
  for (int64_t n = 0; n < B * T; ++n) {
    const int32_t t = tokens.i32()[n];
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(out.f32()[n * C + c], t >= start && t < start + rows ? wte.f32()[(t - start) * C + c] : 0.0f);
  }
  // Both gradients absent except dwpe: dwte untouched (nothing to pass), dwpe += rows.
  Grad only_pe(arena, wpe, 6);
  ops::embedding_backward(Tensor(), only_pe.t, R, Tensor(), positions, 0, 0);
  std::vector<double> g = only_pe.analytic(), ref(static_cast<size_t>(P * C), 0.0);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) ref[positions.i32()[n] * C + c] += R.f32()[n * C + c];
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(g[i], ref[i], 1e-6);
}

TEST(OpsEmbeddingDeathTest, RejectsIdsOutsideTheVocabulary) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP threads exist by now
  Arena arena;
  Tensor wte = arena.normal({4, 2}, 1), wpe = arena.normal({3, 2}, 2), out = arena.f32({1, 2, 2});
  Tensor pos = arena.ints({1, 2}, {0, 1});
  // Unsharded: a token beyond the table is an error, not "another rank's".
  EXPECT_DEATH(ops::embedding_forward(out, arena.ints({1, 2}, {1, 4}), pos, wte, wpe, 0, 0), "token id 4");
  // Sharded (rows [4, 8) of 10): tokens 0..9 are fine, 10 and -1 are not.
  ops::embedding_forward(out, arena.ints({1, 2}, {0, 9}), pos, wte, wpe, 4, 10);
  EXPECT_DEATH(ops::embedding_forward(out, arena.ints({1, 2}, {10, 5}), pos, wte, wpe, 4, 10), "token id 10");
  EXPECT_DEATH(ops::embedding_backward(wte, Tensor(), out, arena.ints({1, 2}, {-1, 5}), pos, 4, 10), "token id -1");
  // A shard start without the full vocabulary, or a shard outside it.
  EXPECT_DEATH(ops::embedding_forward(out, arena.ints({1, 2}, {4, 5}), pos, wte, wpe, 4, 0), "vocab_size");
  EXPECT_DEATH(ops::embedding_forward(out, arena.ints({1, 2}, {4, 5}), pos, wte, wpe, 7, 10), "shard");
  EXPECT_DEATH(ops::embedding_forward(out, arena.ints({1, 2}, {0, 1}), arena.ints({1, 2}, {0, 3}), wte, wpe, 0, 0),
               "position id 3");
}

// ---------------------------------------------------------------------------------------
// LayerNorm

TEST(OpsLayerNorm, ForwardMatchesDoubleFormula) {
  Arena arena;
  const int64_t N = 5, C = 37;  // C odd: exercises the vector loops' remainders
  // Rows with a large mean and small spread: the case where E[x^2]-E[x]^2 would fail.
  Tensor inp = arena.normal({N, C}, 1, 0.5f, 30.0f), w = arena.normal({C}, 2), b = arena.normal({C}, 3);
  Tensor out = arena.f32({N, C}), mean = arena.f32({N}), rstd = arena.f32({N});
  const float eps = 1e-5f;
  ops::layernorm_forward(out, mean, rstd, inp, w, b, eps);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += inp.f32()[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (inp.f32()[n * C + c] - m) * (inp.f32()[n * C + c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + eps);
    // mean: float sum of 37 values ~30 -> relative 1e-6 of 30; rstd: relative 1e-5, the
    // deviations lose ~log2(30/0.5) = 6 bits to the mean's rounding; out: rstd's error
    // times |xhat| ~ 3 plus w, b rounding.
    EXPECT_NEAR(mean.f32()[n], m, 3e-5);
    EXPECT_NEAR(rstd.f32()[n], rs, 1e-5 * rs);
    for (int64_t c = 0; c < C; ++c) {
      const double ref = (inp.f32()[n * C + c] - m) * rs * w.f32()[c] + b.f32()[c];
      EXPECT_NEAR(out.f32()[n * C + c], ref, 1e-4 * (1 + std::fabs(ref)));
    }
  }
}

TEST(OpsLayerNorm, Gradients) {
  Arena arena;
  const int64_t N = 3, C = 11;
  Tensor inp = arena.normal({N, C}, 1, 1.0f, 0.5f), w = arena.normal({C}, 2, 0.5f, 1.0f), b = arena.normal({C}, 3);
  Tensor out = arena.f32({N, C}), mean = arena.f32({N}), rstd = arena.f32({N}), R = arena.normal({N, C}, 4);
  const float eps = 1e-5f;
  ops::layernorm_forward(out, mean, rstd, inp, w, b, eps);
  Grad dinp(arena, inp, 5), dw(arena, w, 6), db(arena, b, 7);
  ops::layernorm_backward(dinp.t, dw.t, db.t, R, inp, w, mean, rstd);
  Tensor m2 = arena.f32({N}), r2 = arena.f32({N});
  auto loss = [&] {
    ops::layernorm_forward(out, m2, r2, inp, w, b, eps);
    return weighted_sum(out, R);
  };
  // inp: L is smooth with third derivatives O(10) at unit variance, so eps = 3e-3 costs
  // ~eps^2 * 10 / 6 = 1.5e-5 of truncation; each perturbation moves a whole row of 11
  // float outputs whose rounding (~1e-7 each) divided by 2 eps adds ~1e-4. atol 1e-3 is
  // ~5x the expected error; the gradients are O(1).
  expect_gradient("dinp", inp, dinp, loss, 3e-3f, 1e-3, 1e-3);
  // weight, bias: L is linear in them, only rounding remains (eps = 0.1: ~1e-6).
  expect_gradient("dweight", w, dw, loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dbias", b, db, loss, 0.1f, 1e-4, 1e-4);
}

TEST(OpsLayerNorm, WeightGradientsIndependentOfThreadCount) {
  Arena arena;
  const int64_t N = 64, C = 200;
  Tensor inp = arena.normal({N, C}, 1), w = arena.normal({C}, 2), b = arena.normal({C}, 3);
  Tensor out = arena.f32({N, C}), mean = arena.f32({N}), rstd = arena.f32({N}), R = arena.normal({N, C}, 4);
  ops::layernorm_forward(out, mean, rstd, inp, w, b, 1e-5f);
  Tensor dw1 = arena.f32({C}), dw2 = arena.f32({C}), dx1 = arena.f32({N, C}), dx2 = arena.f32({N, C});
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  ops::layernorm_backward(dx1, dw1, Tensor(), R, inp, w, mean, rstd);
  omp_set_num_threads(3);
  ops::layernorm_backward(dx2, dw2, Tensor(), R, inp, w, mean, rstd);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(dw1.host<void>(), dw2.host<void>(), dw1.bytes()), 0);
  EXPECT_EQ(std::memcmp(dx1.host<void>(), dx2.host<void>(), dx1.bytes()), 0);
}

// ---------------------------------------------------------------------------------------
// Linear

TEST(OpsLinear, ForwardMatchesReferenceGemm) {
  Arena arena;
  const int64_t B = 3, T = 5, C = 17, OC = 9;
  Tensor inp = arena.normal({B, T, C}, 1), w = arena.normal({OC, C}, 2), bias = arena.normal({OC}, 3);
  Tensor out = arena.f32({B, T, OC}), out_nb = arena.f32({B, T, OC});
  out.f32()[0] = std::numeric_limits<float>::quiet_NaN();  // old contents must not leak in
  ops::linear_forward(out, inp, w, bias);
  ops::linear_forward(out_nb, inp, w, Tensor());
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(inp.f32()[n * C + c]) * w.f32()[o * C + c];
      // Float dot of 17 N(0,1) products: error ~1e-6; 1e-5 leaves margin.
      EXPECT_NEAR(out_nb.f32()[n * OC + o], acc, 1e-5);
      EXPECT_NEAR(out.f32()[n * OC + o], acc + bias.f32()[o], 1e-5);
    }
  }
}

TEST(OpsLinear, Gradients) {
  Arena arena;
  const int64_t N = 6, C = 7, OC = 5;
  Tensor inp = arena.normal({2, 3, C}, 1), w = arena.normal({OC, C}, 2), bias = arena.normal({OC}, 3);
  Tensor out = arena.f32({2, 3, OC}), R = arena.normal({2, 3, OC}, 4);
  Grad dinp(arena, inp, 5), dw(arena, w, 6), db(arena, bias, 7);
  ops::linear_backward(dinp.t, dw.t, db.t, R, inp, w);
  auto loss = [&] {
    ops::linear_forward(out, inp, w, bias);
    return weighted_sum(out, R);
  };
  // L is linear in each of inp, weight and bias, so central differences are exact but for
  // the rounding of ~OC (or N) float outputs of size ~3: with eps = 0.1, ~1e-5. atol 1e-4.
  expect_gradient("dinp", inp, dinp, loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dweight", w, dw, loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dbias", bias, db, loss, 0.1f, 1e-4, 1e-4);
  (void)N;
}

TEST(OpsLinear, AbsentGradientsAreSkipped) {
  Arena arena;
  Tensor inp = arena.normal({4, 3}, 1), w = arena.normal({2, 3}, 2), R = arena.normal({4, 2}, 3);
  Tensor dw = arena.f32({2, 3}), dw_ref = arena.f32({2, 3});
  ops::linear_backward(Tensor(), dw, Tensor(), R, inp, w);  // only dweight wanted
  ops::cpu::sgemm_reference(true, false, 2, 3, 4, 1.0f, R.f32(), 2, inp.f32(), 3, 0.0f, dw_ref.f32(), 3);
  // 4-term float dot products: error ~1e-7.
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(dw.f32()[i], dw_ref.f32()[i], 1e-6);
}

// ---------------------------------------------------------------------------------------
// Bias add (the bias of a row-parallel linear, added after the all-reduce)

TEST(OpsBiasAdd, ForwardInPlaceAndGradient) {
  Arena arena;
  Tensor inp = arena.normal({2, 3, 5}, 1), bias = arena.normal({5}, 2), out = arena.normal({2, 3, 5}, 3);
  ops::bias_add_forward(out, inp, bias);
  for (int64_t i = 0; i < inp.numel(); ++i) ASSERT_EQ(out.f32()[i], inp.f32()[i] + bias.f32()[i % 5]);
  Tensor inplace = arena.copy(inp);
  ops::bias_add_forward(inplace, inplace, bias);
  EXPECT_EQ(std::memcmp(inplace.host<void>(), out.host<void>(), out.bytes()), 0);

  Tensor R = arena.normal({2, 3, 5}, 4);
  Grad db(arena, bias, 5);
  ops::bias_add_backward(db.t, R);
  auto loss = [&] {
    ops::bias_add_forward(out, inp, bias);
    return weighted_sum(out, R);
  };
  // Linear in the bias: exact up to the rounding of the 6 outputs each element moves
  // (~2e-7 * 3 each) / 0.2: ~1e-6. atol 1e-5; the gradients are sums of 6 N(0,1).
  expect_gradient("dbias", bias, db, loss, 0.1f, 1e-5, 1e-5);
}

TEST(OpsBiasAdd, BackwardIsLinearsBiasGradient) {
  // OC = 600: two full column blocks of 256 and a ragged one; N = 70 rows.
  Arena arena;
  const int64_t N = 70, C = 3, OC = 600;
  Tensor dout = arena.normal({N, OC}, 1), inp = arena.normal({N, C}, 2), w = arena.normal({OC, C}, 3);
  Grad from_bias_add(arena, arena.f32({OC}), 4);
  Tensor from_linear = arena.copy(from_bias_add.t);
  ops::bias_add_backward(from_bias_add.t, dout);
  ops::linear_backward(Tensor(), Tensor(), from_linear, dout, inp, w);
  // One reduction: the same bits.
  EXPECT_EQ(std::memcmp(from_bias_add.t.host<void>(), from_linear.host<void>(), from_linear.bytes()), 0);
  // ... and that reduction is the column sum (70 float terms of N(0,1): error ~1e-6).
  std::vector<double> g = from_bias_add.analytic();
  for (int64_t o = 0; o < OC; ++o) {
    double ref = 0;
    for (int64_t n = 0; n < N; ++n) ref += dout.f32()[n * OC + o];
    ASSERT_NEAR(g[o], ref, 1e-5) << "column " << o;
  }

  // A row-parallel linear (no bias in the GEMM, bias added afterwards) computes the same
  // function as linear_forward with the bias (to rounding: the bias is added before the
  // GEMM's sum there, after it here; 3-term dots of N(0,1): ~1e-6).
  Tensor bias = arena.normal({OC}, 5), fused = arena.f32({N, OC}), split = arena.f32({N, OC});
  ops::linear_forward(fused, inp, w, bias);
  ops::linear_forward(split, inp, w, Tensor());
  ops::bias_add_forward(split, split, bias);
  for (int64_t i = 0; i < fused.numel(); ++i) ASSERT_NEAR(split.f32()[i], fused.f32()[i], 1e-5);
}

// ---------------------------------------------------------------------------------------
// Attention

ops::Dropout attention_dropout(float p) {
  ops::Dropout d;
  d.p = p;
  d.key = {1234, 7, 3};
  d.sample0 = 5;
  return d;
}

struct AttentionShape {
  int64_t B, T, NH, HD;
};
// Small head dims take the kernels' scalar paths; HD = 20 and T = 21 take the vector
// blocks (16 wide) plus remainders, with several key blocks per row.
const AttentionShape kAttentionShapes[] = {{2, 7, 3, 4}, {1, 21, 2, 20}};

TEST(OpsAttention, ForwardMatchesMegatronRecipeInDouble) {
  for (const AttentionShape& shape : kAttentionShapes)
  for (float p : {0.0f, 0.3f}) {
    Arena arena;
    const int64_t B = shape.B, T = shape.T, NH = shape.NH, HD = shape.HD;
    Tensor qkv = arena.normal({B, T, NH * 3 * HD}, 1, 1.5f);
    Tensor out = arena.f32({B, T, NH * HD}), att = arena.normal({B, NH, T, T}, 9);  // garbage in att
    ops::Dropout d = attention_dropout(p);
    ops::attention_forward(out, att, qkv, d);
    std::vector<double> out_ref, att_ref;
    attention_reference(qkv.f32(), B, T, NH, HD, d, out_ref, att_ref);
    // Float scores, exp_approx (2 ulp) and sums of <= 21 terms: errors ~1e-6 on O(1)
    // values; 1e-5 is 10x that. A wrong scale, mask or dropout lane is off by >1e-2.
    for (size_t i = 0; i < att_ref.size(); ++i) EXPECT_NEAR(att.f32()[i], att_ref[i], 1e-5) << "att " << i;
    for (size_t i = 0; i < out_ref.size(); ++i) EXPECT_NEAR(out.f32()[i], out_ref[i], 1e-5) << "out " << i;
    // Rows of att are distributions over keys <= query, exact zeros above the diagonal.
    for (int64_t r = 0; r < B * NH * T; ++r) {
      const int64_t t = r % T;
      double sum = 0;
      for (int64_t t2 = 0; t2 < T; ++t2) {
        const float a = att.f32()[r * T + t2];
        if (t2 > t) {
          EXPECT_EQ(a, 0.0f);
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);  // T float terms each rounded once
    }
  }
}

TEST(OpsAttention, IsCausal) {
  Arena arena;
  const int64_t B = 2, T = 6, NH = 2, HD = 4;
  Tensor qkv = arena.normal({B, T, NH * 3 * HD}, 1);
  Tensor out1 = arena.f32({B, T, NH * HD}), att1 = arena.f32({B, NH, T, T});
  Tensor out2 = arena.f32({B, T, NH * HD}), att2 = arena.f32({B, NH, T, T});
  ops::Dropout d = attention_dropout(0.2f);
  ops::attention_forward(out1, att1, qkv, d);
  // Change everything (q, k and v of every head) of the last token of each sample.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < NH * 3 * HD; ++c) qkv.f32()[(b * T + T - 1) * NH * 3 * HD + c] += 5.0f;
  ops::attention_forward(out2, att2, qkv, d);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const bool same = std::memcmp(out1.f32() + (b * T + t) * NH * HD, out2.f32() + (b * T + t) * NH * HD,
                                    NH * HD * sizeof(float)) == 0;
      // Earlier tokens bit-identical; the last token must change (else the test is vacuous).
      EXPECT_EQ(same, t < T - 1) << "b " << b << " t " << t;
    }
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T - 1; ++t)
        EXPECT_EQ(std::memcmp(att1.f32() + ((b * NH + h) * T + t) * T, att2.f32() + ((b * NH + h) * T + t) * T,
                              T * sizeof(float)),
                  0);
  }
}

TEST(OpsAttention, Gradients) {
  const AttentionShape shapes[] = {{2, 5, 2, 3}, {1, 18, 1, 17}};
  for (const AttentionShape& shape : shapes)
  for (float p : {0.0f, 0.25f}) {
    Arena arena;
    const int64_t B = shape.B, T = shape.T, NH = shape.NH, HD = shape.HD;
    Tensor qkv = arena.normal({B, T, NH * 3 * HD}, 1);
    Tensor out = arena.f32({B, T, NH * HD}), att = arena.f32({B, NH, T, T}), R = arena.normal({B, T, NH * HD}, 2);
    Tensor scratch = arena.normal({B, NH, T, T}, 3);
    ops::Dropout d = attention_dropout(p);
    ops::attention_forward(out, att, qkv, d);
    Grad dqkv(arena, qkv, 4);
    ops::attention_backward(dqkv.t, scratch, R, qkv, att, d);
    Tensor att2 = arena.f32({B, NH, T, T});
    auto loss = [&] {
      ops::attention_forward(out, att2, qkv, d);
      return weighted_sum(out, R);
    };
    // Smooth in qkv (the dropout mask is a function of the key, not of qkv); unit-scale
    // inputs give third derivatives O(1-10): eps = 2e-3 costs ~1e-5 of truncation, and
    // float rounding of the ~T*HD outputs a perturbation moves, /(2 eps), ~1e-4 (more
    // outputs at T = 18, HD = 17, but each moves less). With dropout the factor 1/(1-p)
    // scales both. atol 5e-4 and rtol 2e-3.
    expect_gradient(p > 0 ? "dqkv (dropout)" : "dqkv", qkv, dqkv, loss, 2e-3f, 5e-4, 2e-3);
  }
}

// ---------------------------------------------------------------------------------------
// GELU

TEST(OpsGelu, ForwardMatchesFormulas) {
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    Arena arena;
    Tensor x = arena.uniform({1001}, 1, -8.0f, 8.0f), y = arena.f32({1001});
    x.f32()[0] = 0.0f;
    ops::gelu_forward(y, x, kind);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double ref = gelu_ref(x.f32()[i], kind);
      // A few float roundings relative to |y|, plus 1e-6 absolute for the negative tail,
      // where 1 + erf(x/sqrt2) in float cancels (its absolute error is ~|x| * 6e-8).
      EXPECT_NEAR(y.f32()[i], ref, 1e-6 + 2e-6 * std::fabs(ref)) << "x = " << x.f32()[i];
    }
    // The two variants are different functions (by up to ~1e-3 near |x| = 2).
    EXPECT_NE(gelu_ref(2.0, ops::GeluKind::Tanh), gelu_ref(2.0, ops::GeluKind::Erf));
  }
}

TEST(OpsGelu, Gradients) {
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    Arena arena;
    Tensor x = arena.uniform({3, 17}, 1, -4.0f, 4.0f), y = arena.f32({3, 17}), R = arena.normal({3, 17}, 2);
    Grad dx(arena, x, 3);
    ops::gelu_backward(dx.t, R, x, kind);
    auto loss = [&] {
      ops::gelu_forward(y, x, kind);
      return weighted_sum(y, R);
    };
    // Element-wise: perturbing x_i moves only y_i. Truncation eps^2/6 * |y'''| <= 1e-6 at
    // eps = 1e-3; rounding of y_i (|y| <= 4, ~2.4e-7 * 4) / 2e-3 ~ 5e-4 at worst |R|=1.
    // atol 1e-3 with rtol 1e-3; a wrong derivative term is off by O(0.1).
    expect_gradient(kind == ops::GeluKind::Tanh ? "gelu tanh" : "gelu erf", x, dx, loss, 1e-3f, 1e-3, 1e-3);
  }
}

// ---------------------------------------------------------------------------------------
// Dropout

// The keep decision straight from core/rng.h, one scalar Philox call per element.
bool kept(const ops::Dropout& d, uint32_t b, uint64_t e) {
  const uint64_t idx = d.element_offset + e;
  Philox4x32 r = philox4x32(d.key.seed, static_cast<uint32_t>(RngStream::Dropout),
                            {static_cast<uint32_t>(idx / 4), d.sample0 + b, d.key.site, d.key.iteration});
  return uint_to_unit_float(r[idx % 4]) >= d.p;
}

ops::Dropout hidden_dropout(float p) {
  ops::Dropout d;
  d.p = p;
  d.key = {42, 3, 9};
  d.sample0 = 100;
  return d;
}

// Positions where the mask (out != 0 for an input of ones) of two draws differs.
double mask_difference(const Tensor& a, const Tensor& b) {
  int64_t diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) diff += (a.f32()[i] != 0.0f) != (b.f32()[i] != 0.0f);
  return static_cast<double>(diff) / static_cast<double>(a.numel());
}

TEST(OpsDropout, ForwardMatchesScalarPhilox) {
  Arena arena;
  const int64_t B = 3, S = 1037;  // S odd: samples start mid Philox group
  Tensor x = arena.normal({B, S}, 1), y = arena.f32({B, S});
  ops::Dropout d = hidden_dropout(0.3f);
  d.element_offset = 5;
  ops::dropout_forward(y, x, d);
  const float scale = 1.0f / (1.0f - 0.3f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < S; ++e)
      ASSERT_EQ(y.f32()[b * S + e], kept(d, static_cast<uint32_t>(b), e) ? x.f32()[b * S + e] * scale : 0.0f)
          << "b " << b << " e " << e;
}

TEST(OpsDropout, KeyProperties) {
  Arena arena;
  const int64_t B = 4, S = 1 << 18;  // 1M elements
  const float p = 0.1f;
  Tensor ones = arena.f32({B, S});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.f32()[i] = 1.0f;
  ops::Dropout d = hidden_dropout(p);
  auto draw = [&](const ops::Dropout& dd) {
    Tensor y = arena.f32({B, S});
    ops::dropout_forward(y, ones, dd);
    return y;
  };
  Tensor base = draw(d), again = draw(d);
  EXPECT_EQ(std::memcmp(base.host<void>(), again.host<void>(), base.bytes()), 0) << "same key, different mask";
  // Keep fraction: binomial with n = 2^20, std = sqrt(p(1-p)/n) = 2.9e-4; 5 sigma = 1.5e-3.
  int64_t kept_count = 0;
  for (int64_t i = 0; i < base.numel(); ++i) kept_count += base.f32()[i] != 0.0f;
  EXPECT_NEAR(static_cast<double>(kept_count) / base.numel(), 1.0 - p, 1.5e-3);
  // Independent masks differ in a fraction 2p(1-p) = 0.18 of positions (std ~4e-4); a
  // correlated or identical stream gives ~0.
  ops::Dropout it = d, sample = d, site = d;
  it.key.iteration += 1;
  sample.sample0 += 1;
  site.key.site += 1;
  for (const ops::Dropout& other : {it, sample, site})
    EXPECT_NEAR(mask_difference(base, draw(other)), 2 * p * (1 - p), 5e-3);
  // Within one batch, sample b's mask differs from sample b+1's.
  Tensor s0 = base.slice_rows(0, 1), s1 = base.slice_rows(1, 1);
  EXPECT_NEAR(mask_difference(s0, s1), 2 * p * (1 - p), 1e-2);
}

TEST(OpsDropout, GradientsInPlaceAndDisabled) {
  Arena arena;
  Tensor x = arena.normal({2, 3, 7}, 1), y = arena.f32({2, 3, 7}), R = arena.normal({2, 3, 7}, 2);
  ops::Dropout d = hidden_dropout(0.35f);
  Grad dx(arena, x, 3);
  ops::dropout_backward(dx.t, R, d);  // recomputes the mask from the key
  auto loss = [&] {
    ops::dropout_forward(y, x, d);
    return weighted_sum(y, R);
  };
  // Linear in x: exact up to the rounding of one output (~1e-7 * 1.5) / 0.2.
  expect_gradient("dropout dinp", x, dx, loss, 0.1f, 1e-5, 1e-5);

  // In place (out aliases inp) gives the same as out of place.
  ops::dropout_forward(y, x, d);
  Tensor z = arena.copy(x);
  ops::dropout_forward(z, z, d);
  EXPECT_EQ(std::memcmp(z.host<void>(), y.host<void>(), y.bytes()), 0);

  // p = 0: identity forward, plain accumulation backward.
  ops::Dropout off = d;
  off.p = 0.0f;
  ops::dropout_forward(y, x, off);
  EXPECT_EQ(std::memcmp(y.host<void>(), x.host<void>(), x.bytes()), 0);
  Grad g(arena, x, 4);
  ops::dropout_backward(g.t, R, off);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(g.t.f32()[i], g.prefill[i] + R.f32()[i]);
}

// ---------------------------------------------------------------------------------------
// Residual

TEST(OpsResidual, ForwardAndGradients) {
  Arena arena;
  Tensor a = arena.normal({3, 5}, 1), b = arena.normal({3, 5}, 2), out = arena.f32({3, 5}), R = arena.normal({3, 5}, 3);
  ops::residual_forward(out, a, b);
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(out.f32()[i], a.f32()[i] + b.f32()[i]);
  Grad da(arena, a, 4), db(arena, b, 5);
  ops::residual_backward(da.t, db.t, R);
  auto loss = [&] {
    ops::residual_forward(out, a, b);
    return weighted_sum(out, R);
  };
  // Linear: exact up to one output's rounding (~2e-7) / 0.2.
  expect_gradient("da", a, da, loss, 0.1f, 1e-5, 1e-5);
  expect_gradient("db", b, db, loss, 0.1f, 1e-5, 1e-5);
  Grad only_b(arena, b, 6);
  ops::residual_backward(Tensor(), only_b.t, R);
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(only_b.t.f32()[i], only_b.prefill[i] + R.f32()[i]);
}

// ---------------------------------------------------------------------------------------
// Sequence-parallel regrouping

TEST(OpsSequenceRegroup, SmallCaseByHand) {
  // B = 2, T = 4, C = 1, two parts: sample 0 holds 0 1 2 3, sample 1 holds 4 5 6 7.
  // Rank-major: rank 0's chunk (rows 0-1 of both samples), then rank 1's (rows 2-3).
  Arena arena;
  Tensor seq = arena.f32({2, 4, 1}), rm = arena.f32({8}), back = arena.f32({2, 4, 1});
  for (int i = 0; i < 8; ++i) seq.f32()[i] = static_cast<float>(i);
  ops::sequence_to_rank_major(rm, seq, 2);
  EXPECT_EQ(values(rm), (std::vector<float>{0, 1, 4, 5, 2, 3, 6, 7}));
  ops::rank_major_to_sequence(back, rm, 2);
  EXPECT_EQ(values(back), values(seq));
}

TEST(OpsSequenceRegroup, RowsWhereDescribedAndRoundTrip) {
  Arena arena;
  const int64_t B = 3, T = 12, C = 5;
  Tensor seq = arena.normal({B, T, C}, 1);
  for (int parts : {1, 2, 3, 4, 6, 12}) {
    const int64_t Ts = T / parts;
    Tensor rm = arena.normal({parts, B, Ts, C}, 2), back = arena.normal({B, T, C}, 3);  // garbage
    ops::sequence_to_rank_major(rm, seq, parts);
    for (int64_t r = 0; r < parts; ++r)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < Ts; ++t)
          for (int64_t c = 0; c < C; ++c)
            ASSERT_EQ(rm.f32()[((r * B + b) * Ts + t) * C + c], seq.f32()[(b * T + r * Ts + t) * C + c])
                << "parts " << parts << " r " << r << " b " << b << " t " << t;
    ops::rank_major_to_sequence(back, rm, parts);
    EXPECT_EQ(std::memcmp(back.host<void>(), seq.host<void>(), seq.bytes()), 0) << "parts " << parts;
    // The inverse the other way round too: rank-major -> sequence -> rank-major.
    Tensor rm2 = arena.f32({parts, B, Ts, C});
    ops::sequence_to_rank_major(rm2, back, parts);
    EXPECT_EQ(std::memcmp(rm2.host<void>(), rm.host<void>(), rm.bytes()), 0) << "parts " << parts;
  }
}

TEST(OpsSequenceRegroup, GatheredShardsAreTheRankMajorLayout) {
  // What an all-gather over 3 sequence-parallel ranks produces (rank r's [B, T/3, C] shard,
  // cut per sample from the full tensor, placed at r) is what rank_major_to_sequence reads;
  // the regroup of the full tensor is what reduce-scatter chunks per rank. i32 data: the
  // copies are dtype-agnostic.
  Arena arena;
  const int64_t B = 2, T = 9, C = 4, parts = 3, Ts = T / parts;
  Tensor seq = arena.i32({B, T, C});
  for (int64_t i = 0; i < seq.numel(); ++i) seq.i32()[i] = static_cast<int32_t>(1000 + i);
  Tensor gathered = arena.i32({parts * B * Ts * C});
  for (int64_t r = 0; r < parts; ++r)
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(gathered.i32() + (r * B + b) * Ts * C, seq.i32() + (b * T + r * Ts) * C, Ts * C * sizeof(int32_t));
  Tensor rm = arena.i32({parts * B * Ts * C}), back = arena.i32({B, T, C});
  ops::sequence_to_rank_major(rm, seq, parts);
  EXPECT_EQ(std::memcmp(rm.host<void>(), gathered.host<void>(), rm.bytes()), 0);
  ops::rank_major_to_sequence(back, gathered, parts);
  EXPECT_EQ(std::memcmp(back.host<void>(), seq.host<void>(), seq.bytes()), 0);
}

TEST(OpsSequenceRegroupDeathTest, RejectsBadParts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Arena arena;
  Tensor seq = arena.f32({2, 6, 3}), rm = arena.f32({36});
  EXPECT_DEATH(ops::sequence_to_rank_major(rm, seq, 4), "4 parts do not divide T = 6");
  EXPECT_DEATH(ops::rank_major_to_sequence(seq, rm, 0), "0 parts");
  EXPECT_DEATH(ops::sequence_to_rank_major(seq, seq, 2), "overlaps");
  EXPECT_DEATH(ops::sequence_to_rank_major(arena.f32({35}), seq, 2), "out");
}

// ---------------------------------------------------------------------------------------
// Cross-entropy

// The cross-entropy pieces over vocabulary shards, with the tensor-parallel reductions
// done by hand: max of the shards' row maxima, sums of their sum_exp and target_logit.
// One shard with vocab_start 0 is the plain loss. Buffers are allocated once, so the
// finite-difference loops can call run() thousands of times.
struct ShardedCrossEntropy {
  int64_t N, V;
  std::vector<Tensor> logits;  // shard s: [N, Vl_s], columns [start[s], start[s]+Vl_s)
  std::vector<int64_t> start;
  Tensor targets, losses, lse;
  std::vector<Tensor> row_max, sum_exp, target_logit;  // per shard
  Tensor g_max, g_sum, g_target;                       // after the "all-reduce"

  // Splits full [N,V] logits at the given boundaries (e.g. {0, 12, 25} for 3 shards of 37).
  ShardedCrossEntropy(Arena& arena, const Tensor& full, Tensor tgt, const std::vector<int64_t>& starts)
      : N(full.dim(0)), V(full.dim(1)), start(starts), targets(tgt) {
    losses = arena.f32({N}), lse = arena.f32({N});
    g_max = arena.f32({N}), g_sum = arena.f32({N}), g_target = arena.f32({N});
    for (size_t s = 0; s < starts.size(); ++s) {
      const int64_t end = s + 1 < starts.size() ? starts[s + 1] : V, Vl = end - starts[s];
      Tensor shard = arena.f32({N, Vl});
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(shard.f32() + n * Vl, full.f32() + n * V + starts[s], Vl * sizeof(float));
      logits.push_back(shard);
      row_max.push_back(arena.f32({N}));
      sum_exp.push_back(arena.f32({N}));
      target_logit.push_back(arena.f32({N}));
    }
  }
  // Full-vocabulary ids, for the bounds check; 0 (unsharded) when there is one shard.
  int64_t vocab_size() const { return logits.size() == 1 ? 0 : V; }

  void run() {
    for (int64_t n = 0; n < N; ++n) g_max.f32()[n] = -std::numeric_limits<float>::infinity();
    for (size_t s = 0; s < logits.size(); ++s) {
      ops::cross_entropy_max(row_max[s], logits[s]);
      for (int64_t n = 0; n < N; ++n) g_max.f32()[n] = std::max(g_max.f32()[n], row_max[s].f32()[n]);
    }
    std::memset(g_sum.host<void>(), 0, g_sum.bytes());
    std::memset(g_target.host<void>(), 0, g_target.bytes());
    for (size_t s = 0; s < logits.size(); ++s) {
      ops::cross_entropy_sums(sum_exp[s], target_logit[s], logits[s], targets, g_max, start[s], vocab_size());
      for (int64_t n = 0; n < N; ++n) {
        g_sum.f32()[n] += sum_exp[s].f32()[n];
        g_target.f32()[n] += target_logit[s].f32()[n];
      }
    }
    ops::cross_entropy_finish(losses, lse, g_sum, g_max, g_target);
  }
  void backward(size_t s, Tensor dlogits, Tensor dlosses) {
    ops::cross_entropy_backward(dlogits, dlosses, logits[s], targets, lse, start[s], vocab_size());
  }
};

// The removed overload cross_entropy_backward(dlogits, dlosses, logits, targets, losses)
// had the same argument types up to the fifth; with a default vocab_start such a call
// would still compile and silently read the losses as logsumexp. It must not compile.
template <typename T>
concept OldBackwardCallCompiles = requires(T t) { ops::cross_entropy_backward(t, t, t, t, t); };
static_assert(!OldBackwardCallCompiles<Tensor>);

TEST(OpsCrossEntropy, ForwardMatchesLogSoftmaxInDouble) {
  Arena arena;
  const int64_t N = 4, V = 50304;  // GPT-2's padded vocabulary
  Tensor logits = arena.normal({N, V}, 1, 3.0f);
  logits.f32()[2 * V + 17] = 60.0f;  // a confident row: loss ~0 for target 17, ~60 otherwise
  Tensor targets = arena.ints({N}, {0, 50303, 17, 12345});
  ShardedCrossEntropy ce(arena, logits, targets, {0});
  ce.run();
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> ls = log_softmax_row(logits.f32() + n * V, V);
    const double ref = -ls[targets.i32()[n]];
    // logsumexp ~ 15 from a float sum of 50304 terms (16 lane partials, relative error
    // ~1e-6) minus a logit ~10: absolute error ~1e-5. 3e-5 + 1e-6 relative.
    EXPECT_NEAR(ce.losses.f32()[n], ref, 3e-5 + 1e-6 * ref) << "row " << n;
    EXPECT_NEAR(ce.lse.f32()[n], logits.f32()[n * V] - ls[0], 3e-5) << "row " << n;
    // One shard: the target logit is the target's column exactly.
    EXPECT_EQ(ce.target_logit[0].f32()[n], logits.f32()[n * V + targets.i32()[n]]);
  }
  EXPECT_LT(ce.losses.f32()[2], 1e-6f);
}

TEST(OpsCrossEntropy, BackwardMatchesSoftmaxOnFullVocab) {
  Arena arena;
  const int64_t N = 3, V = 50304;
  Tensor logits = arena.normal({N, V}, 1, 3.0f), dloss = arena.normal({N}, 2);
  Tensor targets = arena.ints({N}, {5, 50000, 777});
  ShardedCrossEntropy ce(arena, logits, targets, {0});
  ce.run();
  Tensor d = arena.f32({N, V});
  ce.backward(0, d, dloss);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> ls = log_softmax_row(logits.f32() + n * V, V);
    double worst = 0, sum = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double ref = (std::exp(ls[v]) - (v == targets.i32()[n])) * dloss.f32()[n];
      worst = std::max(worst, std::fabs(d.f32()[n * V + v] - ref));
      sum += d.f32()[n * V + v];
    }
    // Probabilities are <= ~0.1 here; exp_approx and the float logsumexp (error ~1e-5,
    // see above) give relative errors ~1e-5, absolute <= 1e-6 * |dloss| ~ 2e-6; 1e-5 is
    // safe.
    EXPECT_LT(worst, 1e-5) << "row " << n;
    // softmax sums to 1, minus the one-hot: each row of the gradient sums to ~0.
    EXPECT_NEAR(sum, 0.0, 1e-4);
  }
}

TEST(OpsCrossEntropy, Gradients) {
  Arena arena;
  const int64_t N = 4, V = 37;
  Tensor logits = arena.normal({N, V}, 1, 2.0f), R = arena.normal({N}, 2);
  Tensor targets = arena.ints({N}, {0, 36, 5, 5});
  ShardedCrossEntropy ce(arena, logits, targets, {0});
  ce.run();
  Grad d(arena, logits, 3);
  ce.backward(0, d.t, R);
  auto loss = [&] {
    ce.run();
    return weighted_sum(ce.losses, R);
  };
  // Smooth (softmax); third derivatives <= ~1: eps = 1e-3 costs ~1e-7 of truncation;
  // rounding of one loss (~5, so ~5e-7) / 2e-3 ~ 2.5e-4. atol 1e-3, rtol 1e-3; gradient
  // entries are up to ~1 (the target's -1 + p).
  expect_gradient("dlogits", ce.logits[0], d, loss, 1e-3f, 1e-3, 1e-3);
}

TEST(OpsCrossEntropy, VocabParallelShardsMatchUnsharded) {
  // Over 2 and 3 shards of a 37-column vocabulary (uneven splits), the hand-combined
  // pieces give the unsharded losses, and each shard's backward gives its columns of the
  // unsharded gradient. Targets sit on both sides of every boundary and at the ends.
  // Rows 0-2 get one large logit in the last shard, so a shard's local max differs from
  // the global max there (a kernel using its local max would be off by ~e^10).
  Arena arena;
  const int64_t N = 8, V = 37;
  Tensor logits = arena.normal({N, V}, 1, 2.0f), dloss = arena.normal({N}, 2);
  for (int64_t n = 0; n < 3; ++n) logits.f32()[n * V + 30 + n] = 12.0f;
  Tensor targets = arena.ints({N}, {0, 11, 12, 17, 18, 24, 25, 36});
  ShardedCrossEntropy whole(arena, logits, targets, {0});
  whole.run();
  Tensor dwhole = arena.f32({N, V});
  whole.backward(0, dwhole, dloss);
  for (const std::vector<int64_t>& starts : {std::vector<int64_t>{0, 18}, std::vector<int64_t>{0, 12, 25}}) {
    ShardedCrossEntropy ce(arena, logits, targets, starts);
    ce.run();
    for (int64_t n = 0; n < N; ++n) {
      // The same float terms summed in another grouping: lse ~ 13 or ~5 to ~2 ulp; 1e-5.
      EXPECT_NEAR(ce.lse.f32()[n], whole.lse.f32()[n], 1e-5) << starts.size() << " shards, row " << n;
      EXPECT_NEAR(ce.losses.f32()[n], whole.losses.f32()[n], 1e-5) << starts.size() << " shards, row " << n;
      // Exactly one shard reports the target's logit, the others exactly 0.
      for (size_t s = 0; s < starts.size(); ++s) {
        const int64_t t = targets.i32()[n], end = s + 1 < starts.size() ? starts[s + 1] : V;
        EXPECT_EQ(ce.target_logit[s].f32()[n], t >= starts[s] && t < end ? logits.f32()[n * V + t] : 0.0f);
      }
    }
    for (size_t s = 0; s < starts.size(); ++s) {
      const int64_t Vl = ce.logits[s].dim(1);
      Grad d(arena, ce.logits[s], 10 + static_cast<uint32_t>(s));
      ce.backward(s, d.t, dloss);
      std::vector<double> g = d.analytic();
      // Only lse differs (~1e-6): |p (e^dlse - 1) dloss| <= 1e-6 * 2, plus the prefill's
      // rounding (~1e-7 of the O(1) prefill). 1e-5.
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < Vl; ++j)
          ASSERT_NEAR(g[n * Vl + j], dwhole.f32()[n * V + starts[s] + j], 1e-5)
              << starts.size() << " shards, shard " << s << " row " << n << " column " << j;
    }
  }
}

TEST(OpsCrossEntropy, ShardGradients) {
  // Finite differences of the hand-combined 3-shard loss w.r.t. the middle shard's logits
  // (vocab_start 12, targets inside and outside it), against that shard's backward.
  Arena arena;
  const int64_t N = 5, V = 37;
  Tensor logits = arena.normal({N, V}, 1, 2.0f), R = arena.normal({N}, 2);
  Tensor targets = arena.ints({N}, {12, 24, 3, 30, 18});
  ShardedCrossEntropy ce(arena, logits, targets, {0, 12, 25});
  ce.run();
  Grad d(arena, ce.logits[1], 3);
  ce.backward(1, d.t, R);
  auto loss = [&] {
    ce.run();
    return weighted_sum(ce.losses, R);
  };
  // As for the unsharded Gradients test: eps = 1e-3, atol 1e-3, rtol 1e-3.
  expect_gradient("dlogits shard [12, 25)", ce.logits[1], d, loss, 1e-3f, 1e-3, 1e-3);
}

TEST(OpsCrossEntropy, StatsAreMaxThenSumsBitForBitInEitherMode) {
  // The model runs cross_entropy_stats whenever the vocabulary is unsharded, in
  // --deterministic-mode too: it must give the two ops' bits in each mode.
  struct ModeGuard {
    ~ModeGuard() { cpu_device().set_deterministic_mode(false); }
  } guard;
  Arena arena;
  const int64_t N = 3, V = 1000 + 7;  // a tail past the sums' 32 lanes
  Tensor logits = arena.normal({N, V}, 4, 3.0f), targets = arena.ints({N}, {0, 500, static_cast<int32_t>(V - 1)});
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic mode" : "default mode");
    cpu_device().set_deterministic_mode(deterministic);
    Tensor m = arena.f32({N}), s = arena.f32({N}), tl = arena.f32({N});
    Tensor fm = arena.f32({N}), fs = arena.f32({N}), ftl = arena.f32({N});
    ops::cross_entropy_max(m, logits);
    ops::cross_entropy_sums(s, tl, logits, targets, m, 0, 0);
    ops::cross_entropy_stats(fm, fs, ftl, logits, targets);
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(fm.f32()[n], m.f32()[n]) << n;
      EXPECT_EQ(fs.f32()[n], s.f32()[n]) << n;
      EXPECT_EQ(ftl.f32()[n], tl.f32()[n]) << n;
    }
    EXPECT_EQ(ftl.f32()[2], logits.f32()[2 * V + V - 1]);
  }
}

TEST(OpsCrossEntropyDeathTest, RejectsTargetsOutsideTheVocabulary) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Arena arena;
  Tensor logits = arena.normal({2, 5}, 1), m = arena.f32({2}), s = arena.f32({2}), tl = arena.f32({2});
  Tensor lse = arena.f32({2}), dl = arena.f32({2}), d = arena.f32({2, 5});
  ops::cross_entropy_max(m, logits);
  // Unsharded: a target beyond the logits' columns is an error, not "another rank's".
  EXPECT_DEATH(ops::cross_entropy_sums(s, tl, logits, arena.ints({2}, {0, 5}), m, 0, 0), "target 5");
  EXPECT_DEATH(ops::cross_entropy_backward(d, dl, logits, arena.ints({2}, {-1, 0}), lse, 0, 0), "target -1");
  // Columns [5, 10) of 12: targets in [0, 12) are fine.
  ops::cross_entropy_sums(s, tl, logits, arena.ints({2}, {0, 11}), m, 5, 12);
  EXPECT_EQ(tl.f32()[0], 0.0f);
  EXPECT_DEATH(ops::cross_entropy_sums(s, tl, logits, arena.ints({2}, {0, 12}), m, 5, 12), "target 12");
  EXPECT_DEATH(ops::cross_entropy_backward(d, dl, logits, arena.ints({2}, {0, 1}), lse, 5, 0), "vocab_size");
  EXPECT_DEATH(ops::cross_entropy_sums(s, tl, logits, arena.ints({2}, {0, 1}), m, 8, 12), "shard");
  EXPECT_DEATH(ops::cross_entropy_stats(m, s, tl, logits, arena.ints({2}, {0, 5})), "target 5");
}

// ---------------------------------------------------------------------------------------
// Optimizer updates against torch's rules stepped in double.

TEST(OpsAdamW, MatchesTorchRuleInDouble) {
  for (float beta1 : {0.9f, 0.3f}) {  // 0.3 takes the other branch of torch's lerp
    Arena arena;
    const int64_t n = 7;
    Tensor p = arena.normal({n}, 1), m = arena.f32({n}), v = arena.f32({n});
    std::vector<double> pd(p.f32(), p.f32() + n), md(n, 0.0), vd(n, 0.0);
    const float lr = 1e-2f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int64_t step = 1; step <= 4; ++step) {
      Tensor g = arena.normal({n}, 10 + static_cast<uint32_t>(step));
      g.f32()[0] = 0.0f;  // a zero gradient: pure decay plus the moment's tail
      ops::adamw_update(p, g, m, v, lr, beta1, beta2, eps, wd, step, 1.0f);
      const double bc1 = 1 - std::pow(static_cast<double>(beta1), step);
      const double bc2 = 1 - std::pow(static_cast<double>(beta2), step);
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g.f32()[i];
        pd[i] *= 1 - static_cast<double>(lr) * wd;
        md[i] = beta1 * md[i] + (1 - static_cast<double>(beta1)) * gi;
        vd[i] = beta2 * vd[i] + (1 - static_cast<double>(beta2)) * gi * gi;
        pd[i] -= lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + eps);
      }
      for (int64_t i = 0; i < n; ++i) {
        // A handful of float operations per step, each 6e-8 relative: 1e-6 relative after
        // 4 steps is ~4x margin. Updates are ~lr = 1e-2, so a missing bias correction
        // (10x at step 1) or a wrong sign is caught by orders of magnitude.
        EXPECT_NEAR(p.f32()[i], pd[i], 1e-6 * (1 + std::fabs(pd[i]))) << "step " << step << " i " << i;
        EXPECT_NEAR(m.f32()[i], md[i], 1e-6 * (1 + std::fabs(md[i])));
        EXPECT_NEAR(v.f32()[i], vd[i], 1e-6 * (1 + std::fabs(vd[i])));
      }
    }
  }
}

TEST(OpsOptimizers, MatchTorchNumbers) {
  // Printed by torch 1.13 (the snippet is in docs/ops.md): p0 = [1, -2, 0.5], gradients
  // [0.1, -0.2, 0.3] then [-0.4, 0.5, 0]; p after each step of
  //   torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1) and
  //   torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01).
  // Tolerance 5e-7: two ulps of |p| <= 2, for FMA contraction and op order.
  const float p0[] = {1.0f, -2.0f, 0.5f}, g1[] = {0.1f, -0.2f, 0.3f}, g2[] = {-0.4f, 0.5f, 0.0f};
  const float adamw[2][3] = {{0.998899996f, -1.99879992f, 0.498950005f},
                             {0.999359608f, -1.99904227f, 0.49823007f}};
  const float sgd[2][3] = {{0.989000022f, -1.97800004f, 0.469500005f},
                           {1.01811099f, -2.00622201f, 0.441580504f}};
  Arena arena;
  Tensor p = arena.f32({3}), m = arena.f32({3}), v = arena.f32({3}), g = arena.f32({3});
  Tensor q = arena.f32({3}), buf = arena.f32({3});
  std::memcpy(p.host<void>(), p0, 12);
  std::memcpy(q.host<void>(), p0, 12);
  for (int step = 1; step <= 2; ++step) {
    std::memcpy(g.host<void>(), step == 1 ? g1 : g2, 12);
    ops::adamw_update(p, g, m, v, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, step, 1.0f);
    ops::sgd_update(q, g, buf, 0.1f, 0.9f, 0.01f, step, 1.0f);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(p.f32()[i], adamw[step - 1][i], 5e-7) << "AdamW step " << step << " i " << i;
      EXPECT_NEAR(q.f32()[i], sgd[step - 1][i], 5e-7) << "SGD step " << step << " i " << i;
    }
  }
}

TEST(OpsSgd, MatchesTorchRuleInDouble) {
  for (float momentum : {0.9f, 0.0f}) {
    Arena arena;
    const int64_t n = 5;
    Tensor p = arena.normal({n}, 1), buf = arena.normal({n}, 2);  // garbage: step 1 must overwrite it
    std::vector<double> pd(p.f32(), p.f32() + n), bd(n, 0.0);
    const float lr = 0.1f, wd = 0.01f;
    for (int64_t step = 1; step <= 3; ++step) {
      Tensor g = arena.normal({n}, 10 + static_cast<uint32_t>(step));
      ops::sgd_update(p, g, buf, lr, momentum, wd, step, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        const double d = g.f32()[i] + static_cast<double>(wd) * pd[i];
        bd[i] = step == 1 ? d : momentum * bd[i] + d;
        pd[i] -= lr * (momentum != 0.0f ? bd[i] : d);
      }
      // A few float roundings per step on values O(1): 1e-6.
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p.f32()[i], pd[i], 1e-6) << "step " << step << " i " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Reductions

TEST(OpsReductions, SumSquaresAndScale) {
  Arena arena;
  const int64_t n = 300001;  // several chunks and a ragged tail
  Tensor t = arena.normal({n}, 1);
  auto sum_squares = [](const Tensor& x) {
    double sum = 0.0;
    ops::sum_squares(Tensor(&sum, DType::I64, {1}, &cpu_device()), 0, x);
    return sum;
  };
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) ref += static_cast<double>(t.f32()[i]) * t.f32()[i];
  // Double accumulation: relative error ~n * 1e-16.
  EXPECT_NEAR(sum_squares(t), ref, 1e-10 * ref);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = sum_squares(t);
  omp_set_num_threads(3);
  const double three = sum_squares(t);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, three);  // fixed chunking: the same bits for any thread count
  std::vector<float> before = values(t);
  ops::scale_inplace(t, 0.25f);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(t.f32()[i], before[i] * 0.25f);
}

}  // namespace
