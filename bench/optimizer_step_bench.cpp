// The optimizer step of GPT-2 124M's parameters (148 tensors, 124.4M elements in one slab),
// per tensor (one sum_squares per gradient, the slots read back and summed on the host,
// then one adamw_update and, for 16-bit parameters, one convert per tensor) against the
// multi-tensor step (one multi_tensor_sum_squares, grad_norm_finish, one read-back of the
// norm, one multi_tensor_adamw that also writes the 16-bit copy), alternated so both see
// the same machine load.
// usage: optimizer_step_bench [device] [f32|bf16] [iterations]   (default cpu f32 5)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

// GPT-2 124M's parameter sizes (padded vocabulary 50304, 1024 positions, 12 layers of 768).
std::vector<int64_t> gpt2_sizes() {
  const int64_t C = 768;
  std::vector<int64_t> n = {50304 * C, 1024 * C};
  for (int l = 0; l < 12; ++l)
    for (int64_t s : {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C}) n.push_back(s);
  n.push_back(C);
  n.push_back(C);
  return n;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string spec = argc > 1 ? argv[1] : "cpu";
  const bool bf16 = argc > 2 && std::string(argv[2]) == "bf16";
  const int iterations = argc > 3 ? std::stoi(argv[3]) : 5;
  Device& device = open_device(spec);
  const std::vector<int64_t> sizes = gpt2_sizes();
  std::vector<ops::MultiTensorSegment> segments;
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ops::MultiTensorSegment s;
    s.main = s.param = s.grad = s.state = total;
    s.numel = sizes[i];
    s.decay = sizes[i] > 3072;  // biases and norms: Megatron's no-decay group
    s.slot = static_cast<int64_t>(i);
    segments.push_back(s);
    total += (sizes[i] + 15) / 16 * 16;  // the gradient buffer's dense alignment
  }
  auto f32 = [&](Buffer& b, int64_t n) {
    b = Buffer(device, static_cast<size_t>(n) * sizeof(float));
    return tensor_at(b, 0, DType::F32, {n});
  };
  Buffer b_main, b_grad, b_m, b_v, b_p16, b_tables;
  const Tensor main = f32(b_main, total), grad = f32(b_grad, total), m = f32(b_m, total), v = f32(b_v, total);
  Tensor p16;
  if (bf16) {
    b_p16 = Buffer(device, static_cast<size_t>(total) * 2);
    p16 = tensor_at(b_p16, 0, DType::BF16, {total});
  }
  ops::fill(main, 0.02f);
  ops::fill(grad, 1e-3f);
  const std::vector<int64_t> table = ops::multi_tensor_chunk_table(segments);
  const int64_t rows = static_cast<int64_t>(table.size()) / ops::kChunkColumns;
  const int64_t slots = static_cast<int64_t>(sizes.size());
  const Shape ws_shape = ops::multi_tensor_sum_squares_workspace(device, rows);
  const int64_t ws = shape_numel(ws_shape);
  b_tables = Buffer(device, static_cast<size_t>(rows * ops::kChunkColumns + slots + 2 + ws) * 8 + 64);
  const Tensor chunks = tensor_at(b_tables, 0, DType::I64, {rows, ops::kChunkColumns});
  const size_t at_sums = static_cast<size_t>(rows * ops::kChunkColumns) * 8;
  const Tensor sums = tensor_at(b_tables, at_sums, DType::I64, {slots});
  const Tensor result = tensor_at(b_tables, at_sums + static_cast<size_t>(slots) * 8, DType::I64, {2});
  const Tensor workspace = tensor_at(b_tables, at_sums + static_cast<size_t>(slots + 2) * 8, DType::I64, ws_shape);
  Buffer b_scalars;
  const Tensor scalars = f32(b_scalars, ops::kStepScalars);
  copy_from_host(chunks, table.data(), table.size() * sizeof(int64_t));
  auto piece = [](const Tensor& t, const ops::MultiTensorSegment& s) {
    return Tensor(t.handle, t.offset + static_cast<size_t>(s.grad) * dtype_size(t.dtype), t.dtype, {s.numel},
                  t.device);
  };
  std::vector<double> host_slots(static_cast<size_t>(slots));

  auto per_tensor = [&](int64_t step) {
    fill_zero(sums);
    for (const ops::MultiTensorSegment& s : segments) ops::sum_squares(sums, s.slot, piece(grad, s));
    copy_to_host(host_slots.data(), host_slots.size() * sizeof(double), sums);
    double sum = 0.0;
    for (double x : host_slots) sum += x;
    const double norm = std::sqrt(sum), coeff = std::min(1.0, 1.0 / (norm + 1e-6));
    for (const ops::MultiTensorSegment& s : segments) {
      ops::adamw_update(piece(main, s), piece(grad, s), piece(m, s), piece(v, s), 1e-4f, 0.9f, 0.95f, 1e-8f,
                        s.decay ? 0.1f : 0.0f, step, static_cast<float>(coeff));
      if (bf16) ops::convert(piece(p16, s), piece(main, s));
    }
    device.synchronize();
  };
  auto multi_tensor = [&](int64_t step) {
    float host[ops::kGradScale];
    ops::step_scalars(host, 1e-4, 0.1, 1.0, 0.9f, 0.95f, step);
    copy_from_host(tensor_at(b_scalars, 0, DType::F32, {ops::kGradScale}), host, sizeof(host));
    fill_zero(sums);
    ops::multi_tensor_sum_squares(sums, workspace, grad, chunks);
    ops::grad_norm_finish(result, scalars, sums, 1.0f);
    double norm[2];
    copy_to_host(norm, sizeof(norm), result);
    ops::multi_tensor_adamw(main, p16, grad, m, v, chunks, scalars, 0.9f, 0.95f, 1e-8f);
    device.synchronize();
  };
  per_tensor(1);  // warm-up: first touches, kernel builds
  multi_tensor(1);
  std::vector<double> a, b;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    per_tensor(i + 2);
    a.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    multi_tensor(i + 2);
    b.push_back(seconds_since(t0));
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  const double ma = a[a.size() / 2] * 1e3, mb = b[b.size() / 2] * 1e3;
  std::printf("optimizer step, GPT-2 124M (%lld elements, %zu tensors, %lld chunks), %s params on %s, median of %d:\n",
              static_cast<long long>(total), sizes.size(), static_cast<long long>(rows), bf16 ? "bf16" : "f32",
              device.name().c_str(), iterations);
  std::printf("  per tensor   (norm, read-back, AdamW%s): %8.1f ms\n", bf16 ? ", convert" : "", ma);
  std::printf("  multi-tensor (norm, finish, read-back, AdamW + copy): %8.1f ms  (%.2fx)\n", mb, ma / mb);
  return 0;
}
