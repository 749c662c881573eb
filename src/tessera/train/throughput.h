// Throughput figures of the log line: Megatron's model FLOPs per iteration
// (num_floating_point_operations in megatron/training/training.py, dense GPT with MHA and
// GELU) and MFU against a stated dense peak per device.
#pragma once

#include <optional>
#include <string>

#include "tessera/train/arguments.h"

namespace tessera {

// Megatron's num_floating_point_operations for one iteration of `global_batch` samples
// (forward + backward, 3x the forward's matmuls, logits included).
double megatron_flops_per_iteration(const TrainArgs& args, int64_t global_batch);

struct DevicePeak {
  double tflops = 0;   // dense peak per device in the run's precision
  std::string label;   // "H100 SXM bf16 dense 989 TFLOP/s", "--peak-tflops-per-device 0.35"
};

// The peak used for MFU: --peak-tflops-per-device when given, else the table's entry for the
// device (NVIDIA data-center GPUs by name); nullopt for a device the table does not know
// (CPUs differ too much by model, clock and core count to guess).
std::optional<DevicePeak> device_peak(const std::string& device_name, const TrainArgs& args);

}  // namespace tessera
