// The device registry: the backends this binary was built with (each registered by its own
// folder: backend.h), and the device a --device spec names ("cpu", "strict", "opencl",
// "opencl:1"). Devices are process-wide objects owned by their backend; every in-process
// rank asking for the same spec gets the same Device.
#pragma once

#include <string>
#include <vector>

#include "tessera/device/backend.h"
#include "tessera/device/device.h"

namespace tessera {

struct DeviceSpec {
  std::string backend;  // "cpu", "strict", "opencl", ...
  int ordinal = 0;
  bool has_ordinal = false;  // written as "backend:N"
};

// Parses "backend[:N]"; throws a usage Error naming the built backends otherwise.
DeviceSpec parse_device_spec(const std::string& spec);
// Backends built into this binary, in --device's spelling. "strict" is a test device and
// is not listed here, though --device accepts it.
std::vector<std::string> device_backends();
// How many devices a backend sees (the CPU: 1; 0 for a backend not built).
int device_count(const std::string& backend);
// The device a spec names; throws a usage Error when the backend is not built or the
// ordinal is out of range, a runtime Error when it is built but sees no device.
Device& open_device(const std::string& spec);

}  // namespace tessera
