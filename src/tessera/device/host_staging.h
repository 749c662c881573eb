// Host code (checkpoints, Hugging Face export, tests) reads and writes tensors of any
// device through these: a bounded pinned staging buffer, one piece at a time, so a
// checkpoint of a model that fills the device never needs a host copy of the whole model.
//
//   HostStaging stage(device);                       // 64 MiB unless told otherwise
//   stage.read(t, [&](const void* p, size_t n) { file.write(p, n); });
//   stage.write(t, [&](void* p, size_t n) { file.read(p, n); });
//   std::vector<float> v = read_f32(t);              // small tensors, whole
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/device/device.h"

namespace tessera {

class HostStaging {
 public:
  static constexpr size_t kDefaultBytes = size_t(64) << 20;
  explicit HostStaging(Device& device, size_t capacity = kDefaultBytes);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Calls consume(piece, bytes) for consecutive pieces of src's bytes, in order; each
  // piece is valid only during its call.
  void read(Tensor src, const std::function<void(const void* piece, size_t bytes)>& consume);
  // Calls produce(piece, bytes) for consecutive pieces of dst, in order; produce fills the
  // piece, which is then copied into dst.
  void write(Tensor dst, const std::function<void(void* piece, size_t bytes)>& produce);
  size_t capacity() const { return capacity_; }

 private:
  Device& device_;
  size_t capacity_;
  void* buffer_;
};

// A whole tensor's bytes on the host (for tensors that fit: scalars, tests, one layer).
std::vector<float> read_f32(Tensor t);
std::vector<int32_t> read_i32(Tensor t);
void write_f32(Tensor t, const std::vector<float>& values);
void write_i32(Tensor t, const std::vector<int32_t>& values);

}  // namespace tessera
