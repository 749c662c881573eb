#include <string>

#include <cublasLt.h>

#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

// The GPU, driver and runtime versions are in the device's description (doctor's device row).
std::string libraries() {
  const size_t v = cublasLtGetVersion();
  return "tessera's kernels (ops/kernels, built with CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
         std::to_string(CUDART_VERSION % 1000 / 10) + "), cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " GEMMs";
}

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table{
      .backend = "cuda",
      .libraries = libraries,
      .embedding_forward = embedding_forward,
      .embedding_backward = embedding_backward,
      .layernorm_forward = layernorm_forward,
      .layernorm_backward = layernorm_backward,
      .linear_forward = linear_forward,
      .linear_backward = linear_backward,
      .bias_add_forward = bias_add_forward,
      .bias_add_backward = bias_add_backward,
      .attention_forward = attention_forward,
      .attention_backward = attention_backward,
      .attention_buffers = attention_buffers,
      .gelu_forward = gelu_forward,
      .gelu_backward = gelu_backward,
      .dropout_forward = dropout_forward,
      .dropout_backward = dropout_backward,
      .residual_forward = residual_forward,
      .residual_backward = residual_backward,
      .cross_entropy_max = cross_entropy_max,
      .cross_entropy_sums = cross_entropy_sums,
      .cross_entropy_finish = cross_entropy_finish,
      .cross_entropy_backward = cross_entropy_backward,
      .sequence_to_rank_major = sequence_to_rank_major,
      .rank_major_to_sequence = rank_major_to_sequence,
      .adamw_update = adamw_update,
      .sgd_update = sgd_update,
      .sum_squares = sum_squares,
      .scale_inplace = scale_inplace,
      .masked_loss_sums = masked_loss_sums,
      .masked_loss_backward = masked_loss_backward,
      .init_normal = init_normal,
      .fill = fill,
  };
  return table;
}

}  // namespace tessera::ops::cuda
