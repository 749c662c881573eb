// Megatron's distrib_optim.pt: the distributed optimizer's state beside model_optim_rng.pt
// in a `--ckpt-format torch` checkpoint (megatron/core/optimizer/distrib_optimizer.py,
// get_parameter_state_dp_zero / load_parameter_state_from_dp_zero, core_r0.10.0). DP rank 0
// of each (tp, pp) gathers the shards over the DP group and writes, with torch.save,
//
//   {'buckets_coalesced': True,
//    0: {(param_dtype, grad_dtype): {'param': T, 'exp_avg': T, 'exp_avg_sq': T, 'numel_unpadded': U}},
//    1: ...}
//
// one integer key per gradient buffer (one per model chunk here: one dtype, no experts), the
// dtype pair a tuple of torch dtypes. Each T is a flat fp32 CPU tensor of U elements: the
// buffer's buckets one after another, each cut to its numel_unpadded (the bucket-end padding
// dropped, the 64-element alignment gaps between parameters kept, as zeros). `param` holds the
// fp32 main parameters. Where a parameter sits in T follows from the buffer layout
// (parallel/grad_buffer_layout.h), which does not depend on DP except through bucket sizes:
// the file loads at another DP size, as in Megatron.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/ckpt/torch_file.h"
#include "tessera/core/tensor.h"
#include "tessera/parallel/grad_buffer_layout.h"

namespace tessera {

inline constexpr const char* kDistribOptimFile = "distrib_optim.pt";
// The file's tensors, in Megatron's order.
inline constexpr const char* kDistribOptimKeys[] = {"param", "exp_avg", "exp_avg_sq"};

// Where each parameter of a rank's buffer layout sits in the file: its buffer (model chunk)
// and its offset in that buffer's tensors; and each buffer's numel_unpadded.
struct DistribOptimPlacement {
  std::vector<int> buffer;      // per parameter (registration index)
  std::vector<int64_t> offset;  // per parameter
  std::vector<int64_t> numel_unpadded;  // per buffer
};
// chunks: each parameter's model chunk (non-decreasing), as the layout was built with.
DistribOptimPlacement distrib_optim_placement(const GradBufferLayout& layout, const std::vector<int>& chunks);

// What one rank's file holds: its tensors are cut from whole buffers laid out by `layout` in
// host memory (whole[k]: kDistribOptimKeys[k], layout.numel floats; chunks as for
// distrib_optim_placement). torch.save's format holds each of them as one flat tensor.
struct DistribOptimState {
  DType param_dtype = DType::F32, grad_dtype = DType::F32;  // the dtype pair key
  const GradBufferLayout* layout = nullptr;
  std::vector<int> chunks;
  std::vector<const float*> whole;
};
// Writes the file at `path` (fsynced), each tensor cut from the whole buffers only when the
// writer reaches it: one tensor's bytes in memory at a time, never the file's.
void write_distrib_optim_file(const std::string& path, const DistribOptimState& state);

// A distrib_optim.pt opened for reading: each buffer's tensors, checked to be flat fp32
// tensors of its numel_unpadded elements. Anything else is an Error naming the file.
struct DistribOptimFile {
  TorchFile file;
  std::vector<std::map<std::string, const pickle::TensorRef*>> buffers;
  std::vector<int64_t> numel_unpadded;
};
DistribOptimFile open_distrib_optim(const std::string& path);

}  // namespace tessera
