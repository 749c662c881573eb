// Why the bf16 GEMMs of a GPT-2 124M step (micro-batch 4, T=64: N = 256 rows) run slower in the
// step than alone (issue 28): each shape of ops::linear_* timed through gemm_bf16 (oneDNN's
// bf16 matmul) twice,
//   hot:  the same operands every call (what an isolated GEMM benchmark measures), and
//   cold: a different copy of the operands every call, cycling through `copies` of them
//         (12 = the step's layers, each of which has its own weight, activations and f32
//         weight gradient), so A, B and C come from memory as in the step,
// and the weight gradients also with beta = 0 (a first contribution assigned, no read of C);
// then the LM head's data gradient (K = the vocabulary) whole, in K tiles of strided dout
// column blocks, and in K tiles copied contiguous first (what ops::linear_backward does);
// then the other long-K products (K = 3072, 2304) whole and in even K tiles.
// usage: bf16_gemm_bench [reps (default 8)] [copies (default 12)]; prints best and median
// GFLOP/s. OMP_NUM_THREADS sets the threads (oneDNN runs on OpenMP).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/ops/cpu/gemm.h"

namespace {

struct Gemm {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;
  double flops() const { return 2.0 * M * N * K; }
};

struct Operands {
  std::vector<uint16_t> a, b;
  std::vector<float> c;
};

// GFLOP/s of the best and the median call; call i uses copy i % copies.
std::pair<double, double> time_gemm(const Gemm& g, std::vector<Operands>& pool, int copies, int reps) {
  const int64_t lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
  auto call = [&](int i) {
    Operands& o = pool[static_cast<size_t>(i % copies)];
    tessera::ops::cpu::gemm_bf16(g.ta, g.tb, g.M, g.N, g.K, 1.0f, o.a.data(), lda, o.b.data(), ldb, g.beta,
                                 o.c.data(), g.N);
  };
  for (int i = 0; i < copies; ++i) call(i);  // warm-up: primitive creation, first touch
  std::vector<double> t;
  for (int r = 0; r < reps * copies; ++r) {
    const auto start = std::chrono::steady_clock::now();
    call(r);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return {g.flops() / t.front() / 1e9, g.flops() / t[t.size() / 2] / 1e9};
}

// The LM head's dinp[N,768] = dout[N,V] @ W[V,768] in K tiles: strided column blocks of dout
// (oneDNN picks gemm:jit), or blocks copied contiguous first (brgemm), the copy timed too.
void time_head_dinp_tiles(int64_t N, int reps) {
  const int64_t V = 50304, C = 768;
  std::vector<uint16_t> a(static_cast<size_t>(N * V)), b(static_cast<size_t>(V * C)), packed;
  std::vector<float> c(static_cast<size_t>(N * C));
  for (size_t j = 0; j < a.size(); ++j) a[j] = tessera::f32_to_bf16(0.01f * static_cast<float>(j % 17));
  for (size_t j = 0; j < b.size(); ++j) b[j] = tessera::f32_to_bf16(0.01f * static_cast<float>(j % 13));
  struct Variant {
    int64_t tile;
    bool pack;
  };
  const Variant variants[] = {{512, false},  {1024, false}, {2048, false}, {4096, false}, {5440, false},
                              {8192, false}, {V, false},    {512, true},   {1024, true},  {2048, true},
                              {4096, true},  {8192, true}};
  for (const Variant& v : variants) {
    packed.resize(static_cast<size_t>(N * v.tile));
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (int64_t k0 = 0; k0 < V; k0 += v.tile) {
        const int64_t len = std::min(v.tile, V - k0);
        if (v.pack) {
#pragma omp parallel for
          for (int64_t n = 0; n < N; ++n)
            std::copy(a.data() + n * V + k0, a.data() + n * V + k0 + len, packed.data() + n * len);
        }
        tessera::ops::cpu::gemm_bf16(false, false, N, C, len, 1.0f, v.pack ? packed.data() : a.data() + k0,
                                     v.pack ? len : V, b.data() + k0 * C, C, k0 == 0 ? 0.0f : 1.0f, c.data(), C);
      }
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    const double flops = 2.0 * N * C * V;
    std::printf("head dinp in K tiles of %5lld%s: %6.0f / %5.0f GFLOP/s\n", static_cast<long long>(v.tile),
                v.pack ? " packed" : "", flops / t.front() / 1e9, flops / t[t.size() / 2] / 1e9);
  }
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The products with a long K whole and in even K tiles of packed A columns, operands cold
// (cycling through `copies`), the packing timed too: ops::linear takes the tiles for the data
// gradients (fc1, qkv; outside --deterministic-mode) and keeps fc2's forward whole (its
// tiles gained nothing in the step, where the input was just written).
void time_long_k_tiles(int64_t N, int reps, int copies) {
  struct Shape {
    const char* name;
    bool tb;
    int64_t n, K, tile;
    float beta;
  };
  const Shape shapes[] = {{"fc1  dinp", false, 768, 3072, 1536, 0.0f},
                          {"fc2  fwd", true, 768, 3072, 1536, 1.0f},
                          {"qkv  dinp", false, 768, 2304, 1152, 0.0f}};
  for (const Shape& s : shapes) {
    std::vector<Operands> pool(static_cast<size_t>(copies));
    for (Operands& o : pool) {
      o.a.resize(static_cast<size_t>(N * s.K));
      o.b.resize(static_cast<size_t>(s.K * s.n));
      o.c.assign(static_cast<size_t>(N * s.n), 0.0f);
      for (size_t j = 0; j < o.a.size(); ++j) o.a[j] = tessera::f32_to_bf16(0.01f * static_cast<float>(j % 17));
      for (size_t j = 0; j < o.b.size(); ++j) o.b[j] = tessera::f32_to_bf16(0.01f * static_cast<float>(j % 13));
    }
    const int64_t ldb = s.tb ? s.K : s.n;
    std::vector<uint16_t> packed(static_cast<size_t>(N * s.tile));
    for (int64_t tile : {s.K, s.tile}) {
      auto call = [&](int i) {
        Operands& o = pool[static_cast<size_t>(i % copies)];
        for (int64_t k0 = 0; k0 < s.K; k0 += tile) {
          const int64_t len = std::min(tile, s.K - k0);
          const uint16_t* a = o.a.data();
          if (tile < s.K) {
            uint16_t* p = packed.data();
#pragma omp parallel for
            for (int64_t n = 0; n < N; ++n) std::copy(a + n * s.K + k0, a + n * s.K + k0 + len, p + n * len);
            a = p;
          }
          tessera::ops::cpu::gemm_bf16(false, s.tb, N, s.n, len, 1.0f, a, tile < s.K ? len : s.K,
                                       o.b.data() + (s.tb ? k0 : k0 * ldb), ldb, k0 == 0 ? s.beta : 1.0f,
                                       o.c.data(), s.n);
        }
      };
      for (int i = 0; i < copies; ++i) call(i);
      // Wall time, and each thread's CPU time (immune to other processes taking the cores):
      // the busiest thread's is the critical path, all threads' over it the busy threads.
      std::vector<double> wall, critical;
      double busy = 0.0;
      for (int r = 0; r < reps * copies; ++r) {
        double cpu[2] = {0.0, 0.0};
#pragma omp parallel num_threads(2)
        cpu[omp_get_thread_num()] -= thread_cpu_seconds();
        const auto start = std::chrono::steady_clock::now();
        call(r);
        wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
#pragma omp parallel num_threads(2)
        cpu[omp_get_thread_num()] += thread_cpu_seconds();
        critical.push_back(std::max(cpu[0], cpu[1]));
        busy += (cpu[0] + cpu[1]) / critical.back() / (reps * copies);
      }
      std::sort(wall.begin(), wall.end());
      std::sort(critical.begin(), critical.end());
      const double flops = 2.0 * N * s.n * s.K;
      const std::string how = tile == s.K ? "whole" : "in K tiles of " + std::to_string(tile);
      std::printf("%s %lldx%lldx%lld %-19s cold wall %5.0f / %5.0f, critical path %5.0f / %5.0f GFLOP/s, %.2f threads busy\n",
                  s.name, static_cast<long long>(N), static_cast<long long>(s.n), static_cast<long long>(s.K),
                  how.c_str(), flops / wall.front() / 1e9, flops / wall[wall.size() / 2] / 1e9,
                  flops / critical.front() / 1e9, flops / critical[critical.size() / 2] / 1e9, busy);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 8;
  const int copies = argc > 2 ? std::max(1, std::atoi(argv[2])) : 12;
  std::printf("bf16 GEMMs of a GPT-2 124M step (N=256), gemm_bf16 = %s, OpenMP threads %d, %d reps x %d copies\n",
              tessera::ops::cpu::onednn_bf16_impl(), omp_get_max_threads(), reps, copies);
  const int64_t N = 256;
  struct Layer {
    const char* name;
    int64_t C, OC;
  };
  const Layer shapes[] = {{"qkv  768->2304", 768, 2304}, {"proj 768->768", 768, 768}, {"fc1  768->3072", 768, 3072},
                          {"fc2  3072->768", 3072, 768}, {"head 768->50304", 768, 50304}};
  std::vector<Gemm> gemms;
  for (const Layer& l : shapes) {
    gemms.push_back({std::string(l.name) + " fwd", false, true, N, l.OC, l.C, 0.0f});
    gemms.push_back({std::string(l.name) + " dinp", false, false, N, l.C, l.OC, 0.0f});
    gemms.push_back({std::string(l.name) + " dW +=", true, false, l.OC, l.C, N, 1.0f});
    gemms.push_back({std::string(l.name) + " dW =", true, false, l.OC, l.C, N, 0.0f});
  }
  std::printf("%-24s %18s %14s %14s\n", "GEMM", "M x N x K", "hot best/med", "cold best/med");
  for (const Gemm& g : gemms) {
    const int n_copies = g.N * g.M > 20'000'000 ? std::min(copies, 2) : copies;  // the head: memory
    std::vector<Operands> pool(static_cast<size_t>(n_copies));
    for (int i = 0; i < n_copies; ++i) {
      Operands& o = pool[static_cast<size_t>(i)];
      o.a.resize(static_cast<size_t>(g.M * g.K));
      o.b.resize(static_cast<size_t>(g.K * g.N));
      o.c.assign(static_cast<size_t>(g.M * g.N), 0.0f);
      for (size_t j = 0; j < o.a.size(); ++j) o.a[j] = tessera::f32_to_bf16(0.01f * static_cast<float>(j % 17));
      for (size_t j = 0; j < o.b.size(); ++j) o.b[j] = tessera::f32_to_bf16(0.01f * static_cast<float>(j % 13));
    }
    const auto hot = time_gemm(g, pool, 1, reps * 2);
    const auto cold = time_gemm(g, pool, n_copies, reps);
    char dims[64];
    std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", static_cast<long long>(g.M), static_cast<long long>(g.N),
                  static_cast<long long>(g.K));
    std::printf("%-24s %18s %6.0f / %5.0f %6.0f / %5.0f%s\n", g.name.c_str(), dims, hot.first, hot.second,
                cold.first, cold.second, n_copies < copies ? " (2 copies)" : "");
  }
  time_head_dinp_tiles(N, reps);
  time_long_k_tiles(N, reps, copies);
  return 0;
}
