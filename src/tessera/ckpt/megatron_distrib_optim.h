// Megatron's distrib_optim.pt: the distributed optimizer's state beside model_optim_rng.pt
// in a `--ckpt-format torch` checkpoint (megatron/core/optimizer/distrib_optimizer.py,
// get_parameter_state_dp_zero / load_parameter_state_from_dp_zero, core_r0.10.0). DP rank 0
// of each (tp, pp) gathers the shards over the DP group and writes, with torch.save,
//
//   {'buckets_coalesced': True,
//    0: {(param_dtype, grad_dtype): {'param': T, 'exp_avg': T, 'exp_avg_sq': T, 'numel_unpadded': U}},
//    1: ...}
//
// one integer key per gradient buffer (one per model chunk here: one dtype), the dtype pair a
// tuple of torch dtypes. Under expert parallelism above 1 the optimizer is a ChainedOptimizer
// (megatron_optimizer_state.h) and ChainedOptimizer.save_parameter_state writes the list
// [dense's dict, expert's dict] into each EP rank's folder, None where the writing rank is not
// that optimizer's data-parallel rank 0 (the dense optimizer's DP group spans the EP ranks, so
// only EP rank 0's file holds it; each expert optimizer's is its EP rank's expert-data-parallel
// group); each optimizer's buffers are laid out over its own parameters and DP group. Each T is a flat fp32 CPU tensor of U elements: the
// buffer's buckets one after another, each cut to its numel_unpadded (the bucket-end padding
// dropped, the 64-element alignment gaps between parameters kept, as zeros). `param` holds the
// fp32 main parameters. Where a parameter sits in T follows from the buffer layout
// (parallel/grad_buffer_layout.h), which does not depend on DP except through bucket sizes:
// the file loads at another DP size, as in Megatron.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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

// What one optimizer's dict holds: the parameters of `layout` (chunks as for
// distrib_optim_placement), whose values of kind k (kDistribOptimKeys[k]) `fill` copies into a
// flat tensor: fill(p, k, dst) writes layout.params[p].numel floats. torch.save's format holds
// each buffer's kind as one flat tensor.
struct DistribOptimState {
  DType param_dtype = DType::F32, grad_dtype = DType::F32;  // the dtype pair key
  const GradBufferLayout* layout = nullptr;
  std::vector<int> chunks;
  std::function<void(size_t param, size_t kind, float* dst)> fill;
};
// Writes the file at `path` (fsynced): one optimizer's dict, or a chain's list of them (nullptr:
// None), each tensor filled only when the writer reaches it: one tensor's bytes in memory at a
// time, never the file's.
void write_distrib_optim_file(const std::string& path, const std::vector<const DistribOptimState*>& optimizers);

// One optimizer's dict read: each buffer's tensors, checked to be flat fp32 tensors of its
// numel_unpadded elements.
struct DistribOptimBuffers {
  std::vector<std::map<std::string, const pickle::TensorRef*>> buffers;
  std::vector<int64_t> numel_unpadded;
};
// A distrib_optim.pt opened for reading: one optimizer's dict, or a chain's list (nullopt where
// it holds None). Anything else is an Error naming the file.
struct DistribOptimFile {
  TorchFile file;
  std::vector<std::optional<DistribOptimBuffers>> optimizers;
};
DistribOptimFile open_distrib_optim(const std::string& path);

}  // namespace tessera
