#include "tessera/device/cuda/cuda_check.h"

#include "tessera/core/error.h"

namespace tessera::cuda {

void cuda_call_failed(const char* call, cudaError_t code, const std::string& where) {
  // A failed call leaves a sticky error only for faults of a kernel; clear the others so
  // the next call does not report this one again.
  cudaGetLastError();
  const std::string what = std::string(call) + " failed with " + cudaGetErrorName(code) + " (" +
                           cudaGetErrorString(code) + ") on " + where;
  if (code == cudaErrorMemoryAllocation)
    throw runtime_error(what, "the GPU is out of memory: lower --micro-batch-size or split the model with "
                              "--tensor-model-parallel-size / --pipeline-model-parallel-size");
  if (code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver)
    throw runtime_error(what, "nvidia-smi shows the GPUs and driver this machine has; check "
                              "CUDA_VISIBLE_DEVICES, or run on --device cpu");
  throw runtime_error(what, "`tessera doctor --device cuda` checks the GPU, driver and libraries; "
                            "CUDA_LAUNCH_BLOCKING=1 makes the failing call report its own error");
}

}  // namespace tessera::cuda
