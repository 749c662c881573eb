// The optimizer state of Megatron-LM's `--ckpt-format torch` files, model_optim_rng.pt's
// `optimizer` (megatron/core/optimizer/, core_r0.10.0), read and written for
// megatron_checkpoint.h, and the unsharded part torch_dist's common.pt keeps:
//
//   - one optimizer: torch's state_dict, {'state': {index: {'step', 'exp_avg', 'exp_avg_sq'}},
//     'param_groups': [...]}, over Megatron's parameter groups (__init__.py _get_param_groups:
//     one per weight-decay class, in order of first appearance, with wd_mult, lr_mult,
//     is_expert_parallel, is_decoupled_lr, max_lr, min_lr), indices numbered through the groups;
//     FP32Optimizer saves it as is, Float16OptimizerWithFloat16Params (bf16/fp16) as
//     {'optimizer', 'grad_scaler' (fp16), 'fp32_from_fp16_params' (the fp32 main parameters, per
//     group)};
//   - expert parallelism above 1: the local experts' parameters are allreduce=False
//     (tensor_parallel/layers.py), so get_megatron_optimizer builds a dense optimizer over the
//     others and an expert optimizer over them (is_expert_parallel groups, its data-parallel
//     group the expert-data-parallel one), chained: ChainedOptimizer.state_dict() is the list
//     [dense's, expert's], each as above with its own indices from 0 (a file whose stage holds no
//     experts keeps the dense one alone). tessera writes its one loss scaler's state into both;
//   - the distributed optimizer: only the groups (without params, with step) and the grad
//     scaler (chained too at EP > 1); the tensors are in distrib_optim.pt beside the file
//     (megatron_distrib_optim.h), a chain's list at EP > 1.
//
// Reading maps each saved state tensor onto its parameter by group position (the file's
// parameters in its model state dict's order are the optimizer's order), into pieces that
// reshard like the model's.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/megatron_distrib_optim.h"
#include "tessera/ckpt/megatron_values.h"
#include "tessera/ckpt/torch_file.h"

namespace tessera {

// ---- Writing --------------------------------------------------------------------------------

// model_optim_rng.pt's `optimizer` for `params` (Megatron's registration order): one optimizer's
// state dict, or the [dense, expert] list when some parameter is expert_parallel.
pickle::Value* megatron_optimizer_state(pickle::Document& doc, megatron::FileTensors& tensors,
                                        const MegatronFileSpec& spec, const std::vector<MegatronParam>& params);

// distrib_optim.pt for `params` (their value the main parameters, their state the moments) at
// `path`: one optimizer's dict, or at EP > 1 the chain's [dense, expert] list, the dense one
// None unless with_dense (this rank is the dense optimizer's data-parallel rank 0). Each
// optimizer's buffers are laid out as Megatron lays out its parameters over its data-parallel
// group (the args' data-parallel size, or the expert-data-parallel size).
void write_megatron_distrib_optim(const std::string& path, const MegatronFileSpec& spec,
                                  const std::vector<MegatronParam>& params, bool with_dense);

// torch_dist common.pt's `optimizer` (write_torch_dist_common in megatron_checkpoint.h).
pickle::Value* torch_dist_optimizer_state(pickle::Document& doc, megatron::FileTensors& tensors,
                                          const MegatronFileSpec& spec, const std::vector<bool>& group_weight_decay);

// ---- Reading --------------------------------------------------------------------------------

// One parameter of a rank's file, in its model state dict's order.
struct MegatronOptimizerParam {
  std::string name;                          // tessera's global name
  const pickle::TensorRef* model = nullptr;  // its model tensor
  bool weight_decay = true;
  bool expert_parallel = false;  // a local expert's, saved at an expert-parallel size above 1
  // false: counted in the groups, not read (the replicas in files of EP ranks above 0, which EP
  // rank 0's file gives; the tied output layer's copy of the word embedding)
  bool wanted = true;
  int chunk = 0;  // its model chunk
};

// Receives each state tensor read: "<kind>.<name>" (exp_avg, exp_avg_sq, momentum_buffer), the
// file holding its data, the tensor.
using OptimizerStateSink =
    std::function<void(const std::string& key, const TorchFile& holder, const pickle::TensorRef& tensor)>;
// The fp32 main parameters by name (fp32_from_fp16_params, or distrib_optim.pt's `param`).
using MainParams = std::map<std::string, const pickle::TensorRef*>;

// The optimizer state of model_optim_rng.pt `file`, whose parameters are `params`. An Error
// naming the file when it has none or its groups do not match the parameters.
void read_megatron_optimizer(const TorchFile& file, const std::vector<MegatronOptimizerParam>& params,
                             const OptimizerStateSink& add, MainParams& main);

// The steps taken (Adam's `step`) and the fp16 grad scaler of the file's optimizer (the dense
// one of a chain), into s.
void read_megatron_optimizer_progress(const TorchFile& file, CheckpointState& s);

// What `ckpt inspect` says of a file's optimizer state.
std::string describe_megatron_optimizer(const TorchFile& file, bool distrib_optim_beside);

// Whether the files (folders relative to it_dir) keep their optimizer state in distrib_optim.pt
// (every one, or none: an Error otherwise).
bool uses_distrib_optim(const std::string& it_dir, const std::vector<std::string>& folders);

// The optimizer state of one file from its distrib_optim.pt `d`: each parameter's range of the
// flat tensors, located by the saving rank's buffer layout (args: the saved Namespace;
// first_stage: the saving rank's pipeline stage is 0; tied: tied embeddings), becomes a tensor
// of the parameter's shape over the same storage, kept in `views`.
void read_distrib_optim(const DistribOptimFile& d, const TorchFile& model_file,
                        const std::vector<MegatronOptimizerParam>& params, const nlohmann::json& args,
                        bool first_stage, bool tied, std::deque<pickle::TensorRef>& views,
                        const OptimizerStateSink& add, MainParams& main);

}  // namespace tessera
