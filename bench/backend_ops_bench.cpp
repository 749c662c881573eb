// Where a backend's step time goes: every op of a GPT layer (and the LM head's GEMM and
// cross-entropy) timed on a device and on the CPU backend at one shape, plus the
// host<->device copy bandwidth that a host-staged collective pays twice per call
// (device -> host -> Gloo -> host -> device).
// usage: backend_ops_bench [device] [gpt2-124m|small] [iterations]
//   device: --device's spelling (default opencl:0); gpt2-124m: B=4, T=64, C=768, NH=12,
//   V=50304 (bench/train_step_bench.cpp's shape); small: 6 x 384 wide, T=256, V=8192.
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

struct Shape4 {
  int64_t B, T, C, NH, V;
};

// Buffers of one device, zero-filled then set to small values (values do not change the
// time of any op here).
class Tensors {
 public:
  explicit Tensors(Device& d) : device_(d) {}
  Tensor f32(Shape s, float value = 0.01f) {
    buffers_.emplace_back(device_, static_cast<size_t>(shape_numel(s)) * 4);
    Tensor t = tensor_at(buffers_.back(), 0, DType::F32, s);
    std::vector<float> v(static_cast<size_t>(t.numel()), value);
    copy_from_host(t, v.data(), v.size() * 4);
    return t;
  }
  Tensor ids(Shape s, int32_t limit) {
    buffers_.emplace_back(device_, static_cast<size_t>(shape_numel(s)) * 4);
    Tensor t = tensor_at(buffers_.back(), 0, DType::I32, s);
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 7919) % limit);
    copy_from_host(t, v.data(), v.size() * 4);
    return t;
  }

 private:
  Device& device_;
  std::vector<Buffer> buffers_;
};

struct Timed {
  std::string name;
  std::function<void()> run;
};

// The ops of one transformer layer, forward and backward, and the head, at shape s.
std::vector<Timed> layer_ops(Tensors& m, const Shape4& s) {
  const int64_t N = s.B * s.T, C = s.C, HD = C / s.NH;
  ops::Dropout drop;
  drop.p = 0.1f;
  Tensor x = m.f32({s.B, s.T, C}), y = m.f32({s.B, s.T, C}), mean = m.f32({N}), rstd = m.f32({N});
  Tensor w = m.f32({C}), b = m.f32({C}), wqkv = m.f32({3 * C, C}), bqkv = m.f32({3 * C});
  Tensor qkv = m.f32({s.B, s.T, 3 * C}), att = m.f32({s.B, s.NH, s.T, s.T}), scratch = m.f32({s.B, s.NH, s.T, s.T});
  Tensor w4 = m.f32({4 * C, C}), h4 = m.f32({s.B, s.T, 4 * C}), g4 = m.f32({s.B, s.T, 4 * C});
  Tensor dqkv = m.f32({s.B, s.T, 3 * C}), dwqkv = m.f32({3 * C, C}), dw4 = m.f32({4 * C, C});
  Tensor wte = m.f32({s.V, C}), logits = m.f32({N, s.V}), dlogits = m.f32({N, s.V});
  Tensor tokens = m.ids({s.B, s.T}, static_cast<int32_t>(s.V)), per_row[4] = {m.f32({N}), m.f32({N}), m.f32({N}), m.f32({N})};
  Tensor lse = m.f32({N}, 1.0f), dlosses = m.f32({N});
  Tensor param = m.f32({4 * C * C}), grad = m.f32({4 * C * C}), m1 = m.f32({4 * C * C}), v1 = m.f32({4 * C * C});
  Tensor norm_sums = m.f32({2});  // one double (ops.h: I64 elements holding doubles)
  norm_sums.dtype = DType::I64;
  norm_sums.shape = {1};
  // The Llama family's ops: NH/4 query groups, every channel rotated; SwiGLU on fc1's 4C
  // outputs (F = 2C).
  const int64_t NG = s.NH / 4;
  Tensor qkv_grouped = m.f32({s.B, s.T, NG * (4 + 2) * HD}), h2 = m.f32({s.B, s.T, 2 * C});
  const ops::Rope rope{HD, 10000.0f};
  return {
      {"layernorm fwd", [=] { ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f); }},
      {"layernorm bwd", [=] { ops::layernorm_backward(x, w, b, y, x, w, mean, rstd); }},
      {"rmsnorm fwd", [=] { ops::rmsnorm_forward(y, rstd, x, w, 1e-5f); }},
      {"rmsnorm bwd", [=] { ops::rmsnorm_backward(x, w, y, x, w, rstd); }},
      {"linear qkv fwd", [=] { ops::linear_forward(qkv, y, wqkv, bqkv); }},
      {"linear qkv bwd", [=] { ops::linear_backward(y, dwqkv, bqkv, dqkv, y, wqkv); }},
      {"attention_qkv fwd (GQA, RoPE)", [=] { ops::attention_qkv_forward(qkv, qkv_grouped, NG, rope); }},
      {"attention_qkv bwd (GQA, RoPE)", [=] { ops::attention_qkv_backward(qkv_grouped, qkv, NG, rope); }},
      {"attention fwd (p=0.1)", [=] { ops::attention_forward(y, att, qkv, drop); }},
      {"attention bwd (p=0.1)", [=] { ops::attention_backward(dqkv, scratch, y, qkv, att, drop); }},
      {"linear fc fwd", [=] { ops::linear_forward(h4, y, w4, Tensor()); }},
      {"linear fc bwd", [=] { ops::linear_backward(y, dw4, Tensor(), g4, y, w4); }},
      {"gelu fwd", [=] { ops::gelu_forward(g4, h4, ops::GeluKind::Tanh); }},
      {"gelu bwd", [=] { ops::gelu_backward(h4, g4, h4, ops::GeluKind::Tanh); }},
      {"swiglu fwd", [=] { ops::swiglu_forward(h2, h4); }},
      {"swiglu bwd", [=] { ops::swiglu_backward(h4, h2, h4); }},
      {"dropout fwd+bwd", [=] { ops::dropout_forward(y, x, drop); ops::dropout_backward(x, y, drop); }},
      {"residual fwd+bwd", [=] { ops::residual_forward(y, x, y); ops::residual_backward(x, Tensor(), y); }},
      {"lm head fwd", [=] { ops::linear_forward(logits, y, wte, Tensor()); }},
      {"lm head bwd", [=] { ops::linear_backward(y, wte, Tensor(), dlogits, y, wte); }},
      {"cross-entropy fwd", [=] {
         ops::cross_entropy_max(per_row[0], logits);
         ops::cross_entropy_sums(per_row[1], per_row[2], logits, tokens.view({N}), per_row[0], 0, 0);
         ops::cross_entropy_finish(per_row[3], lse, per_row[1], per_row[0], per_row[2]);
       }},
      {"cross-entropy bwd", [=] { ops::cross_entropy_backward(dlogits, dlosses, logits, tokens.view({N}), lse, 0, 0); }},
      {"adamw (4 C^2)", [=] { ops::adamw_update(param, grad, m1, v1, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f); }},
      {"sum_squares (4 C^2)", [=] { ops::sum_squares(norm_sums, 0, grad); }},
  };
}

double time_ms(Device& d, const std::function<void()>& f, int iterations) {
  f();  // warm-up: builds kernels, selects GEMM kernels
  d.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) f();
  d.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string spec = argc > 1 ? argv[1] : "opencl:0";
  const std::string shape = argc > 2 ? argv[2] : "gpt2-124m";
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 3;
  const Shape4 s = shape == "small" ? Shape4{4, 256, 384, 6, 8192} : Shape4{4, 64, 768, 12, 50304};
  Device& dev = open_device(spec);
  std::printf("%s: %s\nshape %s (B=%lld T=%lld C=%lld NH=%lld V=%lld), %d iterations\n\n", dev.name().c_str(),
              dev.description().c_str(), shape.c_str(), (long long)s.B, (long long)s.T, (long long)s.C,
              (long long)s.NH, (long long)s.V, iterations);
  Tensors on_cpu(cpu_device()), on_dev(dev);
  const std::vector<Timed> cpu_ops = layer_ops(on_cpu, s), dev_ops = layer_ops(on_dev, s);
  std::printf("| op | cpu ms | %s ms | ratio |\n| --- | ---: | ---: | ---: |\n", dev.name().c_str());
  double cpu_total = 0, dev_total = 0;
  for (size_t i = 0; i < cpu_ops.size(); ++i) {
    const double c = time_ms(cpu_device(), cpu_ops[i].run, iterations);
    const double d = time_ms(dev, dev_ops[i].run, iterations);
    cpu_total += c;
    dev_total += d;
    std::printf("| %s | %.2f | %.2f | %.1fx |\n", cpu_ops[i].name.c_str(), c, d, d / c);
  }
  std::printf("| total | %.2f | %.2f | %.1fx |\n\n", cpu_total, dev_total, dev_total / cpu_total);

  // A host-staged collective moves its buffer device -> host and back once each.
  for (size_t mb : {1, 16, 64}) {
    const size_t bytes = mb << 20;
    Tensors t(dev);
    Tensor x = t.f32({static_cast<int64_t>(bytes / 4)});
    std::vector<char> host(bytes);
    const double down = time_ms(dev, [&] { copy_to_host(host.data(), bytes, x); }, iterations);
    const double up = time_ms(dev, [&] { copy_from_host(x, host.data(), bytes); }, iterations);
    std::printf("staging %3zu MiB: device->host %.2f ms (%.1f GB/s), host->device %.2f ms (%.1f GB/s)\n", mb, down,
                bytes / down / 1e6, up, bytes / up / 1e6);
  }
  return 0;
}
