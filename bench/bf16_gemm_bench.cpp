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
// Last, each layer's forward and weight gradient through tessera's AMX kernels (amx_gemm.h)
// against gemm_bf16, operands cold, with the largest difference between the two.
// usage: bf16_gemm_bench [reps (default 8)] [copies (default 12)] [amx: only the last part];
// prints best and median GFLOP/s. OMP_NUM_THREADS sets the threads (oneDNN runs on OpenMP).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/ops/cpu/amx_gemm.h"
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

// One linear layer's operands (x, W, dy bf16; y, dW f32).
struct LayerOperands {
  std::vector<uint16_t> x, w, dy;
  std::vector<float> y, dw;
  LayerOperands(int64_t N, int64_t C, int64_t OC, int seed)
      : x(static_cast<size_t>(N * C)), w(static_cast<size_t>(OC * C)), dy(static_cast<size_t>(N * OC)),
        y(static_cast<size_t>(N * OC)), dw(static_cast<size_t>(OC * C)) {
    uint32_t state = 2463534242u + static_cast<uint32_t>(seed);
    auto fill = [&state](std::vector<uint16_t>& v, float scale) {  // uniform in [-scale, scale), xorshift32
      for (uint16_t& e : v) {
        state ^= state << 13, state ^= state >> 17, state ^= state << 5;
        e = tessera::f32_to_bf16(scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f));
      }
    };
    fill(x, 1.0f);
    fill(w, 0.05f);
    fill(dy, 0.01f);
  }
};

double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The median call's process CPU seconds (all threads; with OMP_WAIT_POLICY=passive the work,
// not the waits: a fair measure while other processes share the cores), call i on copy
// i % copies.
template <typename Call>
double median_seconds(Call call, int copies, int reps) {
  for (int i = 0; i < copies; ++i) call(i);
  std::vector<double> t;
  for (int r = 0; r < reps * copies; ++r) {
    const double start = process_cpu_seconds();
    call(r % copies);
    t.push_back(process_cpu_seconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// The step's GEMMs that have an AMX kernel (forward with a bias broadcast first, beta = 1;
// weight gradient accumulated) through amx_linear_* and gemm_bf16, cycling through `copies`
// layers' operands so the weights come from memory, as in the step.
void time_amx_against_onednn(int64_t N, int reps, int copies) {
  namespace cpu = tessera::ops::cpu;
  struct Layer {
    const char* name;
    int64_t C, OC;
  };
  const Layer layers[] = {{"qkv ", 768, 2304}, {"proj", 768, 768}, {"fc1 ", 768, 3072}, {"fc2 ", 3072, 768},
                          {"head", 768, 50304}};
  std::printf("AMX kernels (amx_gemm.h) against gemm_bf16, cold, GFLOP per median CPU second of all threads "
              "(max |difference|)\n");
  double total[2] = {0.0, 0.0};
  for (const Layer& l : layers) {
    const int64_t C = l.C, OC = l.OC;
    if (!cpu::amx_linear_fits(N, C, OC)) {
      std::printf("%s: AMX kernels not available here\n", l.name);
      return;
    }
    const int n_copies = OC * C > 20'000'000 ? std::min(copies, 2) : copies;
    std::vector<LayerOperands> pool;
    for (int i = 0; i < n_copies; ++i) pool.emplace_back(N, C, OC, i);
    const double flops = 2.0 * N * C * OC;
    std::printf("%s %5lldx%4lld:", l.name, static_cast<long long>(OC), static_cast<long long>(C));
    double layer[2] = {0.0, 0.0};
    for (const bool dw : {false, true}) {
      std::vector<float> results[2];
      double seconds[2];
      for (int amx = 0; amx < 2; ++amx) {
        auto call = [&](int i) {
          LayerOperands& o = pool[static_cast<size_t>(i)];
          if (!dw) {
            std::fill(o.y.begin(), o.y.end(), 0.5f);
            if (amx) cpu::amx_linear_forward(o.y.data(), OC, o.x.data(), o.w.data(), N, C, OC, true);
            else cpu::gemm_bf16(false, true, N, OC, C, 1.0f, o.x.data(), C, o.w.data(), C, 1.0f, o.y.data(), OC);
          } else {
            std::fill(o.dw.begin(), o.dw.end(), 0.25f);
            if (amx) cpu::amx_linear_dweight(o.dw.data(), o.dy.data(), OC, o.x.data(), N, C, OC, true);
            else cpu::gemm_bf16(true, false, OC, C, N, 1.0f, o.dy.data(), OC, o.x.data(), C, 1.0f, o.dw.data(), C);
          }
        };
        // The fills are part of every call (both ways alike): time them alone and subtract.
        const double fill = median_seconds(
            [&](int i) {
              LayerOperands& o = pool[static_cast<size_t>(i)];
              if (dw) std::fill(o.dw.begin(), o.dw.end(), 0.25f);
              else std::fill(o.y.begin(), o.y.end(), 0.5f);
            },
            n_copies, reps);
        seconds[amx] = median_seconds(call, n_copies, reps) - fill;
        layer[amx] += seconds[amx];
        call(0);
        const LayerOperands& o = pool[0];
        results[amx] = dw ? o.dw : o.y;
      }
      std::printf("  %s oneDNN %5.0f AMX %5.0f (%.1e)", dw ? "dW" : "fwd",
                  flops / seconds[0] / 1e9, flops / seconds[1] / 1e9, max_difference(results[0], results[1]));
    }
    std::printf("  | both: oneDNN %.2f, AMX %.2f CPU ms, %.2fx\n", 1e3 * layer[0], 1e3 * layer[1],
                layer[0] / layer[1]);
    total[0] += layer[0];
    total[1] += layer[1];
  }
  std::printf("all: oneDNN %.2f, AMX %.2f CPU ms, %.2fx\n", 1e3 * total[0], 1e3 * total[1], total[0] / total[1]);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 8;
  const int copies = argc > 2 ? std::max(1, std::atoi(argv[2])) : 12;
  if (argc > 3 && std::string(argv[3]) == "amx") {
    time_amx_against_onednn(256, reps, copies);
    return 0;
  }
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
  time_amx_against_onednn(N, reps, copies);
  return 0;
}
