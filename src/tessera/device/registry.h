// The backend registry: which backends this binary was built with, and the device a
// --device spec names ("cpu", "strict", "opencl", "opencl:1"). Devices are process-wide
// objects owned by their backend; every in-process rank asking for the same spec gets the
// same Device.
#pragma once

#include <string>
#include <vector>

#include "tessera/device/device.h"

namespace tessera {

struct DeviceSpec {
  std::string backend;  // "cpu", "strict", "opencl", ...
  int ordinal = 0;
};

// Parses "backend[:N]"; throws a usage Error naming the built backends otherwise.
DeviceSpec parse_device_spec(const std::string& spec);
// Backends built into this binary, in --device's spelling. "strict" is a test device and
// is not listed here, though --device accepts it.
std::vector<std::string> device_backends();
// How many devices a backend sees (the CPU: 1).
int device_count(const std::string& backend);
// What a backend's platform says about itself (doctor's rows), whether or not it has a
// device: the version codes of its driver and of the runtime this binary links (CUDA's
// encoding for cuda: 13000 is 13.0; driver 0: none installed), its devices as the log
// names them, and when there are none, the platform's reason. `built` false: not in this
// binary (every other field empty).
struct BackendStack {
  bool built = false;
  int driver = 0;
  int runtime = 0;
  std::vector<std::string> devices;
  std::string no_device_reason;
};
BackendStack backend_stack(const std::string& backend);
// The device a spec names; throws a usage Error when the backend is not built or the
// ordinal is out of range.
Device& open_device(const std::string& spec);

}  // namespace tessera
