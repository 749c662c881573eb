// Vocabulary-parallel cross-entropy pieces on CUDA (ops/kernels/cross_entropy.cl); checks
// as ops/cpu/cross_entropy.cpp.
#include <initializer_list>

#include "tessera/ops/cpu/vocab_shard.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

int64_t check_rows(const Tensor& logits, std::initializer_list<const Tensor*> per_row, const char* op) {
  TESSERA_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, std::string(op) + ": logits " + shape_str(logits.shape));
  const int64_t N = logits.numel() / logits.dim(-1);
  for (const Tensor* t : per_row)
    TESSERA_CHECK(t->numel() == N, std::string(op) + ": logits " + shape_str(logits.shape) + " vs per-row " +
                                       shape_str(t->shape));
  return N;
}

}  // namespace

void cross_entropy_max(Tensor row_max, Tensor logits) {
  const int64_t N = check_rows(logits, {&row_max}, "cross_entropy_max");
  CudaLaunch(logits, "cross_entropy_max").tensor(row_max).tensor(logits).scalar<int64_t>(logits.dim(-1)).run(N);
}

void cross_entropy_sums(Tensor sum_exp, Tensor target_logit, Tensor logits, Tensor targets, Tensor row_max,
                        int64_t vocab_start, int64_t vocab_size) {
  const int64_t N = check_rows(logits, {&sum_exp, &target_logit, &targets, &row_max}, "cross_entropy_sums");
  const int64_t V = logits.dim(-1);
  const cpu::VocabShard shard = cpu::vocab_shard(vocab_start, V, vocab_size, "cross_entropy_sums");
  check_ids_on_host(targets, shard.total, "cross-entropy target");
  CudaLaunch(logits, "cross_entropy_sums")
      .tensor(sum_exp)
      .tensor(target_logit)
      .tensor(logits)
      .tensor(targets)
      .tensor(row_max)
      .scalar<int64_t>(V)
      .scalar<int64_t>(shard.start)
      .run(N);
}

void cross_entropy_finish(Tensor losses, Tensor logsumexp, Tensor sum_exp, Tensor row_max, Tensor target_logit) {
  const int64_t N = losses.numel();
  for (const Tensor* t : {&logsumexp, &sum_exp, &row_max, &target_logit})
    TESSERA_CHECK(t->numel() == N, "cross_entropy_finish: losses " + shape_str(losses.shape) + " vs " +
                                       shape_str(t->shape));
  CudaLaunch(losses, "cross_entropy_finish")
      .tensor(losses)
      .tensor(logsumexp)
      .tensor(sum_exp)
      .tensor(row_max)
      .tensor(target_logit)
      .run(N);
}

void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor logsumexp,
                            int64_t vocab_start, int64_t vocab_size) {
  const int64_t N = check_rows(logits, {&dlosses, &targets, &logsumexp}, "cross_entropy_backward");
  const int64_t V = logits.dim(-1);
  TESSERA_CHECK(dlogits.numel() == logits.numel() && dlogits.dim(-1) == V,
                "cross_entropy_backward: dlogits " + shape_str(dlogits.shape) + " vs logits " +
                    shape_str(logits.shape));
  const cpu::VocabShard shard = cpu::vocab_shard(vocab_start, V, vocab_size, "cross_entropy_backward");
  check_ids_on_host(targets, shard.total, "cross-entropy target");
  CudaLaunch(logits, "cross_entropy_backward_softmax")
      .tensor(dlogits)
      .tensor(dlosses)
      .tensor(logits)
      .tensor(logsumexp)
      .scalar<int64_t>(V)
      .run(V, N);
  CudaLaunch(logits, "cross_entropy_backward_target")
      .tensor(dlogits)
      .tensor(dlosses)
      .tensor(targets)
      .scalar<int64_t>(V)
      .scalar<int64_t>(shard.start)
      .run(N);
}

}  // namespace tessera::ops::cuda
