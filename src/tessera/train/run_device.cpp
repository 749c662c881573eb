#include "tessera/train/run_device.h"

#include <omp.h>

#include <fstream>

namespace tessera {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

const char* widest_isa() {
  if (__builtin_cpu_supports("avx512f")) return "AVX-512";
  if (__builtin_cpu_supports("avx2")) return "AVX2";
  if (__builtin_cpu_supports("avx")) return "AVX";
  return "SSE";
}

}  // namespace

std::string run_device_line(const Device& device) {
  if (device.name() != "cpu") return "device: " + device.name();  // the host's figures are not its
  return "device: " + device.name() + " (" + cpu_model() + ", " + std::to_string(omp_get_max_threads()) +
         " OpenMP threads per process, " + widest_isa() + ")";
}

}  // namespace tessera
