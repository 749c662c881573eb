// Routes each op to the kernel table of its tensors' device. Every non-empty tensor of a
// call must live on the same device (an op never copies between devices).
#include <initializer_list>
#include <mutex>
#include <set>
#include <string>

#include "tessera/device/device.h"
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"
#ifdef TESSERA_WITH_OPENCL
#include "tessera/ops/opencl/opencl_ops.h"
#endif
#ifdef TESSERA_WITH_CUDA
#include "tessera/ops/cuda/cuda_ops.h"
#endif

namespace tessera::ops {
namespace {

const Device& device_of(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t->empty()) continue;
    TESSERA_CHECK(t->device != nullptr, std::string(op) + ": tensor without a device");
    if (!first) first = t->device;
    TESSERA_CHECK(t->device == first,
                  std::string(op) + ": tensors on different devices (" + first->name() + ", " + t->device->name() + ")");
  }
  TESSERA_CHECK(first != nullptr, std::string(op) + ": no tensors");
  return *first;
}

[[noreturn]] void unsupported(const char* op, const Device& device) {
  throw runtime_error(std::string("op ") + op + " has no kernel on device " + device.name(),
                      "run on --device cpu, or add the kernel to the " + std::string(device_kind_name(device.kind())) +
                          " backend (docs/backends.md)");
}

// The ops a run declared to the strict device through check_supported. Strict runs only
// those, so a start-up list that misses an op the model calls fails every strict test run
// instead of passing on the CPU and failing on the first backend that lacks the op.
struct StrictDeclared {
  std::mutex mutex;
  std::set<std::string, std::less<>> ops;
};
StrictDeclared& strict_declared() {
  static StrictDeclared declared;
  return declared;
}

void check_declared_on_strict(const char* op, const Device& device) {
  StrictDeclared& d = strict_declared();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.ops.empty() || d.ops.count(std::string_view(op))) return;
  throw runtime_error(std::string("op ") + op + " ran on device " + device.name() +
                          " but the run did not declare it at start-up, so a backend without it would fail "
                          "mid-step instead of before training",
                      "add it to the list the run passes to ops::check_supported (train/run_device.cpp "
                      "training_ops)");
}

// The kernel of `Entry` for the tensors' device.
template <auto Entry>
auto kernel(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device& device = device_of(op, tensors);
  if (device.kind() == DeviceKind::Strict) check_declared_on_strict(op, device);
  auto fn = kernels_for(device).*Entry;
  if (fn == nullptr) unsupported(op, device);
  return fn;
}

}  // namespace

const KernelTable& kernels_for(const Device& device) {
  switch (device.kind()) {
    case DeviceKind::CPU:
    case DeviceKind::Strict: return cpu::kernel_table();
#ifdef TESSERA_WITH_OPENCL
    case DeviceKind::OpenCL: return opencl::kernel_table();
#endif
#ifdef TESSERA_WITH_CUDA
    case DeviceKind::CUDA: return cuda::kernel_table();
#endif
    default: break;
  }
  static const KernelTable none{.backend = "none"};
  return none;
}

bool supports(const Device& device, std::string_view op) {
  const KernelTable& k = kernels_for(device);
#define TESSERA_SUPPORTS(name) \
  if (op == #name) return k.name != nullptr;
  TESSERA_OPS(TESSERA_SUPPORTS)
#undef TESSERA_SUPPORTS
  return false;
}

void check_supported(const Device& device, const std::vector<std::string_view>& ops) {
  for (std::string_view op : ops)
    if (!supports(device, op)) unsupported(std::string(op).c_str(), device);
  if (device.kind() != DeviceKind::Strict) return;
  StrictDeclared& d = strict_declared();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.ops.insert(ops.begin(), ops.end());
}

// One line per op: the tensors that pick the device, then the call.
#define TESSERA_DISPATCH(op, tensors, ...) return kernel<&KernelTable::op>(#op, tensors)(__VA_ARGS__)
#define T_(...) \
  { __VA_ARGS__ }
void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe, int64_t vocab_start,
                       int64_t vocab_size) {
  TESSERA_DISPATCH(embedding_forward, T_(&out, &tokens, &positions, &wte, &wpe), out, tokens, positions, wte, wpe,
                   vocab_start, vocab_size);
}
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions, int64_t vocab_start,
                        int64_t vocab_size) {
  TESSERA_DISPATCH(embedding_backward, T_(&dwte, &dwpe, &dout, &tokens, &positions), dwte, dwpe, dout, tokens,
                   positions, vocab_start, vocab_size);
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias, float eps) {
  TESSERA_DISPATCH(layernorm_forward, T_(&out, &mean, &rstd, &inp, &weight, &bias), out, mean, rstd, inp, weight,
                   bias, eps);
}
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd) {
  TESSERA_DISPATCH(layernorm_backward, T_(&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd), dinp,
                   dweight, dbias, dout, inp, weight, mean, rstd);
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  TESSERA_DISPATCH(rmsnorm_forward, T_(&out, &rstd, &inp, &weight), out, rstd, inp, weight, eps);
}
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  TESSERA_DISPATCH(rmsnorm_backward, T_(&dinp, &dweight, &dout, &inp, &weight, &rstd), dinp, dweight, dout, inp,
                   weight, rstd);
}

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  TESSERA_DISPATCH(linear_forward, T_(&out, &inp, &weight, &bias), out, inp, weight, bias);
}
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) {
  TESSERA_DISPATCH(linear_backward, T_(&dinp, &dweight, &dbias, &dout, &inp, &weight), dinp, dweight, dbias, dout,
                   inp, weight);
}
void bias_add_forward(Tensor out, Tensor inp, Tensor bias) {
  TESSERA_DISPATCH(bias_add_forward, T_(&out, &inp, &bias), out, inp, bias);
}
void bias_add_backward(Tensor dbias, Tensor dout) {
  TESSERA_DISPATCH(bias_add_backward, T_(&dbias, &dout), dbias, dout);
}

void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout) {
  TESSERA_DISPATCH(attention_forward, T_(&out, &att, &qkv), out, att, qkv, dropout);
}
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, const Dropout& dropout) {
  TESSERA_DISPATCH(attention_backward, T_(&dqkv, &scratch, &dout, &qkv, &att), dqkv, scratch, dout, qkv, att,
                   dropout);
}

AttentionBuffers attention_buffers(const Device& device, int64_t B, int64_t NH, int64_t T, DType act_dtype) {
  auto fn = kernels_for(device).attention_buffers;
  if (fn == nullptr) unsupported("attention_buffers", device);
  return fn(device, B, NH, T, act_dtype);
}

void attention_qkv_forward(Tensor out, Tensor qkv, int64_t num_groups, const Rope& rope) {
  TESSERA_DISPATCH(attention_qkv_forward, T_(&out, &qkv), out, qkv, num_groups, rope);
}
void attention_qkv_backward(Tensor dqkv, Tensor dout, int64_t num_groups, const Rope& rope) {
  TESSERA_DISPATCH(attention_qkv_backward, T_(&dqkv, &dout), dqkv, dout, num_groups, rope);
}

void swiglu_forward(Tensor out, Tensor inp) { TESSERA_DISPATCH(swiglu_forward, T_(&out, &inp), out, inp); }
void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  TESSERA_DISPATCH(swiglu_backward, T_(&dinp, &dout, &inp), dinp, dout, inp);
}

void gelu_forward(Tensor out, Tensor inp, GeluKind kind) {
  TESSERA_DISPATCH(gelu_forward, T_(&out, &inp), out, inp, kind);
}
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind) {
  TESSERA_DISPATCH(gelu_backward, T_(&dinp, &dout, &inp), dinp, dout, inp, kind);
}

void dropout_forward(Tensor out, Tensor inp, const Dropout& dropout) {
  TESSERA_DISPATCH(dropout_forward, T_(&out, &inp), out, inp, dropout);
}
void dropout_backward(Tensor dinp, Tensor dout, const Dropout& dropout) {
  TESSERA_DISPATCH(dropout_backward, T_(&dinp, &dout), dinp, dout, dropout);
}

void residual_forward(Tensor out, Tensor a, Tensor b) {
  TESSERA_DISPATCH(residual_forward, T_(&out, &a, &b), out, a, b);
}
void residual_backward(Tensor da, Tensor db, Tensor dout) {
  TESSERA_DISPATCH(residual_backward, T_(&da, &db, &dout), da, db, dout);
}

void cross_entropy_max(Tensor row_max, Tensor logits) {
  TESSERA_DISPATCH(cross_entropy_max, T_(&row_max, &logits), row_max, logits);
}
void cross_entropy_sums(Tensor sum_exp, Tensor target_logit, Tensor logits, Tensor targets, Tensor row_max,
                        int64_t vocab_start, int64_t vocab_size) {
  TESSERA_DISPATCH(cross_entropy_sums, T_(&sum_exp, &target_logit, &logits, &targets, &row_max), sum_exp,
                   target_logit, logits, targets, row_max, vocab_start, vocab_size);
}
void cross_entropy_finish(Tensor losses, Tensor logsumexp, Tensor sum_exp, Tensor row_max, Tensor target_logit) {
  TESSERA_DISPATCH(cross_entropy_finish, T_(&losses, &logsumexp, &sum_exp, &row_max, &target_logit), losses,
                   logsumexp, sum_exp, row_max, target_logit);
}
void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor logsumexp,
                            int64_t vocab_start, int64_t vocab_size) {
  TESSERA_DISPATCH(cross_entropy_backward, T_(&dlogits, &dlosses, &logits, &targets, &logsumexp), dlogits, dlosses,
                   logits, targets, logsumexp, vocab_start, vocab_size);
}

void sequence_to_rank_major(Tensor out, Tensor inp, int parts) {
  TESSERA_DISPATCH(sequence_to_rank_major, T_(&out, &inp), out, inp, parts);
}
void rank_major_to_sequence(Tensor out, Tensor inp, int parts) {
  TESSERA_DISPATCH(rank_major_to_sequence, T_(&out, &inp), out, inp, parts);
}

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step, float grad_scale) {
  TESSERA_DISPATCH(adamw_update, T_(&param, &grad, &m, &v), param, grad, m, v, lr, beta1, beta2, eps, weight_decay,
                   step, grad_scale);
}
void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum, float weight_decay,
                int64_t step, float grad_scale) {
  TESSERA_DISPATCH(sgd_update, T_(&param, &grad, &momentum_buf), param, grad, momentum_buf, lr, momentum,
                   weight_decay, step, grad_scale);
}

void sum_squares(Tensor sums, int64_t slot, Tensor t) {
  TESSERA_DISPATCH(sum_squares, T_(&sums, &t), sums, slot, t);
}
void scale_inplace(Tensor t, float scale) {
  TESSERA_DISPATCH(scale_inplace, T_(&t), t, scale);
}

void multi_tensor_adamw(Tensor main, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor chunks, Tensor scalars,
                        float beta1, float beta2, float eps) {
  TESSERA_DISPATCH(multi_tensor_adamw, T_(&main, &param, &grad, &m, &v, &chunks, &scalars), main, param, grad, m, v,
                   chunks, scalars, beta1, beta2, eps);
}
void multi_tensor_sgd(Tensor main, Tensor param, Tensor grad, Tensor momentum_buf, Tensor chunks, Tensor scalars,
                      float momentum) {
  TESSERA_DISPATCH(multi_tensor_sgd, T_(&main, &param, &grad, &momentum_buf, &chunks, &scalars), main, param, grad,
                   momentum_buf, chunks, scalars, momentum);
}
void multi_tensor_sum_squares(Tensor sums, Tensor workspace, Tensor grad, Tensor chunks) {
  TESSERA_DISPATCH(multi_tensor_sum_squares, T_(&sums, &workspace, &grad, &chunks), sums, workspace, grad, chunks);
}
Shape multi_tensor_sum_squares_workspace(const Device& device, int64_t chunks) {
  auto fn = kernels_for(device).multi_tensor_sum_squares_workspace;
  if (fn == nullptr) unsupported("multi_tensor_sum_squares_workspace", device);
  return fn(device, chunks);
}
void grad_norm_finish(Tensor result, Tensor scalars, Tensor sums, float clip_grad) {
  TESSERA_DISPATCH(grad_norm_finish, T_(&result, &scalars, &sums), result, scalars, sums, clip_grad);
}

void masked_loss_sums(Tensor sums, Tensor losses, Tensor mask) {
  TESSERA_DISPATCH(masked_loss_sums, T_(&sums, &losses, &mask), sums, losses, mask);
}
void masked_loss_backward(Tensor dlosses, Tensor mask, float scale) {
  TESSERA_DISPATCH(masked_loss_backward, T_(&dlosses, &mask), dlosses, mask, scale);
}

void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where) {
  TESSERA_DISPATCH(init_normal, T_(&out), out, std, seed, tensor_id, where);
}
void fill(Tensor out, float value) {
  TESSERA_DISPATCH(fill, T_(&out), out, value);
}
void convert(Tensor out, Tensor inp) {
  TESSERA_DISPATCH(convert, T_(&out, &inp), out, inp);
}

}  // namespace tessera::ops
