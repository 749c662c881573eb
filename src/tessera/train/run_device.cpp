#include "tessera/train/run_device.h"

#include <omp.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>

#include "tessera/model/gpt.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"
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
  if (!device.is_host())  // the host's processor and threads are not its figures
    return "device: " + device.name() + ", " + device.description() + ", " + memory;
  return "device: " + device.name() + " (" + cpu_model() + ", " + std::to_string(omp_get_max_threads()) +
         " OpenMP threads per process, " + widest_isa() + ", " + memory + ")";
}

std::vector<ops::OpId> training_ops(const TrainArgs& args, const Device& device) {
  const GPTConfig& c = args.model;
  using namespace ops;
  std::vector<OpId> list;
  auto add = [&list](std::initializer_list<OpId> ids) { list.insert(list.end(), ids); };
  add({init_normal, fill, embedding_forward, embedding_backward, linear_forward, linear_backward, dropout_forward,
       dropout_backward, residual_forward, cross_entropy_max, cross_entropy_sums, cross_entropy_finish,
       cross_entropy_backward, masked_loss_sums, masked_loss_backward, scale_inplace, multi_tensor_sum_squares,
       multi_tensor_sum_squares_workspace, grad_norm_finish});
  if (GPTModel::uses_fused_attention(c, device)) {
    add({flash_attention_forward, flash_attention_backward, flash_attention_scratch});
    if (args.context_parallel_size > 1) add({attention_kv_pack, attention_kv_unpack});  // the ring's messages
  } else {
    add({attention_buffers, attention_forward, attention_backward});
    if (c.regroups_qkv()) add({attention_qkv_forward, attention_qkv_backward});
  }
  if (c.normalization == Normalization::RMSNorm)
    add({rmsnorm_forward, rmsnorm_backward});
  else
    add({layernorm_forward, layernorm_backward});
  if (c.swiglu)
    add({swiglu_forward, swiglu_backward});
  else
    add({gelu_forward, gelu_backward});
  if (c.add_bias_linear || c.add_qkv_bias) add({bias_add_forward, bias_add_backward});
  if (args.bf16 || args.fp16) add({convert});  // f32 main parameters, f32 sums of 16-bit activations
  add({args.optimizer.kind == OptimizerKind::SGD ? OpId(multi_tensor_sgd) : OpId(multi_tensor_adamw)});
  if (args.sequence_parallel) add({sequence_to_rank_major, rank_major_to_sequence});
  if (c.moe.enabled()) {
    add({moe_permute_forward, moe_permute_backward, moe_unpermute_forward, moe_unpermute_backward});
    // The experts' grouped GEMM where the backend has it (else one linear per expert).
    for (OpId op : {OpId(grouped_linear_forward), OpId(grouped_linear_backward)})
      if (ops::supports(device, op)) list.push_back(op);
  }
  std::vector<OpId> fused = {bias_dropout_add_forward, bias_dropout_add_backward};
  if (!c.swiglu) fused.insert(fused.end(), {linear_bias_gelu_forward, linear_bias_gelu_backward});
  for (OpId op : fused)
    if (GPTModel::uses_fused_epilogue(device, op)) list.push_back(op);
  if (GPTModel::uses_cross_entropy_stats(args.tensor_parallel_size, device)) list.push_back(cross_entropy_stats);
  return list;
}

}  // namespace tessera
