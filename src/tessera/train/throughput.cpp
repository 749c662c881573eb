#include "tessera/train/throughput.h"

#include <cstdio>

namespace tessera {

double megatron_flops_per_iteration(const TrainArgs& args, int64_t global_batch) {
  const GPTConfig& m = args.model;
  const double B = static_cast<double>(global_batch), s = m.seq_length, L = m.num_layers,
               H = m.hidden_size;
  // megatron/training/training.py num_floating_point_operations: the K and V projections
  // shrink with query groups (ng/np), SwiGLU's fc1 is twice as wide (1.5x the MLP's GEMMs).
  const double groups = static_cast<double>(m.query_groups()) / m.num_attention_heads;
  const double attn = (1.0 + groups + s / H) * (static_cast<double>(m.kv_channels) * m.num_attention_heads / H);
  // With experts: each token through --moe-router-topk MLPs of --ffn-hidden-size and the shared
  // experts, in every layer (Megatron's formula: active parameters; it ignores
  // --moe-ffn-hidden-size, --moe-layer-freq and the router, and so does this).
  const double gated = m.swiglu ? 1.5 : 1.0;
  const double routed_to = m.moe.enabled() ? m.moe.topk : 1;
  const double mlp = static_cast<double>(m.ffn_hidden_size) / H * routed_to * gated +
                     static_cast<double>(m.moe.shared_expert_size) / H * gated;
  const double logit = static_cast<double>(m.padded_vocab_size) / (2.0 * L * H);
  return 12.0 * B * s * L * H * H * (attn + mlp + logit);
}

std::optional<DevicePeak> device_peak(const std::string& device_name, const TrainArgs& args) {
  char buf[128];
  if (args.peak_tflops_per_device > 0) {
    std::snprintf(buf, sizeof(buf), "--peak-tflops-per-device %g", args.peak_tflops_per_device);
    return DevicePeak{args.peak_tflops_per_device, buf};
  }
  // Vendor dense peaks (no sparsity): tensor-core bf16/fp16, and fp32 without TF32.
  struct Row {
    const char* name;
    double half, fp32;
  };
  static const Row kTable[] = {{"H200", 989, 67}, {"H100", 989, 67}, {"A100", 312, 19.5}, {"L40S", 362, 91.6}};
  for (const Row& r : kTable) {
    if (device_name.find(r.name) == std::string::npos) continue;
    const bool half = args.bf16 || args.fp16;
    const double peak = half ? r.half : r.fp32;
    std::snprintf(buf, sizeof(buf), "%s %s dense %g TFLOP/s", r.name, half ? (args.bf16 ? "bf16" : "fp16") : "fp32",
                  peak);
    return DevicePeak{peak, buf};
  }
  return std::nullopt;
}

}  // namespace tessera
