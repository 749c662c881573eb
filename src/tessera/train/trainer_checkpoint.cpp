// Trainer's checkpoint side: what a checkpoint holds of the training state, saving it and
// resuming from it (ckpt/checkpoint.h has the file layout).
#include <chrono>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/train/trainer.h"

namespace tessera {
namespace {

// The schedule's settings as a checkpoint records them; a resume compares them with the flags
// (megatron.md §7, "On resume").
nlohmann::json schedule_json(const LrScheduleConfig& c) {
  return {{"max_lr", c.max_lr},
          {"min_lr", c.min_lr},
          {"init_lr", c.init_lr},
          {"warmup_steps", c.warmup_steps},
          {"decay_steps", c.decay_steps},
          {"decay_style", static_cast<int>(c.decay_style)},
          {"wsd_decay_steps", c.wsd_decay_steps},
          {"wsd_style", static_cast<int>(c.wsd_style)},
          {"start_wd", c.start_wd},
          {"end_wd", c.end_wd},
          {"wd_incr_steps", c.wd_incr_steps},
          {"wd_style", static_cast<int>(c.wd_style)}};
}

LrScheduleConfig schedule_from_json(const nlohmann::json& j) {
  LrScheduleConfig c;
  c.max_lr = j.at("max_lr");
  c.min_lr = j.at("min_lr");
  c.init_lr = j.at("init_lr");
  c.warmup_steps = j.at("warmup_steps");
  c.decay_steps = j.at("decay_steps");
  c.decay_style = static_cast<LrDecayStyle>(j.at("decay_style").get<int>());
  c.wsd_decay_steps = j.at("wsd_decay_steps");
  c.wsd_style = static_cast<WsdDecayStyle>(j.at("wsd_style").get<int>());
  c.start_wd = j.at("start_wd");
  c.end_wd = j.at("end_wd");
  c.wd_incr_steps = j.at("wd_incr_steps");
  c.wd_style = static_cast<WdIncrStyle>(j.at("wd_style").get<int>());
  return c;
}

std::vector<NamedTensor> model_tensors(const GPTModel& model) {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < model.shards().size(); ++i) out.push_back({model.shards()[i].spec.name, model.params()[i]});
  return out;
}

std::vector<NamedTensor> optimizer_tensors(const Optimizer& optimizer) {
  std::vector<NamedTensor> out;
  for (auto& [name, t] : optimizer.state_tensors()) out.push_back({name, t});
  return out;
}

}  // namespace

void Trainer::save_checkpoint(const std::string& dir) {
  if (log_rank() == 0) {
    CheckpointState state;
    state.iteration = iteration_;
    state.consumed_train_samples = consumed_samples_;
    state.consumed_valid_samples = consumed_valid_samples_;
    state.scheduler_num_steps = scheduler_.num_steps();
    state.optimizer_steps = optimizer_->steps_taken();
    state.scheduler = schedule_json(args_.lr_schedule);
    state.args = args_.command_line;
    const auto t0 = std::chrono::steady_clock::now();
    tessera::save_checkpoint(dir, state, model_tensors(model_),
                             args_.no_save_optim ? std::vector<NamedTensor>{} : optimizer_tensors(*optimizer_));
    print_rank_0("  successfully saved checkpoint from iteration %7lld to %s [ t 1/1, p 1/1 ] (%.1f s)",
                 static_cast<long long>(iteration_), dir.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Nobody runs ahead of a save that may yet fail.
  if (groups_.world && groups_.world->size() > 1) groups_.world->barrier();
}

void Trainer::load_checkpoint(const std::string& dir) {
  const std::optional<int64_t> latest = latest_checkpoint_iteration(dir);
  if (!latest) {
    log_warn("could not find a checkpoint in --load %s (no latest_checkpointed_iteration.txt); starting from "
             "random initialisation", dir.c_str());
    return;
  }
  const bool load_optimizer = !args_.no_load_optim && !args_.finetune;
  CheckpointState s = tessera::load_checkpoint(dir, *latest, model_tensors(model_), optimizer_tensors(*optimizer_),
                                               load_optimizer);
  print_rank_0(" loading checkpoint from %s at iteration %lld", dir.c_str(), static_cast<long long>(*latest));
  if (args_.finetune) return;  // iteration 0, fresh optimizer and data position
  iteration_ = s.iteration;
  consumed_samples_ = s.consumed_train_samples;
  consumed_valid_samples_ = s.consumed_valid_samples;
  if (load_optimizer) optimizer_->set_steps_taken(s.optimizer_steps);
  if (args_.use_checkpoint_scheduler) {
    scheduler_ = LrScheduler(schedule_from_json(s.scheduler));
  } else if (!args_.override_scheduler && s.scheduler != schedule_json(args_.lr_schedule)) {
    throw usage_error("the learning-rate schedule of the flags differs from the checkpoint's (" + s.scheduler.dump() +
                          " vs " + schedule_json(args_.lr_schedule).dump() + ")",
                      "pass --use-checkpoint-opt_param-scheduler or --override-opt_param-scheduler");
  }
  scheduler_.set_num_steps(s.scheduler_num_steps);
}


}  // namespace tessera
