// The CPU device's memory operations: fill_zero streams fills larger than any cache past the
// caches, its unaligned head and tail written by memset; every byte asked for is zero and
// no byte beside it changes. Slabs of 32 MiB or more ask for transparent huge pages only with
// TESSERA_HUGE_PAGES=1 (tests/CMakeLists.txt runs that case again with the variable set).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
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

// The VmFlags line of the mapping in /proc/self/smaps that holds p ("hg": MADV_HUGEPAGE).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') inside = begin <= at && at < end;
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(CpuDevice, LargeSlabsAskForHugePagesOnlyWhenTold) {
  const char* v = std::getenv("TESSERA_HUGE_PAGES");
  const bool told = v && std::strcmp(v, "1") == 0;
  Buffer large(cpu_device(), size_t(64) << 20), small(cpu_device(), size_t(1) << 20);
  const std::string flags = vm_flags_of(large.handle());
  ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the 64 MiB buffer";
  EXPECT_EQ(flags.find(" hg") != std::string::npos, told) << flags << " with TESSERA_HUGE_PAGES=" << (v ? v : "");
  if (told) EXPECT_EQ(reinterpret_cast<uintptr_t>(large.handle()) % (size_t(2) << 20), 0u) << "not 2 MiB aligned";
  EXPECT_EQ(vm_flags_of(small.handle()).find(" hg"), std::string::npos) << "a 1 MiB buffer asked for huge pages";
}
