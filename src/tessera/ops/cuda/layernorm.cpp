// CUDA's host side of ops/kernels/layernorm_host.inc, with its own kernels for LayerNorm
// and RMSNorm (row_kernels.cuh): each forward and input gradient a row per block of
// kRowThreads threads (launched over kRowThreads * N work-items, so blockIdx.x is the row),
// the parameter gradients as column sums in two passes (column_sums.h). In the default
// mode the forwards and input gradients run the native typed kernels (norm_kernels.h) where
// the tensors share a dtype; --deterministic-mode keeps the row kernels' order and bits.
#include <initializer_list>
#include <optional>

#include "tessera/ops/cuda/column_sums.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/norm_kernels.h"

namespace tessera::ops::cuda {
namespace {

// Threads per row: the launcher's largest block (cuda_launch.cpp), so kRowThreads * N
// work-items run in blocks of exactly kRowThreads and a block is a row (a smaller value
// would put several rows in one block). GPT-2's C = 768 gives each thread 3 columns.
constexpr int64_t kRowThreads = 256;

// layernorm_host.inc's layernorm_params: pass 1 into both partials, pass 2 for each
// gradient present.
void layernorm_params(const Tensor& dweight, const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                      const Tensor& mean, const Tensor& rstd, int64_t C, int64_t N) {
  const int64_t blocks = column_blocks(N);
  if (blocks == 0) return;  // no rows: nothing to add
  const size_t bytes = static_cast<size_t>(blocks * C) * sizeof(float);
  const Pieces partials(*dout.device, {bytes, bytes});
  auto* w = static_cast<float*>(partials[0]);
  auto* b = static_cast<float*>(partials[1]);
  CudaLaunch(dout, "layernorm_backward_params_partials")
      .pointer(w)
      .pointer(b)
      .floats(dout)
      .floats(inp)
      .tensor(mean)
      .tensor(rstd)
      .scalar<int64_t>(C)
      .scalar<int64_t>(N)
      .scalar<int64_t>(kColumnBlockRows)
      .run(C, blocks);
  if (!dweight.empty()) add_column_partials(dweight, w, C, blocks);
  if (!dbias.empty()) add_column_partials(dbias, b, C, blocks);
}

// layernorm_host.inc's rmsnorm_weight, likewise.
void rmsnorm_weight(const Tensor& dweight, const Tensor& dout, const Tensor& inp, const Tensor& rstd, int64_t C,
                    int64_t N) {
  const int64_t blocks = column_blocks(N);
  if (blocks == 0) return;  // no rows: nothing to add
  const Pieces partials(*dout.device, {static_cast<size_t>(blocks * C) * sizeof(float)});
  auto* w = static_cast<float*>(partials[0]);
  CudaLaunch(dout, "rmsnorm_backward_weight_partials")
      .pointer(w)
      .floats(dout)
      .floats(inp)
      .tensor(rstd)
      .scalar<int64_t>(C)
      .scalar<int64_t>(N)
      .scalar<int64_t>(kColumnBlockRows)
      .run(C, blocks);
  add_column_partials(dweight, w, C, blocks);
}

float* floats(const Tensor& t) { return static_cast<float*>(memory(t)); }

// The native kernels' arguments for a call whose tensors (empty ones aside) share inp's
// dtype, outside --deterministic-mode, with rows that fit (norm_serves); else nothing.
std::optional<native::NormArgs> native_args(bool rms, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                            const Tensor& mean, const Tensor& rstd,
                                            std::initializer_list<const Tensor*> others) {
  const int64_t C = inp.dim(-1);
  if (inp.device->deterministic_mode() || !native::norm_serves(C)) return std::nullopt;
  for (const Tensor* t : others)
    if (!t->empty() && t->dtype != inp.dtype) return std::nullopt;
  if (weight.dtype != inp.dtype || (!bias.empty() && bias.dtype != inp.dtype)) return std::nullopt;
  return native::NormArgs{inp.dtype,      rms,           inp.numel() / C, C,           memory(inp),
                          memory(weight), memory(bias),  floats(mean),    floats(rstd)};
}

bool native_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                              const Tensor& weight, const Tensor& bias, float eps) {
  const auto a = native_args(false, inp, weight, bias, mean, rstd, {&out});
  if (a) native::norm_forward(*a, memory(out), eps, stream_of(out));
  return a.has_value();
}

bool native_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                            float eps) {
  const auto a = native_args(true, inp, weight, Tensor(), Tensor(), rstd, {&out});
  if (a) native::norm_forward(*a, memory(out), eps, stream_of(out));
  return a.has_value();
}

bool native_layernorm_backward_input(const Tensor& dinp, const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, GradWrite write) {
  const auto a = native_args(false, inp, weight, Tensor(), mean, rstd, {&dinp, &dout});
  if (a) native::norm_backward_input(*a, memory(dinp), memory(dout), write == GradWrite::Assign, stream_of(dinp));
  return a.has_value();
}

bool native_rmsnorm_backward_input(const Tensor& dinp, const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                   const Tensor& rstd, GradWrite write) {
  const auto a = native_args(true, inp, weight, Tensor(), Tensor(), rstd, {&dinp, &dout});
  if (a) native::norm_backward_input(*a, memory(dinp), memory(dout), write == GradWrite::Assign, stream_of(dinp));
  return a.has_value();
}

}  // namespace
}  // namespace tessera::ops::cuda

#define TESSERA_BACKEND cuda
#define TESSERA_NORM_ROW_KERNEL(name) name "_rows"
#define TESSERA_NORM_ROW_ITEMS(N) (kRowThreads * (N))
#define TESSERA_OWN_NORM_PARAMS
#define TESSERA_NATIVE_NORMS
#include "tessera/ops/kernels/layernorm_host.inc"
#undef TESSERA_NATIVE_NORMS
#undef TESSERA_OWN_NORM_PARAMS
#undef TESSERA_NORM_ROW_ITEMS
#undef TESSERA_NORM_ROW_KERNEL
#undef TESSERA_BACKEND
