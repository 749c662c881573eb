// The start-up line that says what a run computes on: the device, and for the CPU its model,
// the OpenMP threads each process uses and the widest vector ISA (what the throughput and
// MFU figures depend on); and the ops a run needs from the device's backend.
#pragma once

#include <string>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/ops/op.h"

namespace tessera {

struct TrainArgs;

// "device: cpu (AMD EPYC 7B13, 2 OpenMP threads per process, AVX2, 23.5 GiB memory)";
// another device by its own description and memory: "device: opencl:0, pthread-haswell-AMD EPYC (CPU, Portable
// Computing Language, driver 3.1+debian, OpenCL 3.0 ...), 11.8 GiB memory".
std::string run_device_line(const Device& device);
// The ops a training run with these flags calls: what ops::check_supported tests at
// start-up, so a backend that lacks one fails before training (and the strict device runs
// nothing else, so a missing entry fails the tests). Attention's ops and the fused
// epilogues depend on the device (its mode and whether its backend has the fused op: the
// model falls back to the unfused ops where it has not).
std::vector<ops::OpId> training_ops(const TrainArgs& args, const Device& device);

}  // namespace tessera
