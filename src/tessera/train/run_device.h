// The start-up line that says what a run computes on: the device, and for the CPU its model,
// the OpenMP threads each process uses and the widest vector ISA (what the throughput and
// MFU figures depend on).
#pragma once

#include <string>

#include "tessera/device/device.h"

namespace tessera {

// "device: cpu (AMD EPYC 7B13, 2 OpenMP threads per process, AVX2)".
std::string run_device_line(const Device& device);

}  // namespace tessera
