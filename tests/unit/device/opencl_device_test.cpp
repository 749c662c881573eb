// The OpenCL device (device/opencl) through the Device interface: identity, copies at byte
// offsets, host access refused, and the errors a user sees (the OpenCL call, its error code
// name and the device; a kernel build failure with the compiler's build log). Runs on
// opencl:0 (PoCL in CI); skipped when the backend is not built or no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#ifdef TESSERA_WITH_OPENCL
#include "tessera/device/opencl/opencl_device.h"
#endif

using namespace tessera;

namespace {

#ifdef TESSERA_WITH_OPENCL

Device* first_device() { return opencl_device_count() > 0 ? &open_device("opencl:0") : nullptr; }

#define REQUIRE_DEVICE(d)                                                   \
  Device* d = first_device();                                               \
  if (d == nullptr) GTEST_SKIP() << "no OpenCL device (install pocl-opencl-icd)"

TEST(OpenClDevice, IdentityAndMemory) {
  REQUIRE_DEVICE(d);
  EXPECT_STREQ(d->backend_name(), "opencl");
  EXPECT_EQ(d->name(), "opencl:0");
  EXPECT_FALSE(d->is_host());
  EXPECT_NE(d->description().find("driver"), std::string::npos) << d->description();
  EXPECT_GT(d->memory_info().total_bytes, 0u);
  // The registry lists the backend and the same device for the same spec.
  const std::vector<std::string> backends = device_backends();
  EXPECT_NE(std::find(backends.begin(), backends.end(), "opencl"), backends.end());
  EXPECT_EQ(&open_device("opencl"), d);
  EXPECT_EQ(opencl_device_names().size(), static_cast<size_t>(device_count("opencl")));
}

TEST(OpenClDevice, CopiesAtOffsetsAndAccounting) {
  REQUIRE_DEVICE(d);
  const size_t before = d->allocated_bytes();
  {
    Buffer b(*d, 64 * sizeof(float));
    EXPECT_EQ(d->allocated_bytes(), before + 64 * sizeof(float));
    std::vector<float> v(64);
    std::iota(v.begin(), v.end(), 1.0f);
    const Tensor all = tensor_at(b, 0, DType::F32, {64});
    std::vector<float> zeros(64, -1.0f);
    copy_to_host(zeros.data(), zeros.size() * 4, all);
    EXPECT_EQ(zeros, std::vector<float>(64, 0.0f)) << "a new Buffer is zero-filled";
    copy_from_host(all, v.data(), v.size() * 4);
    // Rows 2..3 of an [8, 8] view, copied over rows 0..1 (disjoint), then rows 1..2 over
    // rows 2..3 (overlapping ranges of one buffer, which Device::copy allows).
    const Tensor m = all.view({8, 8});
    copy_tensor(m.slice_rows(0, 2), m.slice_rows(2, 2));
    copy_tensor(m.slice_rows(2, 2), m.slice_rows(1, 2));
    fill_zero(m.slice_rows(7, 1));
    std::vector<float> got(64);
    copy_to_host(got.data(), got.size() * 4, all);
    std::vector<float> want = v;
    std::memcpy(want.data(), v.data() + 16, 16 * 4);                 // rows 0..1 = old rows 2..3
    std::vector<float> rows12(want.begin() + 8, want.begin() + 24);  // rows 1..2 after that
    std::copy(rows12.begin(), rows12.end(), want.begin() + 16);
    std::fill(want.begin() + 56, want.end(), 0.0f);
    EXPECT_EQ(got, want);
  }
  EXPECT_EQ(d->allocated_bytes(), before);
}

TEST(OpenClDevice, PinnedBuffersAsyncCopiesAndEvents) {
  REQUIRE_DEVICE(d);
  constexpr size_t n = 1 << 16;
  auto* pinned = static_cast<float*>(d->allocate_pinned(n * sizeof(float)));
  ASSERT_NE(pinned, nullptr);
  for (size_t i = 0; i < n; ++i) pinned[i] = static_cast<float>(i);
  Buffer a(*d, n * sizeof(float)), b(*d, n * sizeof(float));
  Event done = d->create_event();
  // Up, device to device, down: ordered by the stream, awaited through the event.
  d->copy_from_host_async(a.handle(), 0, pinned, n * sizeof(float), Stream{});
  d->copy(b.handle(), 0, a.handle(), 0, n * sizeof(float));
  std::vector<float> back(n, -1.0f);
  d->copy_to_host_async(back.data(), b.handle(), 0, n * sizeof(float), Stream{});
  d->record_event(done, Stream{});
  d->synchronize_event(done);
  EXPECT_EQ(back, std::vector<float>(pinned, pinned + n));
  d->destroy_event(done);
  d->free_pinned(pinned, n * sizeof(float));
}

TEST(OpenClDeviceDeathTest, HostAccessIsRefused) {
  REQUIRE_DEVICE(d);
  Buffer b(*d, 16);
  const Tensor t = tensor_at(b, 0, DType::F32, {4});
  EXPECT_DEATH((void)t.f32(), "opencl:0, which is not host memory");
}

TEST(OpenClDevice, ErrorsNameTheCallAndDevice) {
  REQUIRE_DEVICE(d);
  Buffer b(*d, 16);
  std::vector<char> host(64);
  try {
    d->copy_to_host(host.data(), b.handle(), 0, 64);  // past the end of a 16-byte buffer
    FAIL() << "reading past the buffer did not fail";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("clEnqueueReadBuffer failed with CL_INVALID_VALUE (-30) on opencl:0 ("), std::string::npos)
        << what;
  }
  try {
    (void)d->allocate(size_t(1) << 62);
    FAIL() << "a 4 EiB allocation did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CL_DEVICE_MAX_MEM_ALLOC_SIZE"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  try {
    (void)open_device("opencl:99");
    FAIL() << "opencl:99 opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();  // a usage error
    EXPECT_NE(std::string(e.what()).find("opencl:99"), std::string::npos) << e.what();
  }
}

TEST(OpenClDevice, KernelBuildFailurePrintsTheBuildLog) {
  REQUIRE_DEVICE(d);
  const std::string source = "__kernel void broken(__global float* x) { x[0] = undeclared_name; }\n";
  try {
    build_opencl_program(*d, "broken_for_test", source, "broken");
    FAIL() << "a kernel using an undeclared name built";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("clBuildProgram failed with CL_BUILD_PROGRAM_FAILURE"), std::string::npos) << what;
    EXPECT_NE(what.find("on opencl:0"), std::string::npos) << what;
    EXPECT_NE(what.find("build log:"), std::string::npos) << what;
    EXPECT_NE(what.find("undeclared_name"), std::string::npos) << "the compiler's message: " << what;
  }
  // A good program builds (and its kernel is found by name).
  EXPECT_NO_THROW(build_opencl_program(*d, "fine_for_test", "__kernel void fine(__global float* x) { x[0] = 1; }",
                                       "fine"));
}

#else

TEST(OpenClDevice, NotBuilt) { GTEST_SKIP() << "built without the OpenCL backend (TESSERA_OPENCL)"; }

#endif

}  // namespace
