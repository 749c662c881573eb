// The linear layer on F32, BF16 and F16 tensors side by side (ops.h: the GEMMs follow the
// tensors' dtypes; --bf16 / --fp16 keep inp, weight, bias, out, dout and dinp in 16 bits,
// dweight and dbias in f32), ops::linear_forward / linear_backward at GPT-2 small's layer
// shapes (hidden 768), for N = 256, 512, 1024 rows (micro-batch x sequence). Each figure
// is GFLOP/s of the whole call, widening and rounding included, as a model step sees it:
//   fwd: out = inp @ W^T (+ b)                    2 N C OC FLOPs
//   bwd: dinp += dout @ W, dW += dout^T @ inp (+ db)   4 N C OC FLOPs
// qkv and fc1 carry their bias; proj and fc2 are Megatron's row-parallel layers, whose
// bias is added after the reduction (not here).
//
// usage: linear_precision_bench [reps (default 5)] [rows ... (default 256 512 1024)]
// Each rep runs every dtype once, in turn, so a busy machine slows all alike; the
// table shows the best rep and the ratio to F32 (the medians are printed too).
// OMP_NUM_THREADS sets the thread count.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

// A host tensor of dtype d holding N(0, stddev) values rounded to d (zeros for stddev 0).
struct Owned {
  Buffer buffer;
  Tensor t;
  Owned(DType d, Shape s, float stddev, uint32_t seed)
      : buffer(cpu_device(), static_cast<size_t>(numel(s)) * dtype_size(d)) {
    t = tensor_at(buffer, 0, d, std::move(s));
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float x = stddev == 0.0f ? 0.0f : dist(gen);
      if (d == DType::F32) t.f32()[i] = x;
      else t.host<uint16_t>()[i] = d == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
    }
  }
  static int64_t numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

struct Stats {
  std::vector<double> t;
  double best() const { return *std::min_element(t.begin(), t.end()); }
  double median() const {
    std::vector<double> s = t;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::vector<int64_t> rows;
  for (int i = 2; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
  if (rows.empty()) rows = {256, 512, 1024};

  const dnnl_version_t* v = dnnl_version();
  std::printf("linear on F32 vs BF16 vs F16 tensors, oneDNN %d.%d.%d, OpenMP threads %d, %d reps (rows: best, ratio to F32 of the best, median)\n",
              v->major, v->minor, v->patch, omp_get_max_threads(), reps);
  std::printf("CPU: avx512f %d, avx512bf16 %d, f16c %d\n", __builtin_cpu_supports("avx512f") != 0,
              __builtin_cpu_supports("avx512bf16") != 0, __builtin_cpu_supports("f16c") != 0);
  if (ops::cpu::bf16_uses_onednn())
    std::printf("BF16 GEMM: oneDNN bf16 matmul on the tensors' bits, implementation %s\n",
                ops::cpu::onednn_bf16_impl());
  else
    std::printf("BF16 GEMM: no oneDNN bf16 kernel on this CPU (oneDNN %d.%d needs AVX-512): operands widened to "
                "f32, oneDNN sgemm\n",
                v->major, v->minor);
  std::printf("F16 GEMM: operands widened to f32 (%s), oneDNN sgemm; 16-bit results rounded once\n\n",
#if defined(__F16C__)
              "F16C VCVTPH2PS"
#else
              "scalar"
#endif
  );

  struct Layer {
    const char* name;
    int64_t C, OC;
    bool bias;
  };
  const Layer layers[] = {{"qkv  768->2304", 768, 2304, true},
                          {"proj 768->768", 768, 768, false},
                          {"fc1  768->3072", 768, 3072, true},
                          {"fc2  3072->768", 3072, 768, false}};

  std::printf("%-5s %-15s %-5s | %10s %10s %10s | %10s %10s %10s\n", "N", "layer", "", "fwd F32", "fwd BF16",
              "fwd F16", "bwd F32", "bwd BF16", "bwd F16");
  for (int64_t N : rows) {
    double total_flops = 0, total_time[3] = {0, 0, 0};
    for (const Layer& l : layers) {
      // Per dtype: inp, w, b, out, dout, dinp of that dtype; dw, db f32 (fp32 main grads).
      std::vector<std::vector<Owned>> t(3);
      for (int m = 0; m < 3; ++m) {
        const DType d = kDtypes[m];
        t[m].reserve(8);  // the tensors point into the buffers: no reallocation
        t[m].emplace_back(d, Shape{N, l.C}, 1.0f, 1);
        t[m].emplace_back(d, Shape{l.OC, l.C}, 0.02f, 2);
        t[m].emplace_back(d, Shape{l.OC}, 0.02f, 3);
        t[m].emplace_back(d, Shape{N, l.OC}, 0.0f, 0);
        t[m].emplace_back(d, Shape{N, l.OC}, 1e-2f, 4);
        t[m].emplace_back(d, Shape{N, l.C}, 0.0f, 0);
        t[m].emplace_back(DType::F32, Shape{l.OC, l.C}, 0.0f, 0);
        t[m].emplace_back(DType::F32, Shape{l.OC}, 0.0f, 0);
      }
      Stats fwd[3], bwd[3];
      for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up (workspaces, primitives)
        for (int m = 0; m < 3; ++m) {
          const Tensor &inp = t[m][0].t, &w = t[m][1].t, &out = t[m][3].t, &dout = t[m][4].t, &dinp = t[m][5].t,
                       &dw = t[m][6].t;
          const Tensor bias = l.bias ? t[m][2].t : Tensor(), dbias = l.bias ? t[m][7].t : Tensor();
          double t0 = now();
          ops::linear_forward(out, inp, w, bias);
          const double tf = now() - t0;
          std::memset(dinp.host<void>(), 0, dinp.bytes());
          std::memset(dw.host<void>(), 0, dw.bytes());
          t0 = now();
          ops::linear_backward(dinp, dw, dbias, dout, inp, w);
          const double tb = now() - t0;
          if (rep >= 0) {
            fwd[m].t.push_back(tf);
            bwd[m].t.push_back(tb);
          }
        }
      }
      const double flops = 2.0 * N * l.C * l.OC;
      auto gf = [](double f, double t) { return f / t / 1e9; };
      std::printf("%-5lld %-15s %-5s | %10.1f %10.1f %10.1f | %10.1f %10.1f %10.1f\n", static_cast<long long>(N),
                  l.name, "best", gf(flops, fwd[0].best()), gf(flops, fwd[1].best()), gf(flops, fwd[2].best()),
                  gf(2 * flops, bwd[0].best()), gf(2 * flops, bwd[1].best()), gf(2 * flops, bwd[2].best()));
      std::printf("%-5s %-15s %-5s | %10s %9.2fx %9.2fx | %10s %9.2fx %9.2fx\n", "", "", "vsF32", "",
                  fwd[0].best() / fwd[1].best(), fwd[0].best() / fwd[2].best(), "", bwd[0].best() / bwd[1].best(),
                  bwd[0].best() / bwd[2].best());
      std::printf("%-5s %-15s %-5s | %10.1f %10.1f %10.1f | %10.1f %10.1f %10.1f\n", "", "", "med",
                  gf(flops, fwd[0].median()), gf(flops, fwd[1].median()), gf(flops, fwd[2].median()),
                  gf(2 * flops, bwd[0].median()), gf(2 * flops, bwd[1].median()), gf(2 * flops, bwd[2].median()));
      total_flops += 3 * flops;
      for (int m = 0; m < 3; ++m) total_time[m] += fwd[m].best() + bwd[m].best();
    }
    std::printf("%-5lld %-15s %-5s | fwd+bwd of the 4 layers: F32 %.1f, BF16 %.1f (%.2fx), F16 %.1f (%.2fx) GFLOP/s\n\n",
                static_cast<long long>(N), "all layers", "best", total_flops / total_time[0] / 1e9,
                total_flops / total_time[1] / 1e9, total_time[0] / total_time[1], total_flops / total_time[2] / 1e9,
                total_time[0] / total_time[2]);
  }
  return 0;
}
