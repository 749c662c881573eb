// Causal self-attention on CUDA (ops/kernels/attention.cl): the forward by query rows, the
// backward by query rows (score gradients into scratch, dq) then by key columns (dk, dv).
// Saved state as the CPU's contract: att keeps the softmax probabilities.
#include <cmath>

#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

constexpr int64_t kMaxHeadDim = 256;  // MAX_HD of attention.cl (its per-work-item accumulators)

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
  TESSERA_CHECK(d.HD <= kMaxHeadDim, "attention on CUDA: head dim " + std::to_string(d.HD) + " above " +
                                         std::to_string(kMaxHeadDim));
  return d;
}

void check_dropout(const Dropout& dropout) {
  TESSERA_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, "dropout probability must be in [0, 1)");
}

}  // namespace

void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout) {
  const AttentionDims d = attention_dims(att, qkv, out);
  check_dropout(dropout);
  CudaLaunch(out, "attention_forward")
      .tensor(out)
      .tensor(att)
      .tensor(qkv)
      .scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<int64_t>(d.HD)
      .scalar<float>(1.0f / std::sqrt(static_cast<float>(d.HD)))
      .dropout(dropout)
      .run(d.T, d.B * d.NH);
}

void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, const Dropout& dropout) {
  const AttentionDims d = attention_dims(att, qkv, dout);
  TESSERA_CHECK(dqkv.numel() == qkv.numel() && scratch.numel() == att.numel(),
                "attention backward: dqkv " + shape_str(dqkv.shape) + ", scratch " + shape_str(scratch.shape));
  check_dropout(dropout);
  CudaLaunch(dout, "attention_backward_rows")
      .tensor(dqkv)
      .tensor(scratch)
      .tensor(dout)
      .tensor(qkv)
      .tensor(att)
      .scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<int64_t>(d.HD)
      .scalar<float>(1.0f / std::sqrt(static_cast<float>(d.HD)))
      .dropout(dropout)
      .run(d.T, d.B * d.NH);
  CudaLaunch(dout, "attention_backward_keys")
      .tensor(dqkv)
      .tensor(scratch)
      .tensor(dout)
      .tensor(qkv)
      .tensor(att)
      .scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<int64_t>(d.HD)
      .dropout(dropout)
      .run(d.T, d.B * d.NH);
}

// The shared kernels save the probabilities; the scratch holds their gradient.
AttentionBuffers attention_buffers(const Device&, int64_t B, int64_t NH, int64_t T) {
  return {{B, NH, T, T}, {B, NH, T, T}};
}

}  // namespace tessera::ops::cuda
