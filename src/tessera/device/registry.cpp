// One entry per backend: a new backend adds its name, count and device here, behind its
// CMake option.
#include "tessera/device/registry.h"

#include <algorithm>
#include <cstdlib>

#include "tessera/device/cpu/cpu_device.h"
#ifdef TESSERA_WITH_OPENCL
#include "tessera/device/opencl/opencl_device.h"
#endif
#ifdef TESSERA_WITH_CUDA
#include "tessera/device/cuda/cuda_device.h"
#endif

namespace tessera {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string r;
  for (const std::string& n : names) r += (r.empty() ? "" : ", ") + n;
  return r;
}

}  // namespace

std::vector<std::string> device_backends() {
  std::vector<std::string> names{"cpu"};
#ifdef TESSERA_WITH_OPENCL
  names.push_back("opencl");
#endif
#ifdef TESSERA_WITH_CUDA
  names.push_back("cuda");
#endif
  return names;
}

DeviceSpec parse_device_spec(const std::string& spec) {
  DeviceSpec r;
  const size_t colon = spec.find(':');
  r.backend = spec.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string n = spec.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 0)
      throw usage_error("--device " + spec + ": the ordinal after ':' must be a number >= 0",
                        "write e.g. --device opencl:0");
    r.ordinal = static_cast<int>(v);
  }
  return r;
}

BackendStack backend_stack(const std::string& backend) {
  BackendStack s;
#ifdef TESSERA_WITH_CUDA
  if (backend == "cuda") {
    s.built = true;
    s.driver = cuda_driver_version();
    s.runtime = cuda_runtime_version();
    if (cuda_device_count(&s.no_device_reason) > 0) s.devices = cuda_device_names();
  }
#endif
  (void)backend;
  return s;
}

int device_count(const std::string& backend) {
  if (backend == "cpu" || backend == "strict") return 1;
#ifdef TESSERA_WITH_OPENCL
  if (backend == "opencl") return opencl_device_count();
#endif
#ifdef TESSERA_WITH_CUDA
  if (backend == "cuda") return cuda_device_count();
#endif
  return 0;
}

namespace {

// A backend built into this binary that sees no device here: a runtime error (exit 1) that
// says why, rather than "no backend". Only CUDA and OpenCL can see none (cpu and strict
// always have their one), so past CUDA's case the backend is OpenCL.
Error no_device_visible(const std::string& spec_text, const std::string& backend) {
#ifdef TESSERA_WITH_CUDA
  if (backend == "cuda") {
    std::string why;
    cuda_device_count(&why);
    return runtime_error("--device " + spec_text + ": no CUDA device is visible to this process (" + why + ")",
                         "nvidia-smi shows the GPUs and driver; check CUDA_VISIBLE_DEVICES, or run on --device cpu");
  }
#endif
  return runtime_error("--device " + spec_text + ": no " + backend +
                           " device is visible to this process (the OpenCL ICD loader lists no platform with a "
                           "device)",
                       "install a driver (Debian: pocl-opencl-icd runs OpenCL on the CPU); clinfo lists what the "
                       "loader finds in /etc/OpenCL/vendors or OCL_ICD_VENDORS; or run on --device cpu");
}

}  // namespace

Device& open_device(const std::string& spec_text) {
  const DeviceSpec spec = parse_device_spec(spec_text);
  const int count = device_count(spec.backend);
  const std::vector<std::string> built = device_backends();
  if (count == 0 && std::find(built.begin(), built.end(), spec.backend) != built.end())
    throw no_device_visible(spec_text, spec.backend);
  if (count == 0)
    throw usage_error("--device " + spec_text + ": no backend '" + spec.backend + "' in this build",
                      "built backends: " + joined(built) +
                          " (OpenCL needs -DTESSERA_OPENCL=ON and the OpenCL headers, CUDA -DTESSERA_CUDA=ON and "
                          "the CUDA toolkit; see docs/backends.md)");
  if (spec.ordinal >= count)
    throw usage_error("--device " + spec_text + ": " + spec.backend + " has " + std::to_string(count) +
                          " device(s), numbered from 0",
                      "run `tessera doctor --device " + spec.backend + "` to list them");
  if (spec.backend == "strict") return strict_device();
#ifdef TESSERA_WITH_OPENCL
  if (spec.backend == "opencl") return opencl_device(spec.ordinal);
#endif
#ifdef TESSERA_WITH_CUDA
  // Plain `cuda` under a launcher is this node's LOCAL_RANK-th GPU, as Megatron's
  // torch.cuda.set_device(local_rank): one GPU per rank.
  if (spec.backend == "cuda" && spec_text == "cuda" && std::getenv("LOCAL_RANK"))
    return cuda_device(std::atoi(std::getenv("LOCAL_RANK")) % count);
  if (spec.backend == "cuda") return cuda_device(spec.ordinal);
#endif
  return cpu_device();
}

}  // namespace tessera
