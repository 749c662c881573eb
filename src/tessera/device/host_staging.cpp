#include "tessera/device/host_staging.h"

#include <algorithm>

namespace tessera {

HostStaging::HostStaging(Device& device, size_t capacity)
    : device_(device), capacity_(capacity), buffer_(device.allocate_pinned(capacity)) {
  TESSERA_CHECK(capacity > 0, "HostStaging needs a capacity");
}

HostStaging::~HostStaging() { device_.free_pinned(buffer_, capacity_); }

void HostStaging::read(Tensor src, const std::function<void(const void*, size_t)>& consume) {
  TESSERA_CHECK(src.device == &device_, "HostStaging::read: tensor on " + src.device->name() + ", stage for " +
                                            device_.name());
  const size_t total = src.bytes();
  for (size_t done = 0; done < total;) {
    const size_t n = std::min(capacity_, total - done);
    device_.copy_to_host(buffer_, src.handle, src.offset + done, n);
    consume(buffer_, n);
    done += n;
  }
}

void HostStaging::write(Tensor dst, const std::function<void(void*, size_t)>& produce) {
  TESSERA_CHECK(dst.device == &device_, "HostStaging::write: tensor on " + dst.device->name() + ", stage for " +
                                            device_.name());
  const size_t total = dst.bytes();
  for (size_t done = 0; done < total;) {
    const size_t n = std::min(capacity_, total - done);
    produce(buffer_, n);
    device_.copy_from_host(dst.handle, dst.offset + done, buffer_, n);
    done += n;
  }
}

std::vector<float> read_f32(Tensor t) {
  t.check_dtype(DType::F32);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_to_host(v.data(), v.size() * sizeof(float), t);
  return v;
}

std::vector<int32_t> read_i32(Tensor t) {
  t.check_dtype(DType::I32);
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  copy_to_host(v.data(), v.size() * sizeof(int32_t), t);
  return v;
}

void write_f32(Tensor t, const std::vector<float>& values) {
  t.check_dtype(DType::F32);
  copy_from_host(t, values.data(), values.size() * sizeof(float));
}

void write_i32(Tensor t, const std::vector<int32_t>& values) {
  t.check_dtype(DType::I32);
  copy_from_host(t, values.data(), values.size() * sizeof(int32_t));
}

}  // namespace tessera
