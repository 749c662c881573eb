// CUDA's host side of ops/kernels/embedding_host.inc (the forward), with the backward on the
// native kernels (embedding_kernels.h): sorted runs, the CPU's bits, in every mode.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/embedding_kernels.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_EMBEDDING_BACKWARD
#include "tessera/ops/kernels/embedding_host.inc"
#undef TESSERA_OWN_EMBEDDING_BACKWARD
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

native::EmbeddingTableGrad table_grad(const Tensor& table, const Tensor& ids, int64_t start) {
  return {table.dtype, memory<void>(table), table.dim(0), memory<const int32_t>(ids), start};
}

}  // namespace

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions, int64_t vocab_start,
                        int64_t vocab_size) {
  TESSERA_CHECK(dout.ndim() >= 1 && dout.dim(-1) > 0, "embedding backward: dout " + shape_str(dout.shape));
  if (dwte.empty() && dwpe.empty()) return;
  const int64_t C = dout.dim(-1), N = dout.numel() / C;
  const cpu::VocabShard shard = checked_shard(dwte, tokens, C, N, vocab_start, vocab_size, "embedding backward");
  check_positions(dwpe, positions, C, N, "embedding backward");
  check_floating("embedding_backward", {{"dwte", dwte}, {"dwpe", dwpe}, {"dout", dout}});
  if (N == 0) return;
  const cudaStream_t stream = stream_of(dout);
  const Pieces scratch(*dout.device, {native::embedding_backward_scratch_bytes(N)});
  // The two tables one after the other on the stream, so they share the scratch.
  if (!dwte.empty())
    native::embedding_table_backward(table_grad(dwte, tokens, shard.start), dout.dtype, memory<const void>(dout), N, C,
                                     scratch[0], stream);
  if (!dwpe.empty())
    native::embedding_table_backward(table_grad(dwpe, positions, 0), dout.dtype, memory<const void>(dout), N, C,
                                     scratch[0], stream);
}

}  // namespace tessera::ops::cuda
