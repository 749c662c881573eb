#include "tessera/train/pipeline_executor.h"

#include <algorithm>
#include <map>
#include <memory>

#include "tessera/comm/communicator.h"
#include "tessera/core/error.h"

namespace tessera {
namespace {

bool is_compute(PipeOp op) { return op == PipeOp::Forward || op == PipeOp::Backward; }

// Hands out the lowest free slot and remembers the most ever used.
struct SlotPool {
  std::vector<bool> used;
  int take() {
    for (size_t i = 0; i < used.size(); ++i)
      if (!used[i]) return used[i] = true, static_cast<int>(i);
    used.push_back(true);
    return static_cast<int>(used.size() - 1);
  }
  void give(int slot) { used.at(slot) = false; }
};

}  // namespace

PipelineExecutor::PipelineExecutor(PipelineSchedule schedule, int pp_rank)
    : schedule_(std::move(schedule)), rank_(pp_rank) {
  const std::vector<PipeStep>& steps = schedule_.ranks.at(rank_);
  const int V = schedule_.virtual_stages;
  using Key = std::pair<int, int>;  // (chunk, micro)
  // Last step touching each (chunk, micro) at all, and last compute step (its Backward, or
  // its Forward when the schedule has no backward).
  std::map<Key, size_t> last_io, last_act;
  for (size_t i = 0; i < steps.size(); ++i)
    for (const PipeAction& a : steps[i].actions) {
      last_io[{a.chunk, a.micro}] = i;
      if (is_compute(a.op)) last_act[{a.chunk, a.micro}] = i;
    }
  std::vector<SlotPool> act_pool(V), io_pool(V);
  std::map<Key, int> act_of, io_of;
  slots_.resize(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const PipeAction& a : steps[i].actions) {
      const Key k{a.chunk, a.micro};
      if (!io_of.count(k)) io_of[k] = io_pool[a.chunk].take();
      if (a.op == PipeOp::Forward) {
        TESSERA_CHECK(!act_of.count(k), "schedule runs a forward twice");
        act_of[k] = act_pool[a.chunk].take();
      }
      SlotRef s;
      s.io = io_of[k];
      s.act = act_of.count(k) ? act_of[k] : -1;
      TESSERA_CHECK(a.op != PipeOp::Backward || s.act >= 0, "schedule runs a backward before its forward");
      slots_[i].push_back(s);
    }
    // Free after the step: a slot is reused only by a later step.
    for (const PipeAction& a : steps[i].actions) {
      const Key k{a.chunk, a.micro};
      if (last_act.count(k) && last_act[k] == i && act_of.count(k) && is_compute(a.op)) {
        act_pool[a.chunk].give(act_of[k]);
        act_of.erase(k);
        last_act.erase(k);
      }
      if (last_io.count(k) && last_io[k] == i) {
        io_pool[a.chunk].give(io_of[k]);
        io_of.erase(k);
        last_io.erase(k);
      }
    }
  }
  for (int c = 0; c < V; ++c) {
    act_slots_.push_back(std::max<int>(1, static_cast<int>(act_pool[c].used.size())));
    io_slots_.push_back(std::max<int>(1, static_cast<int>(io_pool[c].used.size())));
  }
}

void PipelineExecutor::run(GPTModel& model, Communicator* pp, const Compute& compute) const {
  const std::vector<PipeStep>& steps = schedule_.ranks.at(rank_);
  std::vector<std::unique_ptr<Work>> pending;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<PipeAction>& actions = steps[i].actions;
    if (actions.size() == 1 && is_compute(actions[0].op)) {
      compute(actions[0], slots_[i][0]);
      continue;
    }
    TESSERA_CHECK(pp != nullptr, "a pipeline schedule with point-to-point steps needs the pipeline group");
    for (size_t j = 0; j < actions.size(); ++j) {
      const PipeAction& a = actions[j];
      const int io = slots_[i][j].io;
      switch (a.op) {
        case PipeOp::RecvForward:
          pending.push_back(pp->recv_async(model.chunk_input(a.chunk, io), a.peer));
          break;
        case PipeOp::SendForward:
          pending.push_back(pp->send_async(model.chunk_output(a.chunk, io), a.peer));
          break;
        case PipeOp::RecvBackward:
          pending.push_back(pp->recv_async(model.chunk_output_grad(a.chunk, io), a.peer));
          break;
        case PipeOp::SendBackward:
          pending.push_back(pp->send_async(model.chunk_input_grad(a.chunk, io), a.peer));
          break;
        default:
          throw runtime_error("a pipeline step mixes compute with point-to-point actions");
      }
    }
    for (auto& w : pending) w->wait();
    pending.clear();
  }
}

PipelineSchedule make_forward_only_schedule(int pp, int virtual_stages, int num_micro) {
  PipelineSchedule s;
  s.pp = pp;
  s.virtual_stages = virtual_stages;
  s.num_micro = num_micro;
  s.ranks.resize(pp);
  const int last_stage = pp * virtual_stages - 1;
  for (int m = 0; m < num_micro; ++m)
    for (int stage = 0; stage <= last_stage; ++stage) {
      const int rank = stage % pp, chunk = stage / pp;
      std::vector<PipeStep>& steps = s.ranks[rank];
      if (stage > 0) steps.push_back({{{PipeOp::RecvForward, chunk, m, (stage - 1) % pp}}});
      steps.push_back({{{PipeOp::Forward, chunk, m, -1}}});
      if (stage < last_stage) steps.push_back({{{PipeOp::SendForward, chunk, m, (stage + 1) % pp}}});
    }
  return s;
}

}  // namespace tessera
