// Token + position embedding on CUDA (ops/kernels/embedding.cl); shape and index checks as
// ops/cpu/embedding.cpp.
#include "tessera/ops/cpu/vocab_shard.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

// The vocabulary shard wte holds, after checking the tokens against it (rows 0 when absent).
cpu::VocabShard checked_shard(const Tensor& table, const Tensor& tokens, int64_t C, int64_t N, int64_t vocab_start,
                              int64_t vocab_size, const char* op) {
  if (table.empty()) return {};
  TESSERA_CHECK(table.ndim() == 2 && table.dim(1) == C && tokens.numel() == N,
                std::string(op) + ": table " + shape_str(table.shape) + ", tokens " + shape_str(tokens.shape) +
                    " for " + std::to_string(N) + " rows of " + std::to_string(C));
  const cpu::VocabShard shard = cpu::vocab_shard(vocab_start, table.dim(0), vocab_size, op);
  check_ids_on_host(tokens, shard.total, "token id");
  return shard;
}

void check_positions(const Tensor& table, const Tensor& positions, int64_t C, int64_t N, const char* op) {
  if (table.empty()) return;
  TESSERA_CHECK(table.ndim() == 2 && table.dim(1) == C && positions.numel() == N,
                std::string(op) + ": wpe " + shape_str(table.shape) + ", positions " + shape_str(positions.shape));
  check_ids_on_host(positions, table.dim(0), "position id");
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe, int64_t vocab_start,
                       int64_t vocab_size) {
  TESSERA_CHECK(out.ndim() >= 1 && out.dim(-1) > 0, "embedding: out " + shape_str(out.shape));
  const int64_t C = out.dim(-1), N = out.numel() / C;
  const cpu::VocabShard shard = checked_shard(wte, tokens, C, N, vocab_start, vocab_size, "embedding");
  check_positions(wpe, positions, C, N, "embedding");
  CudaLaunch(out, "embedding_forward")
      .tensor(out)
      .tensor(wte.empty() ? Tensor() : tokens)
      .tensor(wpe.empty() ? Tensor() : positions)
      .tensor(wte)
      .tensor(wpe)
      .scalar<int64_t>(C)
      .scalar<int64_t>(shard.start)
      .scalar<int64_t>(shard.rows)
      .run(C, N);
}

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions, int64_t vocab_start,
                        int64_t vocab_size) {
  TESSERA_CHECK(dout.ndim() >= 1 && dout.dim(-1) > 0, "embedding backward: dout " + shape_str(dout.shape));
  if (dwte.empty() && dwpe.empty()) return;
  const int64_t C = dout.dim(-1), N = dout.numel() / C;
  const cpu::VocabShard shard = checked_shard(dwte, tokens, C, N, vocab_start, vocab_size, "embedding backward");
  check_positions(dwpe, positions, C, N, "embedding backward");
  CudaLaunch(dout, "embedding_backward")
      .tensor(dwte)
      .tensor(dwpe)
      .tensor(dout)
      .tensor(dwte.empty() ? Tensor() : tokens)
      .tensor(dwpe.empty() ? Tensor() : positions)
      .scalar<int64_t>(C)
      .scalar<int64_t>(N)
      .scalar<int64_t>(shard.start)
      .scalar<int64_t>(shard.rows)
      .run(C);
}

}  // namespace tessera::ops::cuda
