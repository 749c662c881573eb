// Shapes and the views of Tensor (core/tensor.h).
#include "tessera/core/tensor.h"

namespace tessera {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t Tensor::numel() const { return shape_numel(shape); }

bool Tensor::same_memory(const Tensor& o) const {
  return device == o.device && handle == o.handle && offset == o.offset && bytes() == o.bytes();
}

Tensor Tensor::view(Shape s) const {
  Tensor t(handle, offset, dtype, std::move(s), device);
  TESSERA_CHECK(t.numel() == numel(), "view " + shape_str(t.shape) + " of " + shape_str(shape));
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  TESSERA_CHECK(begin >= 0 && begin + count <= shape.at(0), "slice out of range");
  Shape s = shape;
  s[0] = count;
  int64_t row = numel() / shape[0];
  return Tensor(handle, offset + static_cast<size_t>(begin * row) * dtype_size(dtype), dtype, s, device);
}

}  // namespace tessera
