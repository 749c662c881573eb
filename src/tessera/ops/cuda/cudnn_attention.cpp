#include "tessera/ops/cuda/cudnn_attention.h"

#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "tessera/core/error.h"
#include "tessera/device/cuda/cuda_stream.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/flash_route.h"

namespace tessera::ops::cuda {
namespace {

namespace fe = cudnn_frontend;
using Graph = std::shared_ptr<fe::graph::Graph>;

constexpr const char* kHint =
    "CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr shows cuDNN's view; `tessera doctor --device cuda` "
    "shows the GPU, driver and libraries";

void check(fe::error_t e, const std::string& what) {
  if (!e.is_good()) throw runtime_error("cuDNN " + what + ": " + e.get_message(), kHint);
}

// Why cuDNN could not build a graph, or "" when it did.
std::string refusal(fe::error_t e, const char* step) {
  return e.is_good() ? "" : std::string(step) + ": " + e.get_message();
}

// The tensors' uids in the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// A graph built for one shape, dtype and direction on one GPU, with its workspace; no graph
// when cuDNN refused the shape (the call then runs the shared flash kernel).
struct Plan {
  Graph graph;
  int64_t workspace = 0;
};

using Key = std::tuple<int, bool, int64_t, int64_t, int64_t, int64_t, int64_t, DType>;  // ordinal, backward, B, T, NH, NG, HD

cudnnHandle_t handle_for(const Device& device) {
  static std::mutex lock;
  static auto* handles = new std::map<int, cudnnHandle_t>();  // leaked: outlives the CUDA runtime's teardown
  std::lock_guard<std::mutex> guard(lock);
  auto it = handles->find(device.ordinal());
  if (it != handles->end()) return it->second;
  cudnnHandle_t h = nullptr;
  tessera::cuda::activate(device);  // a handle belongs to the current GPU
  const cudnnStatus_t status = cudnnCreate(&h);
  if (status != CUDNN_STATUS_SUCCESS)
    throw runtime_error(std::string("cudnnCreate failed with ") + cudnnGetErrorString(status) + " on " + device.name(),
                        "the cuDNN 9 library must match the driver: `tessera doctor --device cuda` shows both");
  return handles->emplace(device.ordinal(), h).first->second;
}

// Q, K, V as strided views of the grouped qkv [B,T,NG*(R+2)*HD] (flash_route.h: R == 1 or
// NG == 1, so the query heads have one stride), O and dO as [B,T,NH*HD], Stats as lse.
struct Layout {
  std::vector<int64_t> q_dim, q_stride, kv_dim, kv_stride, o_dim, o_stride, stats_dim, stats_stride;
  int64_t k_col, v_col;  // element offsets of group 0's k and v in a qkv row
  explicit Layout(const cpu::FlashLayout& d) {
    const int64_t W = d.qkv_row(), q_head = d.R == 1 ? (d.R + 2) * d.HD : d.HD;
    q_dim = {d.B, d.NH, d.T, d.HD};
    q_stride = {d.T * W, q_head, W, 1};
    kv_dim = {d.B, d.NG, d.T, d.HD};
    kv_stride = {d.T * W, (d.R + 2) * d.HD, W, 1};
    o_dim = {d.B, d.NH, d.T, d.HD};
    o_stride = {d.T * d.NH * d.HD, d.HD, d.NH * d.HD, 1};
    stats_dim = {d.B, d.NH, d.T, 1};
    stats_stride = {d.NH * d.T, d.T, 1, 1};
    k_col = d.k_col(0);
    v_col = d.v_col(0);
  }
};

std::shared_ptr<fe::graph::Tensor_attributes> input(const Graph& g, const char* name, Uid uid,
                                                    const std::vector<int64_t>& dim,
                                                    const std::vector<int64_t>& stride) {
  return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

Graph new_graph(DType dtype) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float scale_of(const cpu::FlashLayout& d) { return 1.0f / std::sqrt(static_cast<float>(d.HD)); }

Graph forward_graph(const cpu::FlashLayout& d, DType dtype) {
  const Layout l(d);
  Graph g = new_graph(dtype);
  auto Q = input(g, "Q", kQ, l.q_dim, l.q_stride);
  auto K = input(g, "K", kK, l.kv_dim, l.kv_stride);
  auto V = input(g, "V", kV, l.kv_dim, l.kv_stride);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("flash_attention_forward")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(scale_of(d));
  auto [O, stats] = g->sdpa(Q, K, V, options);
  O->set_output(true).set_uid(kO).set_dim(l.o_dim).set_stride(l.o_stride);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(l.stats_dim).set_stride(
      l.stats_stride);
  return g;
}

Graph backward_graph(const cpu::FlashLayout& d, DType dtype) {
  const Layout l(d);
  Graph g = new_graph(dtype);
  auto Q = input(g, "Q", kQ, l.q_dim, l.q_stride);
  auto K = input(g, "K", kK, l.kv_dim, l.kv_stride);
  auto V = input(g, "V", kV, l.kv_dim, l.kv_stride);
  auto O = input(g, "O", kO, l.o_dim, l.o_stride);
  auto dO = input(g, "dO", kDO, l.o_dim, l.o_stride);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("Stats")
                             .set_uid(kStats)
                             .set_dim(l.stats_dim)
                             .set_stride(l.stats_stride)
                             .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("flash_attention_backward")
                     .set_causal_mask(true)
                     .set_attn_scale(scale_of(d))
                     .set_deterministic_algorithm(true);
  auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, options);
  // dq, dk, dv land in a qkv-shaped buffer, laid out as qkv itself.
  dQ->set_output(true).set_uid(kDQ).set_dim(l.q_dim).set_stride(l.q_stride);
  dK->set_output(true).set_uid(kDK).set_dim(l.kv_dim).set_stride(l.kv_stride);
  dV->set_output(true).set_uid(kDV).set_dim(l.kv_dim).set_stride(l.kv_stride);
  return g;
}

// The plan of (device, direction, shape, dtype), built on first use: validate, lower to
// cuDNN's backend graph, heuristics' plans, the first that builds.
const Plan& plan_for(const Device& device, bool backward, const cpu::FlashLayout& d, DType dtype) {
  static std::mutex lock;
  static auto* plans = new std::map<Key, Plan>();  // leaked with the handles
  const Key key{device.ordinal(), backward, d.B, d.T, d.NH, d.NG, d.HD, dtype};
  std::lock_guard<std::mutex> guard(lock);
  auto it = plans->find(key);
  if (it != plans->end()) return it->second;
  const std::string what = std::string(backward ? "flash_attention_backward" : "flash_attention_forward") +
                           " graph for B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) +
                           " heads=" + std::to_string(d.NH) + " groups=" + std::to_string(d.NG) +
                           " head dim=" + std::to_string(d.HD) + " " + std::string(dtype_name(dtype)) + " on " +
                           device.name();
  cudnnHandle_t h = handle_for(device);
  Plan p;
  p.graph = backward ? backward_graph(d, dtype) : forward_graph(d, dtype);
  std::string why = refusal(p.graph->validate(), "validate");
  if (why.empty()) why = refusal(p.graph->build_operation_graph(h), "build_operation_graph");
  if (why.empty()) why = refusal(p.graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  if (why.empty()) why = refusal(p.graph->check_support(h), "check_support");
  if (why.empty()) why = refusal(p.graph->build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  if (why.empty()) why = refusal(p.graph->get_workspace_size(p.workspace), "get_workspace_size");
  if (!why.empty()) {
    // Once per shape: the run goes on, on tessera's own kernel, and says so.
    std::fprintf(stderr, "warning: cuDNN refused the %s (%s); that shape runs tessera's flash kernel\n",
                 what.c_str(), why.c_str());
    p = Plan{};
  }
  return plans->emplace(key, std::move(p)).first->second;
}

// The per-head layout attention_qkv_forward writes: [B,T,NH*3*HD], head h's [q; k; v], i.e.
// the grouped layout with NG = NH groups of one head.
cpu::FlashLayout per_head(const cpu::FlashLayout& d) {
  cpu::FlashLayout h = d;
  h.NG = d.NH;
  h.R = 1;
  return h;
}
bool needs_copy(const cpu::FlashLayout& d, const Rope& rope) {
  return per_head_copy(FlashCall{d.NH, d.NG, d.HD, DType::BF16, rope.dim, 0.0f, true});
}
size_t per_head_bytes(const cpu::FlashLayout& d, DType dtype) {
  return static_cast<size_t>(d.B * d.T * d.NH * 3 * d.HD) * dtype_size(dtype);
}
Tensor per_head_tensor(void* p, const cpu::FlashLayout& d, const Tensor& like) {
  return Tensor(p, 0, like.dtype, {d.B, d.T, d.NH * 3 * d.HD}, like.device);
}

void* at(const Tensor& t, int64_t elements = 0) {
  return static_cast<char*>(t.handle) + t.offset + elements * static_cast<int64_t>(dtype_size(t.dtype));
}

void run(const Plan& p, Device& device, std::unordered_map<int64_t, void*>& pack, void* workspace, const char* op) {
  // The handle takes each call's stream: in-process ranks are threads sharing a GPU's handle.
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  cudnnHandle_t h = handle_for(device);
  tessera::cuda::activate(device);
  const cudnnStatus_t status = cudnnSetStream(h, tessera::cuda::stream_of(device));
  if (status != CUDNN_STATUS_SUCCESS)
    throw runtime_error(std::string("cudnnSetStream failed with ") + cudnnGetErrorString(status), kHint);
  check(p.graph->execute(h, pack, workspace), std::string(op) + " on " + device.name());
}

}  // namespace

bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const cpu::FlashLayout& d,
                             const Rope& rope) {
  Device& device = *qkv.device;
  const bool copy = needs_copy(d, rope);
  const cpu::FlashLayout h = copy ? per_head(d) : d;
  const Plan& p = plan_for(device, false, h, qkv.dtype);
  if (!p.graph) return false;
  Pieces scratch(device, {copy ? per_head_bytes(d, qkv.dtype) : 0, static_cast<size_t>(p.workspace)});
  const Tensor q = copy ? per_head_tensor(scratch[0], d, qkv) : qkv;
  if (copy) cuda::attention_qkv_forward(q, qkv, d.NG, rope);
  const Layout l(h);
  std::unordered_map<int64_t, void*> pack{
      {kQ, at(q)}, {kK, at(q, l.k_col)}, {kV, at(q, l.v_col)}, {kO, at(out)}, {kStats, at(lse)}};
  run(p, device, pack, p.workspace ? scratch[1] : nullptr, "flash_attention_forward");
  return true;
}

bool cudnn_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const cpu::FlashLayout& d, const Rope& rope) {
  Device& device = *qkv.device;
  const bool copy = needs_copy(d, rope);
  const cpu::FlashLayout h = copy ? per_head(d) : d;
  const Plan& p = plan_for(device, true, h, qkv.dtype);
  if (!p.graph) return false;
  const size_t grad_bytes = copy ? per_head_bytes(d, dqkv.dtype) : dqkv.bytes();
  Pieces scratch(device, {copy ? per_head_bytes(d, qkv.dtype) : 0, grad_bytes, static_cast<size_t>(p.workspace)});
  const Tensor q = copy ? per_head_tensor(scratch[0], d, qkv) : qkv;
  if (copy) cuda::attention_qkv_forward(q, qkv, d.NG, rope);  // the forward's rotation again
  const Tensor grad = copy ? per_head_tensor(scratch[1], d, dqkv) : Tensor(scratch[1], 0, dqkv.dtype, dqkv.shape, &device);
  const Layout l(h);
  std::unordered_map<int64_t, void*> pack{{kQ, at(q)},     {kK, at(q, l.k_col)},    {kV, at(q, l.v_col)},
                                          {kO, at(out)},   {kDO, at(dout)},         {kStats, at(lse)},
                                          {kDQ, at(grad)}, {kDK, at(grad, l.k_col)}, {kDV, at(grad, l.v_col)}};
  run(p, device, pack, p.workspace ? scratch[2] : nullptr, "flash_attention_backward");
  // The op accumulates (dqkv += ...): cuDNN's gradient fills every element of its buffer,
  // which one add (or the per-head layout's transpose, rotating back) puts into dqkv.
  if (copy)
    cuda::attention_qkv_backward(dqkv, grad, d.NG, rope);
  else
    cuda::residual_forward(dqkv, dqkv, grad);
  return true;
}

}  // namespace tessera::ops::cuda
