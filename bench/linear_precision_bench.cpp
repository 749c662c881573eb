// The linear layers' math modes side by side: ops::linear_forward / linear_backward in
// F32, BF16 and FP16 (ops.h MathMode) at GPT-2 small's layer shapes (hidden 768), for
// N = 256, 512, 1024 rows (micro-batch x sequence). Each figure is GFLOP/s of the whole
// call, conversions of the operands included, as a model step sees it:
//   fwd: out = inp @ W^T (+ b)                    2 N C OC FLOPs
//   bwd: dinp += dout @ W, dW += dout^T @ inp (+ db)   4 N C OC FLOPs
// qkv and fc1 carry their bias; proj and fc2 are Megatron's row-parallel layers, whose
// bias is added after the reduction (not here).
//
// usage: linear_precision_bench [reps (default 5)] [rows ... (default 256 512 1024)]
// Each rep runs every mode once, in turn, so a busy machine slows all modes alike; the
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

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/ops.h"

using namespace tessera;
using ops::MathMode;

namespace {

struct Owned {
  Buffer buffer;
  Tensor t;
  Owned(Shape s, float stddev, uint32_t seed) : buffer(cpu_device(), static_cast<size_t>(numel(s)) * 4) {
    t = tensor_at(buffer, 0, DType::F32, std::move(s));
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = stddev == 0.0f ? 0.0f : dist(gen);
  }
  static int64_t numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr MathMode kModes[] = {MathMode::F32, MathMode::BF16, MathMode::FP16};
constexpr const char* kModeNames[] = {"F32", "BF16", "FP16"};

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
  std::printf("linear F32 vs BF16 vs FP16, oneDNN %d.%d.%d, OpenMP threads %d, %d reps (rows: best, ratio to F32 of the best, median)\n",
              v->major, v->minor, v->patch, omp_get_max_threads(), reps);
  std::printf("CPU: avx512f %d, avx512bf16 %d, f16c %d\n", __builtin_cpu_supports("avx512f") != 0,
              __builtin_cpu_supports("avx512bf16") != 0, __builtin_cpu_supports("f16c") != 0);
  if (ops::cpu::bf16_uses_onednn())
    std::printf("BF16 GEMM: oneDNN bf16 matmul, implementation %s\n", ops::cpu::onednn_bf16_impl());
  else
    std::printf("BF16 GEMM: no oneDNN bf16 kernel on this CPU (oneDNN %d.%d needs AVX-512): operands rounded to "
                "bf16, kept as f32, oneDNN sgemm\n",
                v->major, v->minor);
  std::printf("FP16 GEMM: operands rounded to half (%s), oneDNN sgemm, results rounded to half\n\n",
#if defined(__AVX512F__)
              "AVX-512F VCVTPS2PH"
#elif defined(__F16C__)
              "F16C VCVTPS2PH"
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
              "fwd FP16", "bwd F32", "bwd BF16", "bwd FP16");
  for (int64_t N : rows) {
    double total_flops = 0, total_time[3] = {0, 0, 0};
    for (const Layer& l : layers) {
      Owned inp({N, l.C}, 1.0f, 1), w({l.OC, l.C}, 0.02f, 2), b({l.OC}, 0.02f, 3), out({N, l.OC}, 0.0f, 0);
      Owned dout({N, l.OC}, 1e-2f, 4), dinp({N, l.C}, 0.0f, 0), dw({l.OC, l.C}, 0.0f, 0), db({l.OC}, 0.0f, 0);
      const Tensor bias = l.bias ? b.t : Tensor(), dbias = l.bias ? db.t : Tensor();
      Stats fwd[3], bwd[3];
      for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up (workspaces, primitives)
        for (int m = 0; m < 3; ++m) {
          double t0 = now();
          ops::linear_forward(out.t, inp.t, w.t, bias, kModes[m]);
          const double tf = now() - t0;
          std::memset(dinp.t.host<void>(), 0, dinp.t.bytes());
          std::memset(dw.t.host<void>(), 0, dw.t.bytes());
          t0 = now();
          ops::linear_backward(dinp.t, dw.t, dbias, dout.t, inp.t, w.t, kModes[m]);
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
    std::printf("%-5lld %-15s %-5s | fwd+bwd of the 4 layers: F32 %.1f, BF16 %.1f (%.2fx), FP16 %.1f (%.2fx) GFLOP/s\n\n",
                static_cast<long long>(N), "all layers", "best", total_flops / total_time[0] / 1e9,
                total_flops / total_time[1] / 1e9, total_time[0] / total_time[1], total_flops / total_time[2] / 1e9,
                total_time[0] / total_time[2]);
  }
  return 0;
}
