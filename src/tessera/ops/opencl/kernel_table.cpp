#include <string>

#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

// CLBlast has no version call; the device's own driver and OpenCL C version are in the
// device's description (doctor's device row).
std::string libraries() { return "OpenCL C kernels of tessera, CLBlast GEMMs"; }

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table{
      .backend = "opencl",
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

}  // namespace tessera::ops::opencl
