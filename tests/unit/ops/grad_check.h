// The CPU op tests' helpers (ops_test.cpp, llama_ops_test.cpp): tensors on the CPU device
// owned by an Arena, and the finite-difference gradient check of L = sum(out * R) with
// gradient buffers pre-filled with random values (so a kernel that sets instead of
// accumulating fails).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"

namespace tessera::ops_test {

// Owns the buffers of one test; hands out tensors on the CPU device.
class Arena {
 public:
  Tensor f32(Shape s) { return make(DType::F32, std::move(s)); }
  Tensor i32(Shape s) { return make(DType::I32, std::move(s)); }
  Tensor normal(Shape s, uint32_t seed, float std = 1.0f, float mean = 0.0f) {
    Tensor t = f32(std::move(s));
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(mean, std);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(gen);
    return t;
  }
  Tensor uniform(Shape s, uint32_t seed, float lo, float hi) {
    Tensor t = f32(std::move(s));
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(gen);
    return t;
  }
  Tensor ints(Shape s, const std::vector<int32_t>& values) {
    Tensor t = i32(std::move(s));
    EXPECT_EQ(static_cast<size_t>(t.numel()), values.size());
    std::memcpy(t.host<void>(), values.data(), values.size() * sizeof(int32_t));
    return t;
  }
  Tensor copy(const Tensor& src) {
    Tensor t = make(src.dtype, src.shape);
    std::memcpy(t.host<void>(), src.host<void>(), src.bytes());
    return t;
  }

 private:
  Tensor make(DType type, Shape s) {
    Tensor t(nullptr, type, std::move(s), &cpu_device());
    buffers_.emplace_back(cpu_device(), std::max<size_t>(t.bytes(), 1));
    t.handle = buffers_.back().handle();
    return t;
  }
  std::vector<Buffer> buffers_;
};

inline std::vector<float> values(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// L = sum(out * R), accumulated in double so the loss adds no rounding of its own beyond
// the float outputs.
inline double weighted_sum(const Tensor& out, const Tensor& R) {
  double s = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) s += static_cast<double>(out.f32()[i]) * R.f32()[i];
  return s;
}

struct GradReport {
  bool ok = true;
  int64_t checked = 0;
  int64_t worst = -1;
  double worst_excess = -1.0;  // max over elements of |num - ana| - (atol + rtol |num|)
  double num_at_worst = 0.0, ana_at_worst = 0.0;
  double max_abs_num = 0.0;
};

// Central differences of `loss` w.r.t. every element of x, against `analytic`.
inline GradReport compare_gradient(Tensor x, const std::vector<double>& analytic,
                                   const std::function<double()>& loss, float eps, double atol, double rtol) {
  // Thousands of tiny forwards: on one thread, so a busy machine (CTest runs tests in
  // parallel) cannot stall every OpenMP region. The kernels under test ran the analytic
  // backward with the default thread count before this.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  GradReport r;
  float* p = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float orig = p[i];
    const float up = orig + eps, down = orig - eps;
    p[i] = up;
    const double lp = loss();
    p[i] = down;
    const double lm = loss();
    p[i] = orig;
    // Divide by the step actually taken (orig +- eps rounds in float).
    const double num = (lp - lm) / (static_cast<double>(up) - static_cast<double>(down));
    const double excess = std::fabs(num - analytic[static_cast<size_t>(i)]) - (atol + rtol * std::fabs(num));
    r.max_abs_num = std::max(r.max_abs_num, std::fabs(num));
    ++r.checked;
    if (excess > r.worst_excess) {
      r.worst_excess = excess;
      r.worst = i;
      r.num_at_worst = num;
      r.ana_at_worst = analytic[static_cast<size_t>(i)];
    }
  }
  omp_set_num_threads(saved_threads);
  r.ok = r.worst_excess <= 0.0;
  return r;
}

// A gradient buffer pre-filled with random values; analytic() subtracts them again, so a
// backward that overwrites instead of accumulating shows up as an error of -prefill.
struct Grad {
  Tensor t;
  std::vector<float> prefill;
  Grad(Arena& arena, const Tensor& like, uint32_t seed) : t(arena.normal(like.shape, seed)), prefill(values(t)) {}
  std::vector<double> analytic() const {
    std::vector<double> a(prefill.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>(t.f32()[i]) - prefill[i];
    return a;
  }
};

inline void expect_gradient(const char* what, Tensor x, const Grad& g, const std::function<double()>& loss,
                            float eps, double atol, double rtol) {
  GradReport r = compare_gradient(x, g.analytic(), loss, eps, atol, rtol);
  EXPECT_TRUE(r.ok) << what << ": element " << r.worst << " numeric " << r.num_at_worst << " analytic "
                    << r.ana_at_worst << " (exceeds atol " << atol << " + rtol " << rtol << " by "
                    << r.worst_excess << ")";
  // A check on a gradient that is ~0 everywhere would prove nothing.
  EXPECT_GT(r.max_abs_num, 10 * atol) << what << ": gradient too small for the check to mean anything";
}

}  // namespace tessera::ops_test
