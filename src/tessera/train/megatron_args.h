// The training state as Megatron-LM's checkpoints name it (--ckpt-format torch,
// ckpt/megatron_checkpoint.h): the run's argparse.Namespace, opt_param_scheduler's state, and
// back from a checkpoint's Namespace to `tessera train`'s flags (for the ckpt tools).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/train/arguments.h"

namespace tessera {

// The Namespace Megatron-LM core_r0.10.0 saves for this run: exactly its attributes
// (megatron_namespace.inc, from Megatron's own parser), each at Megatron's default unless the
// run gave its flag, then what validate_args and training derive (padded vocabulary, parallel
// sizes, params_dtype, model_type, consumed samples, ...); tessera's own flags are not in it.
// A later Megatron's attribute is added by one line after the others, where tessera's value
// differs from what that Megatron assumes without it. JSON in megatron_checkpoint.h's convention.
nlohmann::json megatron_namespace(const TrainArgs& args, int64_t consumed_train_samples,
                                  int64_t consumed_valid_samples);

// OptimizerParamScheduler.state_dict() (megatron/core/optimizer_param_scheduler.py).
nlohmann::json megatron_scheduler_state(const LrScheduleConfig& c, int64_t num_steps);
// Whether a checkpoint's scheduler settings (without num_steps) equal the schedule's in every
// field Megatron compares on load.
bool same_megatron_schedule(const nlohmann::json& saved, const LrScheduleConfig& c);
// `base` with the settings the checkpoint records (--use-checkpoint-opt_param-scheduler).
LrScheduleConfig schedule_from_megatron(const nlohmann::json& saved, LrScheduleConfig base);

// `tessera train` flags for the model a Megatron Namespace describes (shape, vocabulary and
// tokenizer with its model/vocab/merge files, norms, activation, precision, parallel sizes and
// sequence parallelism, which an MoE model at TP > 1 needs; MoE settings with
// --moe-grouped-gemm, which Megatron's load_args_from_checkpoint takes too).
std::vector<std::string> train_flags_from_megatron_args(const nlohmann::json& args);

}  // namespace tessera
