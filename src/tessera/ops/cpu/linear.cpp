// Linear layer on Megatron's [out, in] weight layout, all GEMMs through oneDNN (gemm.h).
// Legend: N rows (= B*T, leading dims flattened), C input channels, OC output channels.
//   forward:  out[N,OC]   = inp[N,C] @ W[OC,C]^T + bias[OC]
//   backward: dinp[N,C]  += dout[N,OC] @ W[OC,C]
//             dW[OC,C]   += dout[N,OC]^T @ inp[N,C]
//             dbias[OC]  += column sums of dout (bias_add_backward)
// The accumulating GEMMs use beta = 1, so gradient accumulation costs nothing extra.
// bias_add_forward / bias_add_backward are the bias alone, for row-parallel linears that
// add it after the tensor-parallel reduction.
#include <algorithm>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/gemm.h"

namespace tessera::ops::cpu {

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && out.numel() == N * OC && out.dim(-1) == OC &&
                    (bias.empty() || bias.numel() == OC),
                "linear: inp " + shape_str(inp.shape) + ", weight " + shape_str(weight.shape) + ", out " +
                    shape_str(out.shape));
  float* y = out.f32();
  float beta = 0.0f;
  if (!bias.empty()) {
    // Broadcast the bias into out and let the GEMM add onto it (beta = 1): one pass over
    // out instead of a GEMM pass plus a bias pass.
    const float* b = bias.f32();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + OC, y + n * OC);
    beta = 1.0f;
  }
  sgemm(false, true, N, OC, C, 1.0f, inp.f32(), C, weight.f32(), C, beta, y, OC);
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && dout.numel() == N * OC && dout.dim(-1) == OC,
                "linear backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == OC * C) &&
                    (dbias.empty() || dbias.numel() == OC),
                "linear backward: gradient shapes");
  const float* dy = dout.f32();
  if (!dinp.empty()) sgemm(false, false, N, C, OC, 1.0f, dy, OC, weight.f32(), C, 1.0f, dinp.f32(), C);
  if (!dweight.empty()) sgemm(true, false, OC, C, N, 1.0f, dy, OC, inp.f32(), C, 1.0f, dweight.f32(), C);
  if (!dbias.empty()) bias_add_backward(dbias, dout);
}

void bias_add_forward(Tensor out, Tensor inp, Tensor bias) {
  const int64_t OC = bias.numel();
  TESSERA_CHECK(OC > 0 && out.ndim() >= 1 && out.dim(-1) == OC && inp.numel() == out.numel() &&
                    inp.dim(-1) == OC,
                "bias_add: out " + shape_str(out.shape) + ", inp " + shape_str(inp.shape) + ", bias " +
                    shape_str(bias.shape));
  const int64_t N = out.numel() / OC;
  const float* x = inp.f32();
  const float* b = bias.f32();
  float* y = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
#pragma omp simd
    for (int64_t o = 0; o < OC; ++o) y[n * OC + o] = x[n * OC + o] + b[o];
  }
}

void bias_add_backward(Tensor dbias, Tensor dout) {
  const int64_t OC = dbias.numel();
  TESSERA_CHECK(OC > 0 && dout.ndim() >= 1 && dout.dim(-1) == OC,
                "bias_add backward: dbias " + shape_str(dbias.shape) + ", dout " + shape_str(dout.shape));
  const int64_t N = dout.numel() / OC;
  const float* dy = dout.f32();
  float* db = dbias.f32();
  // Column sums: threads own column blocks and walk the rows in order (deterministic for
  // any thread count, vectorised along the row).
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t o0 = blk * kBlock, len = std::min(kBlock, OC - o0);
    float acc[kBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = dy + n * OC + o0;
#pragma omp simd
      for (int64_t o = 0; o < len; ++o) acc[o] += row[o];
    }
    for (int64_t o = 0; o < len; ++o) db[o0 + o] += acc[o];
  }
}

}  // namespace tessera::ops::cpu
