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

// The Namespace Megatron's parse_args + validate_args would hold for this run: every flag of
// Megatron-LM (megatron_flags.inc) at its default, the run's values over them, and what
// validate_args and training derive (padded vocabulary, parallel sizes, params_dtype,
// model_type, consumed samples). JSON in megatron_checkpoint.h's convention.
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
// tokenizer, norms, activation, precision, parallel sizes).
std::vector<std::string> train_flags_from_megatron_args(const nlohmann::json& args);

}  // namespace tessera
