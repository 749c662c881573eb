// Runs one pipeline rank's part of a schedule (parallel/pipeline_schedule.h) over the
// model: compute actions call back into the trainer, which owns the micro-batches and the
// losses; point-to-point actions move the model chunks' I/O tensors over the pipeline group,
// each batch posted together and waited for together (Megatron's batch_isend_irecv).
//
// Before running, the executor assigns every (chunk, micro-batch) its slots: an activation
// slot from its Forward to its Backward, an I/O slot from the first to the last action that
// touches it; slots are reused once free, so the counts are the most ever live at once.
#pragma once

#include <functional>
#include <vector>

#include "tessera/model/gpt.h"
#include "tessera/parallel/pipeline_schedule.h"

namespace tessera {

class Communicator;

class PipelineExecutor {
 public:
  PipelineExecutor(PipelineSchedule schedule, int pp_rank);

  const PipelineSchedule& schedule() const { return schedule_; }
  // Slots each chunk needs on this rank.
  const std::vector<int>& act_slots() const { return act_slots_; }
  const std::vector<int>& io_slots() const { return io_slots_; }

  using Compute = std::function<void(const PipeAction& action, SlotRef slot)>;
  // pp: the pipeline group (null with one stage, where schedules have no p2p).
  void run(GPTModel& model, Communicator* pp, const Compute& compute) const;

 private:
  PipelineSchedule schedule_;
  int rank_;
  std::vector<std::vector<SlotRef>> slots_;  // per step, per action
  std::vector<int> act_slots_, io_slots_;
};

// Megatron's forward-only pass (evaluation) as a schedule: every micro-batch runs through
// the virtual stages in order, receiving, computing and sending one at a time.
PipelineSchedule make_forward_only_schedule(int pp, int virtual_stages, int num_micro);

}  // namespace tessera
