// Ops evaluated in double from their f32 inputs: the independent references the op tests
// (ops_test.cpp) and the precision-class test (precision_test.cpp) compare kernels with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/core/rng.h"
#include "tessera/ops/ops.h"

namespace tessera::ops_test {

// The dropout factor of element e of sample b (ops.h's Dropout): 0, or 1/(1-p) where the
// Philox draw (core/rng.h's scalar one) keeps the element.
inline double dropout_factor(const ops::Dropout& d, int64_t b, uint64_t e) {
  if (d.p <= 0) return 1.0;
  e += d.element_offset;
  Philox4x32 r = philox4x32(d.key.seed, static_cast<uint32_t>(RngStream::Dropout),
                            {static_cast<uint32_t>(e / 4), d.sample0 + static_cast<uint32_t>(b), d.key.site,
                             d.key.iteration});
  return uint_to_unit_float(r[e % 4]) >= d.p ? 1.0 / (1.0 - d.p) : 0.0;
}

// Independent attention in double: Megatron's recipe over the full score matrix (scale,
// fill masked scores with -10000, softmax, dropout on the probabilities with the mask
// drawn by core/rng.h's scalar Philox, probs @ v).
inline void attention_reference(const float* x, int64_t B, int64_t T, int64_t NH, int64_t HD,
                                const ops::Dropout& d, std::vector<double>& out, std::vector<double>& att) {
  const int64_t C3 = 3 * NH * HD;
  out.assign(static_cast<size_t>(B * T * NH * HD), 0.0);
  att.assign(static_cast<size_t>(B * NH * T * T), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(static_cast<size_t>(T));
        double mx = -1e300;
        for (int64_t t2 = 0; t2 < T; ++t2) {
          double dot = 0;
          for (int64_t i = 0; i < HD; ++i)
            dot += static_cast<double>(x[(b * T + t) * C3 + h * 3 * HD + i]) * x[(b * T + t2) * C3 + h * 3 * HD + HD + i];
          s[t2] = t2 > t ? -10000.0 : dot / std::sqrt(static_cast<double>(HD));
          mx = std::max(mx, s[t2]);
        }
        double sum = 0;
        for (int64_t t2 = 0; t2 < T; ++t2) sum += std::exp(s[t2] - mx);
        for (int64_t t2 = 0; t2 < T; ++t2) {
          const double p = std::exp(s[t2] - mx) / sum;
          att[static_cast<size_t>(((b * NH + h) * T + t) * T + t2)] = p;
          const double factor = dropout_factor(d, b, static_cast<uint64_t>((h * T + t) * T + t2));
          for (int64_t i = 0; i < HD; ++i)
            out[static_cast<size_t>((b * T + t) * NH * HD + h * HD + i)] +=
                p * factor * x[(b * T + t2) * C3 + h * 3 * HD + 2 * HD + i];
        }
      }
    }
  }
}

// GeLU in double, Megatron's two forms.
inline double gelu_ref(double x, ops::GeluKind kind) {
  if (kind == ops::GeluKind::Tanh) return 0.5 * x * (1 + std::tanh(0.79788456 * x * (1 + 0.044715 * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

// log-softmax in double.
inline std::vector<double> log_softmax_row(const float* x, int64_t V) {
  double mx = -1e300, sum = 0;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(x[v]));
  for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
  std::vector<double> r(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) r[v] = x[v] - mx - std::log(sum);
  return r;
}

}  // namespace tessera::ops_test
