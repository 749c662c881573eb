// The CPU device's memory operations: fill_zero streams fills larger than any cache past the
// caches, its unaligned head and tail written by memset; every byte asked for is zero and
// no byte beside it changes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tessera/device/buffer.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/device/device.h"

using namespace tessera;

TEST(CpuDevice, LargeFillZeroAtAnUnalignedOffsetZeroesExactlyItsBytes) {
  Device& d = cpu_device();
  const size_t size = (size_t(64) << 20) + 256, offset = 3, bytes = (size_t(64) << 20) + 101;  // streamed
  for (const size_t fill : {bytes, size_t(1000)}) {  // and a small one, by memset
    Buffer buffer(d, size);
    uint8_t* p = static_cast<uint8_t*>(buffer.handle());
    std::fill(p, p + size, uint8_t{0xA5});
    d.fill_zero(buffer.handle(), offset, fill);
    size_t wrong = 0;
    for (size_t i = 0; i < size; ++i) wrong += p[i] != (i >= offset && i < offset + fill ? 0 : 0xA5);
    EXPECT_EQ(wrong, 0u) << "bytes not as expected after fill_zero of " << fill << " at " << offset;
  }
}
