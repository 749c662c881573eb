// The doctor's CUDA rows: what the machine's CUDA stack is (driver, the runtime linked in,
// NCCL, the GPUs) whether or not a GPU is there, and with --device cuda on a GPU a bf16 GEMM
// and an NCCL all-reduce over the node's GPUs, each checked against its exact result. On a
// machine without a GPU or driver the rows say so plainly; they fail only when the run asks
// for --device cuda.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/comm/backend.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/device/registry.h"
#include "tessera/doctor/doctor.h"
#include "tessera/ops/ops.h"

namespace tessera::doctor {
namespace {

// 13000 -> "13.0"
std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

constexpr const char* kNoGpuFix =
    "nvidia-smi shows the GPUs and the driver; check CUDA_VISIBLE_DEVICES and the container's GPU access, or run "
    "with --device cpu";

}  // namespace

CudaFacts cuda_facts() {
  const BackendStack stack = backend_stack("cuda");
  CudaFacts f;
  f.built = stack.built;
  f.driver = stack.driver;
  f.runtime = stack.runtime;
  f.gpus = stack.devices;
  f.no_gpu_reason = stack.no_device_reason;
  f.nccl = native_collectives_version("cuda");
  return f;
}

std::vector<Row> cuda_rows(const CudaFacts& f, bool cuda_requested) {
  if (!f.built)
    return {{"cuda: backend", cuda_requested ? Status::Fail : Status::Info, "not built into this binary",
             cuda_requested ? "build with -DTESSERA_CUDA=ON on a machine with the CUDA toolkit, or run with --device cpu"
                            : "",
             ""}};
  // Without a GPU nothing below matters to a run on another device: INFO, not a failure.
  const Status missing = cuda_requested ? Status::Fail : Status::Info;
  std::vector<Row> rows;
  if (f.driver == 0)
    rows.push_back({"cuda: driver", missing, "no driver: the CUDA driver library (libcuda.so) is not installed", 
                    cuda_requested ? kNoGpuFix : "", ""});
  else if (f.driver < f.runtime)
    rows.push_back({"cuda: driver", Status::Fail,
                    "driver " + cuda_version_text(f.driver) + " is older than the runtime " +
                        cuda_version_text(f.runtime) + " this binary was built with",
                    "update the NVIDIA driver to one for CUDA " + cuda_version_text(f.runtime) + " or later", ""});
  else
    rows.push_back({"cuda: driver", Status::Pass, "driver " + cuda_version_text(f.driver), "", ""});
  rows.push_back({"cuda: libraries", Status::Pass,
                  "runtime " + cuda_version_text(f.runtime) + " (linked in), " +
                      (f.nccl.empty() ? std::string("NCCL not built") : f.nccl),
                  "", ""});
  if (f.gpus.empty()) {
    rows.push_back({"cuda: GPUs", missing, "no GPU (" + f.no_gpu_reason + ")", cuda_requested ? kNoGpuFix : "", ""});
  } else {
    std::string list;
    for (const std::string& g : f.gpus) list += (list.empty() ? "" : "; ") + g;
    rows.push_back({"cuda: GPUs", Status::Pass, std::to_string(f.gpus.size()) + " visible: " + list, "", ""});
  }
  return rows;
}

namespace {

Row gemm_run(Device& device) {
  // All-ones bf16 operands: every output is exactly K (a power of two, exact in bf16), so any
  // wrong element shows.
  constexpr int64_t N = 4096, C = 4096, OC = 4096, kRuns = 10;
  Row r{"cuda: GEMM", Status::Pass, "", "", ""};
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
    r = {"cuda: GEMM", Status::Fail, e.what(), e.hint(), ""};
  }
  return r;
}

}  // namespace

std::vector<Row> check_cuda(const std::string& spec) {
  const bool requested = spec.rfind("cuda", 0) == 0;
  const CudaFacts facts = cuda_facts();
  std::vector<Row> rows = cuda_rows(facts, requested);
  if (!requested || rows.back().status != Status::Pass) return rows;  // no GPU to run on
  Device* device = nullptr;
  try {
    device = &open_device(spec);  // the device check_compute_device opened
  } catch (const Error&) {
    return rows;  // its row says why
  }
  rows.push_back(gemm_run(*device));
  if (facts.nccl.empty()) return rows;  // "cuda: libraries" says NCCL is not built
  try {
    const NativeAllReduceRun run = native_all_reduce_run("cuda", size_t{64} << 20);
    char detail[160];
    std::snprintf(detail, sizeof detail, "64 MiB f32 over %d GPU(s) of this node: %.2f ms, busbw %.1f GB/s, %lld wrong",
                  run.devices, run.ms, run.busbw_gbs, static_cast<long long>(run.wrong));
    rows.push_back({"cuda: NCCL all_reduce", run.wrong ? Status::Fail : Status::Pass, detail,
                    run.wrong ? "NCCL computed wrong sums: NCCL_DEBUG=WARN shows its view; check the driver" : "", ""});
  } catch (const Error& e) {
    rows.push_back({"cuda: NCCL all_reduce", Status::Fail, e.what(), e.hint(), ""});
  }
  return rows;
}

}  // namespace tessera::doctor
