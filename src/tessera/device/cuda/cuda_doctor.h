// The CUDA backend's doctor rows (Backend::doctor_rows, docs/doctor.md): what the machine's
// CUDA stack is (driver, the runtime linked in, NCCL, the GPUs) whether or not a GPU is there,
// and with --device cuda on a GPU a bf16 GEMM and an NCCL all-reduce over the node's GPUs,
// each checked against its exact result. On a machine without a GPU or driver the rows say so
// plainly; they fail only when the run asks for --device cuda.
#pragma once

#include <string>
#include <vector>

#include "tessera/device/backend.h"

namespace tessera {

// The CUDA stack as the rows report it (cuda_facts() asks the machine; tests make their own).
struct CudaFacts {
  int driver = 0;                 // cudaDriverGetVersion, e.g. 13000; 0: no driver installed
  int runtime = 0;                // the CUDA runtime linked in
  std::vector<std::string> gpus;  // cuda_device_names(); empty when none is visible
  std::string no_gpu_reason;      // then the runtime's reason ("cudaErrorNoDevice: ...")
  std::string nccl;               // "NCCL 2.28.9"; empty when NCCL is not built
};
CudaFacts cuda_facts();

// Rows "cuda: driver", "cuda: libraries", "cuda: GPUs". A missing driver or GPU FAILs only
// when `requested` (--device cuda); else it is INFO. A driver older than the runtime FAILs.
std::vector<BackendRow> cuda_platform_rows(const CudaFacts& facts, bool requested);

// Backend::doctor_rows of CUDA: the platform rows, then with `device` (a GPU --device opened)
// "cuda: GEMM" (bf16 4096^3, TFLOP/s, exact result) and "cuda: NCCL all_reduce" (the node's
// GPUs in one process, busbw, exact sums).
std::vector<BackendRow> cuda_doctor_rows(bool requested, Device* device);

}  // namespace tessera
