// The Device interface: what model and parallel code may ask of an accelerator.
// A backend implements allocation, copies, fills, memory info and ordering (streams and
// events are no-ops on the CPU). Kernels live in ops/, collectives in comm/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

enum class DeviceType { CPU, CUDA };

struct MemoryInfo {
  size_t total_bytes = 0;
  size_t free_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceType type() const = 0;
  virtual std::string name() const = 0;
  // Throws tessera::Error naming the size and what is in use when the allocation fails.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* ptr, size_t bytes) = 0;
  virtual MemoryInfo memory_info() const = 0;
  virtual void synchronize() = 0;
  // Bytes currently allocated through this device, and the high-water mark.
  size_t allocated_bytes() const { return allocated_; }
  size_t peak_allocated_bytes() const { return peak_; }

 protected:
  void account(ptrdiff_t delta) {
    allocated_ += delta;
    if (allocated_ > peak_) peak_ = allocated_;
  }

 private:
  size_t allocated_ = 0;
  size_t peak_ = 0;
};

// The process-wide CPU device.
Device& cpu_device();

}  // namespace tessera
