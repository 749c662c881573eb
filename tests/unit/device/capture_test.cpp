// Device capture (device.h; --enable-cuda-graph): on the strict test device a capture runs the
// work as it comes and refuses, naming the call, what a CUDA graph could not replay; the CPU
// device cannot capture. The GPU's recording and replay need a GPU (cuda_test.py).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

#include "tessera/core/error.h"
#include "tessera/device/buffer.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/device/device.h"

using namespace tessera;

namespace {

void expect_refused(const std::function<void()>& call, const std::string& name) {
  try {
    call();
    ADD_FAILURE() << name << " was not refused inside a capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name + " on strict inside a captured step"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(DeviceCapture, StrictRefusesWhatAGraphCannotReplayAndRunsTheRest) {
  Device& d = strict_device();
  ASSERT_EQ(d.capture_support(), Device::Capture::CheckOnly);
  Buffer buffer(d, 64);
  char host[64] = {};
  d.begin_capture();
  EXPECT_TRUE(d.capturing());
  expect_refused([&] { d.allocate(64); }, "allocate");
  expect_refused([&] { d.copy_to_host(host, buffer.handle(), 0, 8); }, "copy_to_host");
  expect_refused([&] { d.copy_from_host(buffer.handle(), 0, host, 8); }, "copy_from_host");
  expect_refused([&] { d.synchronize(); }, "synchronize");
  d.fill_zero(buffer.handle(), 0, 64);  // stream-ordered work runs
  EXPECT_EQ(d.end_capture(), 0u);       // nothing recorded
  EXPECT_FALSE(d.capturing());
  std::memset(host, 1, sizeof(host));
  d.copy_to_host(host, buffer.handle(), 0, 64);  // allowed again
  for (char c : host) EXPECT_EQ(c, 0);
}

TEST(DeviceCapture, TheCpuCannotCapture) {
  EXPECT_EQ(cpu_device().capture_support(), Device::Capture::None);
  EXPECT_THROW(cpu_device().begin_capture(), Error);
  EXPECT_FALSE(cpu_device().capturing());
}
