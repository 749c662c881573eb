// The optimizer step of GPT-2 124M's parameters (148 tensors, 124.4M elements in one slab),
// per tensor (one sum_squares per gradient, the slots read back and summed on the host,
// then one adamw_update and, for 16-bit parameters, one convert per tensor) against the
// multi-tensor step (one multi_tensor_sum_squares, grad_norm_finish, one read-back of the
// norm, one multi_tensor_adamw that also writes the 16-bit copy), alternated so both see
// the same machine load. The multi-tensor step's norm and AdamW are timed apart too, and on
// a host-memory device a STREAM-like probe over the same slabs (copy: b = a, triad:
// c = a + s b; 1 and 2 threads) gives the memory bandwidth that bounds them.
// usage: optimizer_step_bench [device] [f32|bf16] [iterations]   (default cpu f32 5)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <omp.h>
#include <string>
#include <utility>
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

// The process's CPU time (all threads) in seconds: under load it leaves out the time the
// threads wait for a core, which wall time counts.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median_ms(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1e3;
}

// The best of `iterations` runs of f with `threads` threads, in GB/s for `bytes` moved per
// run: by wall time and by CPU time per thread (which leaves out waits for a core).
template <typename F>
std::pair<double, double> best_gb_per_s(int iterations, int threads, double bytes, F f) {
  double wall = 1e30, cpu = 1e30;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    f();
    wall = std::min(wall, seconds_since(t0));
    cpu = std::min(cpu, (cpu_seconds() - c0) / threads);
  }
  return {bytes / wall / 1e9, bytes / cpu / 1e9};
}

// STREAM-like loops over n floats of host memory, with 1 and 2 OpenMP threads: copy
// (b = a), triad (c = a + s b) and AdamW's pattern, an update in place (c = c + s a, its
// lines read before they are written). Bytes counted as moved: an ordinary store to a line
// not read first also reads it (copy 12 bytes per element, triad 16, update 12).
void bandwidth_probe(float* a, float* b, float* c, int64_t n, int iterations) {
  for (int threads : {1, 2}) {
    const auto copy = best_gb_per_s(iterations, threads, 12.0 * n, [&] {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t i = 0; i < n; ++i) b[i] = a[i];
    });
    const auto triad = best_gb_per_s(iterations, threads, 16.0 * n, [&] {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i] + 0.5f * b[i];
    });
    const auto update = best_gb_per_s(iterations, threads, 12.0 * n, [&] {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t i = 0; i < n; ++i) c[i] = c[i] + 0.5f * a[i];
    });
    std::printf("  memory bandwidth, %d thread%s over %.1f GB, GB/s by wall (by CPU time per thread): copy %5.1f (%5.1f), "
                "triad %5.1f (%5.1f), update %5.1f (%5.1f)\n",
                threads, threads > 1 ? "s" : "", 16.0 * n / 1e9, copy.first, copy.second, triad.first, triad.second,
                update.first, update.second);
  }
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
  std::vector<double> norm_times, adamw_times, norm_cpu, adamw_cpu;
  auto multi_tensor = [&](int64_t step) {
    float host[ops::kGradScale];
    ops::step_scalars(host, 1e-4, 0.1, 1.0, 0.9f, 0.95f, step);
    copy_from_host(tensor_at(b_scalars, 0, DType::F32, {ops::kGradScale}), host, sizeof(host));
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_seconds();
    fill_zero(sums);
    ops::multi_tensor_sum_squares(sums, workspace, grad, chunks);
    ops::grad_norm_finish(result, scalars, sums, 1.0f);
    double norm[2];
    copy_to_host(norm, sizeof(norm), result);
    norm_times.push_back(seconds_since(t0));
    norm_cpu.push_back(cpu_seconds() - c0);
    t0 = std::chrono::steady_clock::now();
    c0 = cpu_seconds();
    ops::multi_tensor_adamw(main, p16, grad, m, v, chunks, scalars, 0.9f, 0.95f, 1e-8f);
    device.synchronize();
    adamw_times.push_back(seconds_since(t0));
    adamw_cpu.push_back(cpu_seconds() - c0);
  };
  per_tensor(1);  // warm-up: first touches, kernel builds
  multi_tensor(1);
  norm_times.clear();
  adamw_times.clear();
  norm_cpu.clear();
  adamw_cpu.clear();
  std::vector<double> a, b;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    per_tensor(i + 2);
    a.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    multi_tensor(i + 2);
    b.push_back(seconds_since(t0));
  }
  const double ma = median_ms(a), mb = median_ms(b);
  std::printf("optimizer step, GPT-2 124M (%lld elements, %zu tensors, %lld chunks), %s params on %s, median of %d:\n",
              static_cast<long long>(total), sizes.size(), static_cast<long long>(rows), bf16 ? "bf16" : "f32",
              device.name().c_str(), iterations);
  std::printf("  per tensor   (norm, read-back, AdamW%s): %8.1f ms\n", bf16 ? ", convert" : "", ma);
  std::printf("  multi-tensor (norm, finish, read-back, AdamW + copy): %8.1f ms  (%.2fx)\n", mb, ma / mb);
  // GB/s by wall time and by CPU time per thread (the probe's two measures).
  const double threads = omp_get_max_threads(), norm_ms = median_ms(norm_times), adamw_ms = median_ms(adamw_times);
  const double norm_cpu_ms = median_ms(norm_cpu), adamw_cpu_ms = median_ms(adamw_cpu);
  const double norm_bytes = 4.0 * static_cast<double>(total);
  const double adamw_bytes = (28.0 + (bf16 ? 2.0 : 0.0)) * static_cast<double>(total);
  std::printf("    of which the norm %.1f ms, CPU %.1f ms (%.1f (%.1f) GB/s read), AdamW %.1f ms, CPU %.1f ms (%.1f (%.1f) "
              "GB/s at %.0f bytes per parameter)\n",
              norm_ms, norm_cpu_ms, norm_bytes / norm_ms / 1e6, norm_bytes / (norm_cpu_ms / threads) / 1e6, adamw_ms,
              adamw_cpu_ms, adamw_bytes / adamw_ms / 1e6, adamw_bytes / (adamw_cpu_ms / threads) / 1e6,
              adamw_bytes / static_cast<double>(total));
  if (device.is_host())
    bandwidth_probe(static_cast<float*>(b_grad.handle()), static_cast<float*>(b_m.handle()),
                    static_cast<float*>(b_v.handle()), total, iterations);
  return 0;
}
