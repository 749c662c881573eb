// CPU backend of the Device interface: 64-byte aligned host memory.
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tessera/core/error.h"
#include "tessera/device/device.h"

namespace tessera {
namespace {

class CpuDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::CPU; }
  std::string name() const override { return "cpu"; }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) {
      MemoryInfo m = memory_info();
      throw runtime_error("out of host memory: asked for " + std::to_string(bytes >> 20) +
                              " MiB with " + std::to_string(allocated_bytes() >> 20) +
                              " MiB in use by tessera and " + std::to_string(m.free_bytes >> 20) +
                              " MiB free on the machine",
                          "lower --micro-batch-size, enable --recompute-granularity, or split "
                          "the model with --tensor-model-parallel-size / "
                          "--pipeline-model-parallel-size");
    }
    account(static_cast<ptrdiff_t>(bytes));
    return p;
  }
  void free(void* ptr, size_t bytes) override {
    if (!ptr) return;
    std::free(ptr);
    account(-static_cast<ptrdiff_t>(bytes));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  // Gradient slabs are hundreds of MB: one memset per thread keeps both memory channels busy.
  void fill_zero(void* ptr, size_t bytes) override {
    constexpr size_t kChunk = size_t(1) << 20;
    const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * kChunk;
      std::memset(static_cast<char*>(ptr) + begin, 0, std::min(kChunk, bytes - begin));
    }
  }
  MemoryInfo memory_info() const override {
    struct sysinfo si {};
    sysinfo(&si);
    return {static_cast<size_t>(si.totalram) * si.mem_unit,
            static_cast<size_t>(si.freeram + si.bufferram) * si.mem_unit};
  }
  void synchronize() override {}
};

}  // namespace

Device& cpu_device() {
  static CpuDevice device;
  return device;
}

}  // namespace tessera
