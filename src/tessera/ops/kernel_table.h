// One kernel table per backend: a struct of function pointers with exactly the signatures
// of the ops in ops.h, reached from the tensors' device (ops.cpp). A backend with every op
// builds its table with TESSERA_COMPLETE_KERNEL_TABLE; a null entry means "not supported",
// which check_supported() reports at start-up naming the op and the device.
//
// Adding an op: its contract in ops.h, its name in TESSERA_OPS below, and one kernel per
// backend, defined in ops/<backend>/ (TESSERA_DECLARE_KERNELS declares it).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessera/ops/ops.h"

namespace tessera {
class Device;
}

namespace tessera::ops {

#define TESSERA_OPS(X)                                                                             \
  X(embedding_forward) X(embedding_backward) X(layernorm_forward) X(layernorm_backward)            \
  X(rmsnorm_forward) X(rmsnorm_backward) X(linear_forward) X(linear_backward) X(bias_add_forward)  \
  X(bias_add_backward) X(attention_forward) X(attention_backward) X(attention_buffers)             \
  X(attention_qkv_forward) X(attention_qkv_backward) X(swiglu_forward) X(swiglu_backward)          \
  X(gelu_forward) X(gelu_backward) X(dropout_forward) X(dropout_backward) X(residual_forward)      \
  X(residual_backward) X(cross_entropy_max) X(cross_entropy_sums) X(cross_entropy_finish)          \
  X(cross_entropy_backward) X(sequence_to_rank_major) X(rank_major_to_sequence) X(adamw_update)    \
  X(sgd_update) X(sum_squares) X(scale_inplace) X(masked_loss_sums) X(masked_loss_backward)        \
  X(init_normal) X(fill) X(convert) X(multi_tensor_adamw) X(multi_tensor_sgd)                      \
  X(multi_tensor_sum_squares) X(multi_tensor_sum_squares_workspace) X(grad_norm_finish)

struct KernelTable {
  const char* backend = "";
  // The libraries the kernels run on, with versions ("oneDNN 2.6.3"), for doctor.
  std::string (*libraries)() = nullptr;
#define TESSERA_KERNEL_ENTRY(op) decltype(&ops::op) op = nullptr;
  TESSERA_OPS(TESSERA_KERNEL_ENTRY)
#undef TESSERA_KERNEL_ENTRY
};

// Declares, in the namespace where it expands, a kernel for every op with exactly the op's
// type in ops.h: a backend's <backend>_ops.h is this one line, so a signature is written
// once. A definition spelled differently would be another overload, leaving the declared
// kernel undefined: TESSERA_COMPLETE_KERNEL_TABLE's assignment then fails to link.
#define TESSERA_DECLARE_KERNEL(op) decltype(::tessera::ops::op) op;
#define TESSERA_DECLARE_KERNELS() TESSERA_OPS(TESSERA_DECLARE_KERNEL)

// The table of a backend with a kernel for every op: the functions of the ops' names in the
// namespace where it expands (ops/<backend>/kernel_table.cpp), plus its name and libraries.
#define TESSERA_KERNEL_TABLE_ASSIGN(op) table.op = op;
#define TESSERA_COMPLETE_KERNEL_TABLE(backend_name, libraries_fn) \
  [] {                                                           \
    ::tessera::ops::KernelTable table;                           \
    table.backend = backend_name;                                \
    table.libraries = libraries_fn;                              \
    TESSERA_OPS(TESSERA_KERNEL_TABLE_ASSIGN)                     \
    return table;                                                \
  }()

// The table of the backend `device` belongs to.
const KernelTable& kernels_for(const Device& device);
// Whether `device` has a kernel for the op named `op` (as in ops.h); false for unknown names.
bool supports(const Device& device, std::string_view op);
// Throws a runtime Error naming the first op of `ops` that `device` lacks, and the device.
// On the strict test device it also declares them: from then on an op outside every list it
// was given fails there, naming the op (the test that the start-up list is complete).
void check_supported(const Device& device, const std::vector<std::string_view>& ops);

}  // namespace tessera::ops
