// The CUDA backend's registration, without a GPU: its doctor rows (device/cuda/cuda_doctor.h)
// from made-up machines (no driver, a driver older than the runtime, a driver but no GPU, a
// node with GPUs; each missing piece INFO for a run on another device and a FAIL with a fix
// for --device cuda; the real machine's rows are checked by tests/integration/cuda_test.py
// no-gpu), and its fused attention's dropout flag, which sends a GPT with attention dropout
// to the unfused attention (GPTModel::uses_fused_attention).
#include <gtest/gtest.h>

#ifdef TESSERA_WITH_CUDA
#include "tessera/device/cuda/cuda_doctor.h"
#include "tessera/device/registry.h"
#include "tessera/model/gpt.h"

using namespace tessera;
using Status = BackendRow::Status;

namespace {

CudaFacts built() {
  CudaFacts f;
  f.driver = 13000;
  f.runtime = 13000;
  f.nccl = "NCCL 2.28.9";
  return f;
}

const BackendRow& row(const std::vector<BackendRow>& rows, const std::string& check) {
  for (const BackendRow& r : rows)
    if (r.check == check) return r;
  throw std::runtime_error("no row " + check);
}

}  // namespace

TEST(CudaDoctorRows, RegisteredWithTheBackend) {
  const Backend* cuda = find_backend("cuda");
  ASSERT_NE(cuda, nullptr);
  EXPECT_EQ(cuda->doctor_rows, &cuda_doctor_rows);
}

TEST(CudaBackend, AttentionDropoutRunsTheUnfusedAttention) {
  const Backend* cuda = find_backend("cuda");
  ASSERT_NE(cuda, nullptr);
  EXPECT_FALSE(cuda->fused_attention_dropout);
  GPTConfig config;
  config.attention_dropout = 0.1f;
  EXPECT_TRUE(GPTModel::uses_fused_attention(config, cpu_device()));  // the CPU's flash kernel keeps the mask fast
}

TEST(CudaDoctorRows, NoDriverIsInfoUnlessCudaIsAskedFor) {
  CudaFacts f = built();
  f.driver = 0;
  f.no_gpu_reason = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
  for (bool requested : {false, true}) {
    const std::vector<BackendRow> rows = cuda_platform_rows(f, requested);
    const Status want = requested ? Status::Fail : Status::Info;
    EXPECT_EQ(row(rows, "cuda: driver").status, want);
    EXPECT_NE(row(rows, "cuda: driver").detail.find("no driver"), std::string::npos);
    EXPECT_EQ(row(rows, "cuda: GPUs").status, want);
    EXPECT_EQ(row(rows, "cuda: GPUs").detail, "no GPU (" + f.no_gpu_reason + ")");
    EXPECT_EQ(row(rows, "cuda: GPUs").fix.empty(), !requested);
    EXPECT_EQ(row(rows, "cuda: libraries").detail, "runtime 13.0 (linked in), NCCL 2.28.9");
  }
}

TEST(CudaDoctorRows, DriverOlderThanTheRuntimeFails) {
  CudaFacts f = built();
  f.driver = 12040;
  f.gpus = {"cuda:0 (NVIDIA H100, sm_90, 79 GiB)"};
  const std::vector<BackendRow> rows = cuda_platform_rows(f, false);
  const BackendRow& driver = row(rows, "cuda: driver");
  EXPECT_EQ(driver.status, Status::Fail);
  EXPECT_EQ(driver.detail, "driver 12.4 is older than the runtime 13.0 this binary was built with");
  EXPECT_NE(driver.fix.find("CUDA 13.0 or later"), std::string::npos) << driver.fix;
}

TEST(CudaDoctorRows, GpusListed) {
  CudaFacts f = built();
  f.driver = 13010;
  f.gpus = {"cuda:0 (NVIDIA H200, sm_90, 139 GiB)", "cuda:1 (NVIDIA H200, sm_90, 139 GiB)"};
  f.nccl.clear();
  const std::vector<BackendRow> rows = cuda_platform_rows(f, true);
  EXPECT_EQ(row(rows, "cuda: driver").status, Status::Pass);
  EXPECT_EQ(row(rows, "cuda: driver").detail, "driver 13.1");
  EXPECT_EQ(row(rows, "cuda: GPUs").status, Status::Pass);
  EXPECT_EQ(row(rows, "cuda: GPUs").detail,
            "2 visible: cuda:0 (NVIDIA H200, sm_90, 139 GiB); cuda:1 (NVIDIA H200, sm_90, 139 GiB)");
  EXPECT_EQ(row(rows, "cuda: libraries").detail, "runtime 13.0 (linked in), NCCL not built");
}
#else
TEST(CudaDoctorRows, NotBuilt) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif
