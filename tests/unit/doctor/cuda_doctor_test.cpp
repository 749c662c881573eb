// The doctor's CUDA rows (doctor/cuda_check.cpp) from made-up machines, so every case runs
// without a GPU: a binary without the backend, no driver, a driver older than the runtime,
// a driver but no GPU, and a node with GPUs; each missing piece is INFO for a run on another
// device and a FAIL with a fix for --device cuda. The real machine's rows are checked by
// tests/integration/cuda_test.py (no-gpu).
#include <gtest/gtest.h>

#include "tessera/doctor/doctor.h"

using namespace tessera::doctor;

namespace {

CudaFacts built() {
  CudaFacts f;
  f.built = true;
  f.driver = 13000;
  f.runtime = 13000;
  f.nccl = "NCCL 2.28.9";
  return f;
}

const Row& row(const std::vector<Row>& rows, const std::string& check) {
  for (const Row& r : rows)
    if (r.check == check) return r;
  throw std::runtime_error("no row " + check);
}

}  // namespace

TEST(CudaDoctorRows, NotBuilt) {
  const std::vector<Row> info = cuda_rows(CudaFacts{}, false);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].check, "cuda: backend");
  EXPECT_EQ(info[0].status, Status::Info);
  EXPECT_EQ(info[0].detail, "not built into this binary");
  const std::vector<Row> fail = cuda_rows(CudaFacts{}, true);
  EXPECT_EQ(fail[0].status, Status::Fail);
  EXPECT_NE(fail[0].fix.find("-DTESSERA_CUDA=ON"), std::string::npos) << fail[0].fix;
}

TEST(CudaDoctorRows, NoDriverIsInfoUnlessCudaIsAskedFor) {
  CudaFacts f = built();
  f.driver = 0;
  f.no_gpu_reason = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version";
  for (bool requested : {false, true}) {
    const std::vector<Row> rows = cuda_rows(f, requested);
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
  const std::vector<Row> rows = cuda_rows(f, false);
  const Row& driver = row(rows, "cuda: driver");
  EXPECT_EQ(driver.status, Status::Fail);
  EXPECT_EQ(driver.detail, "driver 12.4 is older than the runtime 13.0 this binary was built with");
  EXPECT_NE(driver.fix.find("CUDA 13.0 or later"), std::string::npos) << driver.fix;
}

TEST(CudaDoctorRows, GpusListed) {
  CudaFacts f = built();
  f.driver = 13010;
  f.gpus = {"cuda:0 (NVIDIA H200, sm_90, 139 GiB)", "cuda:1 (NVIDIA H200, sm_90, 139 GiB)"};
  f.nccl.clear();
  const std::vector<Row> rows = cuda_rows(f, true);
  EXPECT_EQ(row(rows, "cuda: driver").status, Status::Pass);
  EXPECT_EQ(row(rows, "cuda: driver").detail, "driver 13.1");
  EXPECT_EQ(row(rows, "cuda: GPUs").status, Status::Pass);
  EXPECT_EQ(row(rows, "cuda: GPUs").detail,
            "2 visible: cuda:0 (NVIDIA H200, sm_90, 139 GiB); cuda:1 (NVIDIA H200, sm_90, 139 GiB)");
  EXPECT_EQ(row(rows, "cuda: libraries").detail, "runtime 13.0 (linked in), NCCL not built");
}
