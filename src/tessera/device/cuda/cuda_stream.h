// What ops/cuda and comm/nccl need from a device of kind CUDA: make it the calling
// thread's current GPU (in-process ranks are threads, and the current GPU is per thread),
// and its streams as cudaStream_t. Both abort for a device of any other kind.
#pragma once

#include <cuda_runtime.h>

#include "tessera/device/device.h"

namespace tessera::cuda {

// cudaSetDevice(device's ordinal); every entry point of ops/cuda and comm/nccl calls it
// first.
void activate(const Device& device);
// The cudaStream_t of `stream` on `device`; the null Stream is the device's default stream.
cudaStream_t stream_of(const Device& device, Stream stream = {});

}  // namespace tessera::cuda
