#include "tessera/train/run_device.h"

#include <omp.h>

#include <cstdio>
#include <fstream>

#include "tessera/train/arguments.h"

namespace tessera {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

const char* widest_isa() {
  if (__builtin_cpu_supports("avx512f")) return "AVX-512";
  if (__builtin_cpu_supports("avx2")) return "AVX2";
  if (__builtin_cpu_supports("avx")) return "AVX";
  return "SSE";
}

}  // namespace

std::string run_device_line(const Device& device) {
  char memory[48];
  std::snprintf(memory, sizeof memory, "%.1f GiB memory", device.memory_info().total_bytes / 1073741824.0);
  if (device.kind() != DeviceKind::CPU)  // the host's processor and threads are not its figures
    return "device: " + device.name() + ", " + device.description() + ", " + memory;
  return "device: " + device.name() + " (" + cpu_model() + ", " + std::to_string(omp_get_max_threads()) +
         " OpenMP threads per process, " + widest_isa() + ", " + memory + ")";
}

std::vector<std::string_view> training_ops(const TrainArgs& args) {
  const GPTConfig& c = args.model;
  std::vector<std::string_view> ops = {
      "init_normal",          "fill",                   "embedding_forward", "embedding_backward",
      "linear_forward",       "linear_backward",        "attention_buffers", "attention_forward",
      "attention_backward",   "dropout_forward",        "dropout_backward",  "residual_forward",
      "cross_entropy_max",    "cross_entropy_sums",     "cross_entropy_finish", "cross_entropy_backward",
      "masked_loss_sums",     "masked_loss_backward",   "scale_inplace",     "multi_tensor_sum_squares",
      "multi_tensor_sum_squares_workspace", "grad_norm_finish"};
  if (c.normalization == Normalization::RMSNorm)
    ops.insert(ops.end(), {"rmsnorm_forward", "rmsnorm_backward"});
  else
    ops.insert(ops.end(), {"layernorm_forward", "layernorm_backward"});
  if (c.swiglu)
    ops.insert(ops.end(), {"swiglu_forward", "swiglu_backward"});
  else
    ops.insert(ops.end(), {"gelu_forward", "gelu_backward"});
  if (c.add_bias_linear || c.add_qkv_bias) ops.insert(ops.end(), {"bias_add_forward", "bias_add_backward"});
  if (c.regroups_qkv()) ops.insert(ops.end(), {"attention_qkv_forward", "attention_qkv_backward"});
  if (args.bf16 || args.fp16) ops.push_back("convert");  // f32 main parameters, f32 sums of 16-bit activations
  ops.push_back(args.optimizer.kind == OptimizerKind::SGD ? "multi_tensor_sgd" : "multi_tensor_adamw");
  if (args.sequence_parallel) ops.insert(ops.end(), {"sequence_to_rank_major", "rank_major_to_sequence"});
  return ops;
}

}  // namespace tessera
