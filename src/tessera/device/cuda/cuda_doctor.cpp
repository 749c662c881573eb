#include "tessera/device/cuda/cuda_doctor.h"

#include <chrono>
#include <cstdio>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/device/buffer.h"
#include "tessera/device/cuda/cuda_device.h"
#include "tessera/ops/ops.h"
#ifdef TESSERA_WITH_NCCL
#include "tessera/comm/nccl/nccl_communicator.h"
#endif

namespace tessera {
namespace {

using Status = BackendRow::Status;

// 13000 -> "13.0"
std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

constexpr const char* kNoGpuFix =
    "nvidia-smi shows the GPUs and the driver; check CUDA_VISIBLE_DEVICES and the container's GPU access, or run "
    "with --device cpu";

BackendRow driver_row(const CudaFacts& f, bool requested) {
  if (f.driver == 0)
    return {"cuda: driver", requested ? Status::Fail : Status::Info,
            "no driver: the CUDA driver library (libcuda.so) is not installed", requested ? kNoGpuFix : ""};
  if (f.driver < f.runtime)
    return {"cuda: driver", Status::Fail,
            "driver " + cuda_version_text(f.driver) + " is older than the runtime " + cuda_version_text(f.runtime) +
                " this binary was built with",
            "update the NVIDIA driver to one for CUDA " + cuda_version_text(f.runtime) + " or later"};
  return {"cuda: driver", Status::Pass, "driver " + cuda_version_text(f.driver), ""};
}

BackendRow gemm_run(Device& device) {
  // All-ones bf16 operands: every output is exactly K (a power of two, exact in bf16), so any
  // wrong element shows.
  constexpr int64_t N = 4096, C = 4096, OC = 4096, kRuns = 10;
  BackendRow r{"cuda: GEMM", Status::Pass, "", ""};
  try {
    Buffer bx(device, N * C * 2), bw(device, OC * C * 2), bout(device, N * OC * 2);
    const Tensor x = tensor_at(bx, 0, DType::BF16, {N, C}), w = tensor_at(bw, 0, DType::BF16, {OC, C});
    const Tensor out = tensor_at(bout, 0, DType::BF16, {N, OC});
    ops::fill(x, 1.0f);
    ops::fill(w, 1.0f);
    ops::linear_forward(out, x, w, Tensor());  // warm-up: plans the GEMM
    device.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns; ++i) ops::linear_forward(out, x, w, Tensor());
    device.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<uint16_t> y(static_cast<size_t>(N * OC));
    copy_to_host(y.data(), y.size() * 2, out);
    int64_t wrong = 0;
    for (uint16_t v : y) wrong += bf16_to_f32(v) != static_cast<float>(C);
    char detail[160];
    std::snprintf(detail, sizeof detail, "bf16 %lldx%lldx%lld through cuBLASLt: %.0f TFLOP/s, %lld wrong elements",
                  static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(OC),
                  2.0 * N * C * OC * kRuns / s / 1e12, static_cast<long long>(wrong));
    r.detail = detail;
    if (wrong) {
      r.status = Status::Fail;
      r.fix = "the GPU's GEMMs are wrong: check the driver, and run the gpu tests (ctest -L gpu)";
    }
  } catch (const Error& e) {
    r = {"cuda: GEMM", Status::Fail, e.what(), e.hint()};
  }
  return r;
}

#ifdef TESSERA_WITH_NCCL
BackendRow nccl_run() {
  try {
    const NcclAllReduceRun run = nccl_all_reduce_run(size_t{64} << 20);
    char detail[160];
    std::snprintf(detail, sizeof detail, "64 MiB f32 over %d GPU(s) of this node: %.2f ms, busbw %.1f GB/s, %lld wrong",
                  run.devices, run.ms, run.busbw_gbs, static_cast<long long>(run.wrong));
    return {"cuda: NCCL all_reduce", run.wrong ? Status::Fail : Status::Pass, detail,
            run.wrong ? "NCCL computed wrong sums: NCCL_DEBUG=WARN shows its view; check the driver" : ""};
  } catch (const Error& e) {
    return {"cuda: NCCL all_reduce", Status::Fail, e.what(), e.hint()};
  }
}
#endif

}  // namespace

CudaFacts cuda_facts() {
  CudaFacts f;
  f.driver = cuda_driver_version();
  f.runtime = cuda_runtime_version();
  if (cuda_device_count(&f.no_gpu_reason) > 0) f.gpus = cuda_device_names();
#ifdef TESSERA_WITH_NCCL
  f.nccl = "NCCL " + nccl_version();
#endif
  return f;
}

std::vector<BackendRow> cuda_platform_rows(const CudaFacts& f, bool requested) {
  std::vector<BackendRow> rows{driver_row(f, requested)};
  rows.push_back({"cuda: libraries", Status::Pass,
                  "runtime " + cuda_version_text(f.runtime) + " (linked in), " +
                      (f.nccl.empty() ? std::string("NCCL not built") : f.nccl),
                  ""});
  if (f.gpus.empty()) {
    // Without a GPU nothing here matters to a run on another device: INFO, not a failure.
    rows.push_back({"cuda: GPUs", requested ? Status::Fail : Status::Info, "no GPU (" + f.no_gpu_reason + ")",
                    requested ? kNoGpuFix : ""});
  } else {
    std::string list;
    for (const std::string& g : f.gpus) list += (list.empty() ? "" : "; ") + g;
    rows.push_back({"cuda: GPUs", Status::Pass, std::to_string(f.gpus.size()) + " visible: " + list, ""});
  }
  return rows;
}

std::vector<BackendRow> cuda_doctor_rows(bool requested, Device* device) {
  const CudaFacts facts = cuda_facts();
  std::vector<BackendRow> rows = cuda_platform_rows(facts, requested);
  if (device == nullptr || rows.back().status != Status::Pass) return rows;  // no GPU to run on
  rows.push_back(gemm_run(*device));
#ifdef TESSERA_WITH_NCCL
  rows.push_back(nccl_run());
#endif
  return rows;
}

}  // namespace tessera
