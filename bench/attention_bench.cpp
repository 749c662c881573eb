// The fused attention (flash_attention_*) against the unfused ops (attention_qkv +
// attention_forward/backward, what --deterministic-mode runs) on one device, forward and
// backward, with and without attention dropout, in ms and GFLOP/s of the causal products
// (forward 2, backward 5 [T,T,HD] products per head, half of each masked: 2*T*T*HD resp.
// 5*T*T*HD flops, the convention of FlashAttention's benchmarks; the fused backward's
// recomputed scores are not counted).
// Each time is the wall time and the process's CPU time (all threads: on a shared machine the
// wall time follows the load, the CPU time much less so) of the fastest call.
// usage: attention_bench [device] [B T NH NG HD] [iterations] [--fused-only] [--bf16]   (default:
// cpu 1 1024 12 12 64 3, GPT-2 124M at T=1024; --fused-only skips the slow unfused ops; --bf16:
// qkv, out and their gradients in bf16, as in a --bf16 run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

struct Time {
  double wall_ms = 0, cpu_ms = 0;
};

// Wall and CPU ms of the fastest of `iterations` calls of f after a warm-up call (on a busy
// machine the fastest call is the one least disturbed); nothing when `skip`.
Time time_ms(Device& d, const std::function<void()>& f, int iterations, bool skip = false) {
  if (skip) return {};
  f();
  d.synchronize();
  Time best{1e300, 1e300};
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_ms();
    f();
    d.synchronize();
    best.wall_ms = std::min(best.wall_ms,
                            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    best.cpu_ms = std::min(best.cpu_ms, cpu_ms() - cpu_start);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  bool fused_only = false;
  DType dtype = DType::F32;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fused-only") == 0) fused_only = true;
    else if (std::strcmp(argv[i], "--bf16") == 0) dtype = DType::BF16;
    else args.push_back(argv[i]);
  }
  argc = static_cast<int>(args.size());
  argv = args.data();
  const std::string spec = argc > 1 ? argv[1] : "cpu";
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  const int64_t B = arg(2, 1), T = arg(3, 1024), NH = arg(4, 12), NG = arg(5, NH), HD = arg(6, 64);
  const int iterations = static_cast<int>(arg(7, 3));
  Device& dev = open_device(spec);
  std::vector<Buffer> buffers;
  auto tensor = [&](Shape s, DType type = DType::F32) {
    buffers.emplace_back(dev, static_cast<size_t>(shape_numel(s)) * dtype_size(type));
    Tensor t = tensor_at(buffers.back(), 0, type, s);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
    copy_floats_from_host(t, v.data(), v.size());
    return t;
  };
  const int64_t R = NH / NG;
  const ops::Rope rope{NG == NH ? 0 : HD, 10000.0f, {}};
  Tensor qkv = tensor({B, T, NG * (R + 2) * HD}, dtype), dqkv = tensor(qkv.shape, dtype);
  Tensor out = tensor({B, T, NH * HD}, dtype), dout = tensor(out.shape, dtype), lse = tensor({B, NH, T});
  Tensor scratch = tensor(ops::flash_attention_scratch(dev, B, NH, T));
  const bool regroup = NG != NH;
  Tensor heads = regroup ? tensor({B, T, NH * 3 * HD}, dtype) : qkv,
         d_heads = regroup ? tensor(heads.shape, dtype) : dqkv;
  const ops::AttentionBuffers ab = ops::attention_buffers(dev, B, NH, T, dtype);
  Tensor att = tensor(ab.saved, ab.saved_dtype), att_scratch = tensor(ab.scratch);

  std::printf("%s: B=%lld T=%lld NH=%lld NG=%lld HD=%lld%s, %s, %d iterations\n", dev.name().c_str(), (long long)B,
              (long long)T, (long long)NH, (long long)NG, (long long)HD, regroup ? " (RoPE)" : "", std::string(dtype_name(dtype)).c_str(),
              iterations);
  std::printf("| dropout | pass | fused ms | fused CPU ms | unfused ms | unfused CPU ms | fused GFLOP/s | "
              "unfused GFLOP/s | speed-up |\n");
  std::printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const double fwd_flops = 2.0 * B * NH * T * T * HD, bwd_flops = 2.5 * fwd_flops;
  for (float p : {0.0f, 0.1f}) {
    ops::Dropout drop;
    drop.p = p;
    const Time ff = time_ms(dev, [&] { ops::flash_attention_forward(out, lse, qkv, Tensor(), NG, rope, drop, {}); }, iterations);
    const Time uf = time_ms(
        dev,
        [&] {
          if (regroup) ops::attention_qkv_forward(heads, qkv, NG, rope);
          ops::attention_forward(out, att, heads, drop);
        },
        iterations, fused_only);
    ops::flash_attention_forward(out, lse, qkv, Tensor(), NG, rope, drop, {});
    const Time fb = time_ms(
        dev, [&] { ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, NG, rope, drop, {}); }, iterations);
    if (!fused_only) ops::attention_forward(out, att, heads, drop);
    const Time ub = time_ms(
        dev,
        [&] {
          ops::attention_backward(d_heads, att_scratch, dout, heads, att, drop);
          if (regroup) ops::attention_qkv_backward(dqkv, d_heads, NG, rope);
        },
        iterations, fused_only);
    auto row = [&](const char* pass, Time f, Time u, double flops) {
      if (fused_only) {
        std::printf("| %.1f | %s | %.1f | %.1f | - | - | %.1f | - | - |\n", p, pass, f.wall_ms, f.cpu_ms,
                    flops / f.wall_ms / 1e6);
        return;
      }
      std::printf("| %.1f | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", p, pass, f.wall_ms, f.cpu_ms,
                  u.wall_ms, u.cpu_ms, flops / f.wall_ms / 1e6, flops / u.wall_ms / 1e6, u.wall_ms / f.wall_ms);
    };
    row("forward", ff, uf, fwd_flops);
    row("backward", fb, ub, bwd_flops);
  }
  return 0;
}
