// Causal multi-head self-attention (Megatron's core attention, local implementation).
// Legend: B batch, T sequence, NH heads (local to this rank), HD head dim,
//   qkv [B,T,NH*3*HD] (per head h: q, k, v at columns h*3*HD + {0, HD, 2*HD}),
//   att [B,NH,T,T] softmax probabilities (saved, before dropout), out [B,T,NH*HD].
// qkv, out, att and the gradients may be of any float dtype: each (b, h) work item stages
// its head's columns (storage.h) and computes scores and softmax in f32.
// For query t only keys t2 <= t take part: Megatron fills masked scores with -10000,
// which exp() turns into exactly 0 next to any unmasked score in fp32, so skipping them
// is the same function (and their probabilities are stored as exact zeros).
// Sequences are short (T = 64..1024 on the CPU), so a (b, h) pair is one work item: the
// OpenMP loop runs over B*NH pairs. Within a pair, a query's products with all keys use a
// transposed copy of K (or V) and vectorise along the keys; sums of rows weighted by
// probabilities or score gradients vectorise along the head dim.
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/dropout_mask.h"
#include "tessera/ops/cpu/fast_math.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

struct AttentionDims {
  int64_t B, T, NH, HD;
};

AttentionDims attention_dims(const Tensor& att, const Tensor& qkv, const Tensor& out) {
  TESSERA_CHECK(att.ndim() == 4 && att.dim(2) == att.dim(3), "attention: att must be [B,NH,T,T], got " +
                                                                   shape_str(att.shape));
  AttentionDims d{att.dim(0), att.dim(2), att.dim(1), 0};
  TESSERA_CHECK(qkv.dim(-1) % (3 * d.NH) == 0, "attention: qkv " + shape_str(qkv.shape) + " for " +
                                                   std::to_string(d.NH) + " heads");
  d.HD = qkv.dim(-1) / (3 * d.NH);
  TESSERA_CHECK(qkv.numel() == d.B * d.T * 3 * d.NH * d.HD && out.numel() == d.B * d.T * d.NH * d.HD,
                "attention: qkv " + shape_str(qkv.shape) + ", att " + shape_str(att.shape) + ", out " +
                    shape_str(out.shape));
  return d;
}

// Vector width in floats (one AVX-512 register). Loops over keys run over whole blocks
// of kW keys, padding the causal row up to the next block: with a variable trip count the
// scalar remainder would cost more than the vector body at T = 64.
constexpr int64_t kW = 16;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// dst[i*Tp + t] = src[t*stride + i] for t < T, 0 for T <= t < Tp: one head's keys (or
// values) as [HD, Tp], so that products with a query run along the keys in unit stride.
void transpose_rows(float* dst, const float* src, int64_t T, int64_t Tp, int64_t HD, int64_t stride) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < HD; ++i) dst[i * Tp + t] = src[t * stride + i];
  for (int64_t i = 0; i < HD; ++i)
    for (int64_t t = T; t < Tp; ++t) dst[i * Tp + t] = 0.0f;
}

// r[t2] = scale * sum_i u[i] * mT[i*Tp + t2] for t2 < n (n a multiple of kW): one row's
// products with n keys, a register of kW keys at a time. Four accumulators (over i mod 4)
// keep four FMA chains in flight instead of waiting on one.
void row_times_transposed(float* r, const float* u, float scale, const float* mT, int64_t n, int64_t Tp,
                          int64_t HD) {
  for (int64_t blk = 0; blk < n; blk += kW) {
    float a0[kW] = {}, a1[kW] = {}, a2[kW] = {}, a3[kW] = {};
    const float* m = mT + blk;
    int64_t i = 0;
    for (; i + 4 <= HD; i += 4) {
      const float u0 = u[i], u1 = u[i + 1], u2 = u[i + 2], u3 = u[i + 3];
      const float *m0 = m + i * Tp, *m1 = m0 + Tp, *m2 = m1 + Tp, *m3 = m2 + Tp;
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) {
        a0[j] += u0 * m0[j];
        a1[j] += u1 * m1[j];
        a2[j] += u2 * m2[j];
        a3[j] += u3 * m3[j];
      }
    }
    for (; i < HD; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) a0[j] += u[i] * m[i * Tp + j];
    }
#pragma omp simd
    for (int64_t j = 0; j < kW; ++j) r[blk + j] = scale * ((a0[j] + a1[j]) + (a2[j] + a3[j]));
  }
}

// o[i] (+)= sum_{c < count} w[c*ws] * rows[c*rs + i] for i < HD: a weighted sum of rows
// (probabilities times values, score gradients times keys or queries). HD is split in
// register-wide blocks, each summed over the rows with four accumulators.
void weighted_rows(float* o, bool accumulate, const float* w, int64_t ws, const float* rows, int64_t rs,
                   int64_t count, int64_t HD) {
  int64_t i0 = 0;
  for (; i0 + kW <= HD; i0 += kW) {
    float a0[kW] = {}, a1[kW] = {}, a2[kW] = {}, a3[kW] = {};
    int64_t c = 0;
    for (; c + 4 <= count; c += 4) {
      const float w0 = w[c * ws], w1 = w[(c + 1) * ws], w2 = w[(c + 2) * ws], w3 = w[(c + 3) * ws];
      const float* r0 = rows + c * rs + i0;
      const float *r1 = r0 + rs, *r2 = r1 + rs, *r3 = r2 + rs;
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) {
        a0[j] += w0 * r0[j];
        a1[j] += w1 * r1[j];
        a2[j] += w2 * r2[j];
        a3[j] += w3 * r3[j];
      }
    }
    for (; c < count; ++c) {
      const float wc = w[c * ws];
      const float* rc = rows + c * rs + i0;
#pragma omp simd
      for (int64_t j = 0; j < kW; ++j) a0[j] += wc * rc[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < kW; ++j) {
      const float sum = (a0[j] + a1[j]) + (a2[j] + a3[j]);
      o[i0 + j] = accumulate ? o[i0 + j] + sum : sum;
    }
  }
  for (int64_t i = i0; i < HD; ++i) {  // head dims that are not a multiple of kW
    float sum = 0.0f;
    for (int64_t c = 0; c < count; ++c) sum += w[c * ws] * rows[c * rs + i];
    o[i] = accumulate ? o[i] + sum : sum;
  }
}

}  // namespace

void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout) {
  const AttentionDims d = attention_dims(att, qkv, out);
  for (auto [t, name] : {std::pair{&out, "out"}, {&att, "att"}, {&qkv, "qkv"}}) check_float(*t, "attention_forward", name);
  const int64_t B = d.B, T = d.T, NH = d.NH, HD = d.HD, Tp = round_up(T, kW);
  const int64_t C3 = 3 * NH * HD, CO = NH * HD;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = dropout.p > 0.0f;
  if (drop) dropout_scale(dropout);  // checks p
#pragma omp parallel
  {
    std::vector<float> kT(static_cast<size_t>(HD * Tp)), s(static_cast<size_t>(Tp)), w(static_cast<size_t>(T));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      // This head's q, k, v of sample b (rows x.ld apart; k at +HD, v at +2HD), its out
      // rows and its probabilities.
      Stage stage;
      const int64_t x_off = b * T * C3 + h * 3 * HD, y_off = b * T * CO + h * HD;
      const Block x = stage.in(qkv, x_off, T, 3 * HD, C3);
      const Block y = stage.out(out, y_off, T, HD, CO);
      float* probs = stage.out(att, bh * T * T, T * T);
      transpose_rows(kT.data(), x.p + HD, T, Tp, HD, x.ld);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = round_up(t + 1, kW);
        // Scaled scores of keys 0..n-1; the causal mask then sets keys t+1..n-1 to -inf.
        row_times_transposed(s.data(), x.row(t), scale, kT.data(), n, Tp, HD);
        for (int64_t t2 = t + 1; t2 < n; ++t2) s[t2] = -std::numeric_limits<float>::infinity();
        // Stable softmax over the row (exp(-inf) = 0 for the masked keys).
        float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t t2 = 0; t2 < n; ++t2) mx = s[t2] > mx ? s[t2] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t2 = 0; t2 < n; ++t2) {
          const float e = exp_approx(s[t2] - mx);
          s[t2] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        float* a = probs + t * T;
#pragma omp simd
        for (int64_t t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? s[t2] * inv : 0.0f;
        // out_t = sum over keys of a[t2] * dropout factor[t2] * v_t2 (a in f32 even when
        // att keeps 16 bits). The dropout element index of (h, t, t2) in the sample's
        // full [heads, T, T] tensor is element_offset + (h*T + t)*T + t2.
        const float* weights = a;
        if (drop) {
          dropout_factors(dropout, b, static_cast<uint64_t>((h * T + t) * T), t + 1, w.data());
#pragma omp simd
          for (int64_t t2 = 0; t2 <= t; ++t2) w[t2] *= a[t2];
          weights = w.data();
        }
        weighted_rows(y.row(t), false, weights, 1, x.p + 2 * HD, x.ld, t + 1, HD);
      }
      stage.done(out, y_off, T, HD, CO, y);
      stage.done(att, bh * T * T, T * T, probs);
    }
  }
}

// Two sweeps per (b, h). By query rows: the gradient of the probabilities, the softmax
// backward to score gradients ds (kept in scratch), and dq. Then by key columns: dk and dv
// as weighted sums over the queries that saw each key, so every dk/dv row is written once
// instead of once per query. A (b, h) item owns its columns of dqkv, so a 16-bit dqkv is
// rounded once, after both sweeps.
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const Dropout& dropout) {
  const AttentionDims d = attention_dims(att, qkv, dout);
  const int64_t B = d.B, T = d.T, NH = d.NH, HD = d.HD, Tp = round_up(T, kW);
  TESSERA_CHECK(dqkv.numel() == qkv.numel() && scratch.numel() == att.numel(),
                "attention backward: dqkv " + shape_str(dqkv.shape) + ", scratch " + shape_str(scratch.shape));
  for (auto [t, name] : {std::pair{&dqkv, "dqkv"}, {&dout, "dout"}, {&qkv, "qkv"}, {&att, "att"}})
    check_float(*t, "attention_backward", name);
  float* dscores = f32_arg(scratch, "attention_backward", "scratch");
  const int64_t C3 = 3 * NH * HD, CO = NH * HD;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = dropout.p > 0.0f;
  if (drop) dropout_scale(dropout);
#pragma omp parallel
  {
    // With dropout, the dropped-out probabilities a' = a * factor of this (b, h), which
    // the key sweep needs for dv; without it a' = a, read from att.
    std::vector<float> vT(static_cast<size_t>(HD * Tp)), gv(static_cast<size_t>(Tp)),
        dropped(drop ? static_cast<size_t>(T * T) : 0);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      Stage stage;
      const int64_t x_off = b * T * C3 + h * 3 * HD, g_off = b * T * CO + h * HD;
      const Block x = stage.in(qkv, x_off, T, 3 * HD, C3);
      const Block dx = stage.inout(dqkv, x_off, T, 3 * HD, C3);
      const Block g = stage.in(dout, g_off, T, HD, CO);
      const float* a_bh = stage.in(att, bh * T * T, T * T);
      float* ds_bh = dscores + bh * T * T;
      transpose_rows(vT.data(), x.p + 2 * HD, T, Tp, HD, x.ld);
      for (int64_t t = 0; t < T; ++t) {
        const float* a = a_bh + t * T;
        float* ds = ds_bh + t * T;
        // Through out_t = sum_t2 a'[t2] v_t2:  d a[t2] = (dout_t . v_t2) * factor[t2].
        row_times_transposed(gv.data(), g.row(t), 1.0f, vT.data(), round_up(t + 1, kW), Tp, HD);
        if (drop) {
          float* f = dropped.data() + t * T;
          dropout_factors(dropout, b, static_cast<uint64_t>((h * T + t) * T), t + 1, f);
#pragma omp simd
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            gv[t2] *= f[t2];
            f[t2] *= a[t2];
          }
        }
        // Softmax backward: dscore = a * (da - sum(a * da)); times the 1/sqrt(HD) of the
        // scores, so ds is the gradient of q.k directly.
        float ada = 0.0f;
#pragma omp simd reduction(+ : ada)
        for (int64_t t2 = 0; t2 <= t; ++t2) ada += a[t2] * gv[t2];
#pragma omp simd
        for (int64_t t2 = 0; t2 <= t; ++t2) ds[t2] = a[t2] * (gv[t2] - ada) * scale;
        // dq_t += sum_t2 ds[t2] k_t2.
        weighted_rows(dx.row(t), true, ds, 1, x.p + HD, x.ld, t + 1, HD);
      }
      const float* ap = drop ? dropped.data() : a_bh;
      for (int64_t t2 = 0; t2 < T; ++t2) {
        // dk_t2 += sum_{t >= t2} ds[t][t2] q_t;  dv_t2 += sum_{t >= t2} a'[t][t2] dout_t.
        weighted_rows(dx.row(t2) + HD, true, ds_bh + t2 * T + t2, T, x.row(t2), x.ld, T - t2, HD);
        weighted_rows(dx.row(t2) + 2 * HD, true, ap + t2 * T + t2, T, g.row(t2), g.ld, T - t2, HD);
      }
      stage.done(dqkv, x_off, T, 3 * HD, C3, dx);
    }
  }
}

// The probabilities are the saved state, in the activations' dtype (Megatron's fused
// softmax keeps its output in the input's precision); the backward's scratch holds their
// gradient in f32.
AttentionBuffers attention_buffers(const Device&, int64_t B, int64_t NH, int64_t T, DType act_dtype) {
  return {.saved = {B, NH, T, T}, .saved_dtype = act_dtype, .scratch = {B, NH, T, T}};
}

}  // namespace tessera::ops::cpu
