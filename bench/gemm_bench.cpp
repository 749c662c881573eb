// oneDNN fp32 sgemm throughput: the peak (2048^3) and the GEMMs of one GPT-2 124M training
// step at micro-batch 4, sequence 64 (N = 256 rows), each as GFLOP/s and % of the peak,
// plus their average weighted by the FLOPs each contributes to a step (the four layer
// GEMM families occur once per layer, 12 times; the LM head once).
//
// Per linear layer [C -> OC] (weight [OC, C], Megatron layout), as ops::linear_* call it:
//   fwd   out[N,OC]  = inp[N,C] @ W^T       sgemm('N','T', M=N,  N=OC, K=C)
//   dinp  dinp[N,C] += dout[N,OC] @ W       sgemm('N','N', M=N,  N=C,  K=OC), beta=1
//   dW    dW[OC,C]  += dout^T @ inp         sgemm('T','N', M=OC, N=C,  K=N),  beta=1
//
// usage: gemm_bench [reps (default 10)]. Each row reports the best and the median of reps
// timed calls after 2 warm-up calls; the best is the machine's capability, the median what
// a busy machine gave. OMP_NUM_THREADS sets the thread count (oneDNN runs on OpenMP).
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tessera/ops/cpu/gemm.h"

namespace {

struct Gemm {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;
  int per_step;  // occurrences in one training step
  double flops() const { return 2.0 * M * N * K; }
};

struct Timing {
  double best_s, median_s;
};

Timing time_gemm(const Gemm& g, int reps) {
  const int64_t a_rows = g.ta ? g.K : g.M, a_cols = g.ta ? g.M : g.K;
  const int64_t b_rows = g.tb ? g.N : g.K, b_cols = g.tb ? g.K : g.N;
  std::vector<float> A(static_cast<size_t>(a_rows * a_cols)), B(static_cast<size_t>(b_rows * b_cols)),
      C(static_cast<size_t>(g.M * g.N), 0.0f);
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (float& x : A) x = dist(gen);
  for (float& x : B) x = dist(gen);
  auto call = [&] {
    tessera::ops::cpu::sgemm(g.ta, g.tb, g.M, g.N, g.K, 1.0f, A.data(), a_cols, B.data(), b_cols, g.beta, C.data(),
                             g.N);
  };
  call();
  call();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto start = std::chrono::steady_clock::now();
    call();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN %d.%d.%d fp32 sgemm, OpenMP threads %d (omp_get_max_threads), %d reps\n", v->major, v->minor,
              v->patch, omp_get_max_threads(), reps);

  // The peak is measured before and after the step's shapes: on a shared machine the two
  // differ when another process took a core meanwhile, and then no figure is reliable.
  const Gemm peak_gemm{"square 2048^3", false, false, 2048, 2048, 2048, 0.0f, 0};
  const Timing peak_before = time_gemm(peak_gemm, std::max(3, reps / 2));
  double peak = peak_gemm.flops() / peak_before.best_s / 1e9;
  std::printf("peak: %-28s %8.1f GFLOP/s best, %8.1f median\n\n", peak_gemm.name.c_str(), peak,
              peak_gemm.flops() / peak_before.median_s / 1e9);

  const int64_t N = 256, layers = 12;
  struct Layer {
    const char* name;
    int64_t C, OC;
    int per_step;
  };
  const Layer shapes[] = {{"qkv  768->2304", 768, 2304, static_cast<int>(layers)},
                          {"proj 768->768", 768, 768, static_cast<int>(layers)},
                          {"fc1  768->3072", 768, 3072, static_cast<int>(layers)},
                          {"fc2  3072->768", 3072, 768, static_cast<int>(layers)},
                          {"lm head 768->50304", 768, 50304, 1}};
  std::vector<Gemm> gemms;
  for (const Layer& l : shapes) {
    gemms.push_back({std::string(l.name) + " fwd", false, true, N, l.OC, l.C, 0.0f, l.per_step});
    gemms.push_back({std::string(l.name) + " dinp", false, false, N, l.C, l.OC, 1.0f, l.per_step});
    gemms.push_back({std::string(l.name) + " dW", true, false, l.OC, l.C, N, 1.0f, l.per_step});
  }
  std::printf("%-26s %18s %7s %10s %8s %8s %7s\n", "GEMM (N=256 rows)", "M x N x K", "x/step", "GFLOP/s", "% peak",
              "median", "% peak");
  double step_flops = 0, step_best = 0, step_median = 0;
  for (const Gemm& g : gemms) {
    const Timing t = time_gemm(g, reps);
    const double best = g.flops() / t.best_s / 1e9, median = g.flops() / t.median_s / 1e9;
    char dims[64];
    std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", static_cast<long long>(g.M), static_cast<long long>(g.N),
                  static_cast<long long>(g.K));
    std::printf("%-26s %18s %7d %10.1f %7.1f%% %8.1f %6.1f%%\n", g.name.c_str(), dims, g.per_step, best,
                100 * best / peak, median, 100 * median / peak);
    step_flops += g.per_step * g.flops();
    step_best += g.per_step * t.best_s;
    step_median += g.per_step * t.median_s;
  }
  const Timing peak_after = time_gemm(peak_gemm, std::max(3, reps / 2));
  const double peak2 = peak_gemm.flops() / peak_after.best_s / 1e9;
  std::printf("\npeak again: %.1f GFLOP/s best (before: %.1f)%s\n", peak2, peak,
              std::max(peak, peak2) > 1.1 * std::min(peak, peak2)
                  ? "; they differ by >10%: the machine was busy, rerun for reliable figures"
                  : "");
  const double avg_best = step_flops / step_best / 1e9, avg_median = step_flops / step_median / 1e9;
  std::printf("FLOP-weighted average over one step's GEMMs (%.1f GFLOP): %.1f GFLOP/s = %.1f%% of peak "
              "(median %.1f = %.1f%%); GEMM time per step %.0f ms (best)\n",
              step_flops / 1e9, avg_best, 100 * avg_best / peak, avg_median, 100 * avg_median / peak,
              step_best * 1e3);
  return 0;
}
