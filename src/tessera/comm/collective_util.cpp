#include "tessera/comm/collective_util.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::comm_detail {

void check_reducible(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::I32 || t.dtype == DType::I64,
                std::string(op) + ": reductions take f32, i32 or i64, not " + std::string(dtype_name(t.dtype)));
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  TESSERA_CHECK(a.dtype == b.dtype, std::string(op) + ": output is " + std::string(dtype_name(a.dtype)) +
                                        " but input is " + std::string(dtype_name(b.dtype)));
}

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

std::string call_text(const std::string& op, const Tensor& t) {
  return op + " of " + std::to_string(t.numel()) + " " + std::string(dtype_name(t.dtype));
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 16 && ranks.size() > 20) {
      s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
      break;
    }
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return s;
}

std::string group_text(const std::string& name, const std::vector<int>& world_ranks) {
  return "group '" + name + "' (world ranks " + ranks_text(world_ranks) + ")";
}

P2PText p2p_text(const char* op, const Tensor& t, bool is_send, uint64_t message, const std::string& group,
                 const std::vector<int>& world_ranks, int rank, int peer) {
  const std::string me = "world rank " + std::to_string(world_ranks[rank]);
  const std::string other = "world rank " + std::to_string(world_ranks[peer]);
  return P2PText{call_text(op, t) + (is_send ? " to " : " from ") + other,
                 "(message " + std::to_string(message + 1) + " from " + (is_send ? me : other) + " to " +
                     (is_send ? other : me) + " on " + group_text(group, world_ranks) + ", this is " + me + ")",
                 other + " did not post the matching " + (is_send ? "recv" : "send") + " in time"};
}

const char* const kP2PTimeoutHint =
    "the k-th send from one rank to another fills the k-th recv the other posts from it: check that both ranks "
    "post their sends and receives in the same order. A rank that never posts is stuck elsewhere or has failed: "
    "look at its output; raise --distributed-timeout-minutes only if it is merely slow";

namespace {
template <typename T>
void reduce_typed(ReduceOp op, T* acc, const T* in, size_t n) {
  if (op == ReduceOp::Sum) {
    for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + in[i];
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
  }
}
template <typename T>
void reduce_to_typed(ReduceOp op, T* out, const T* a, const T* b, size_t n) {
  if (op == ReduceOp::Sum) {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
  }
}
}  // namespace

void reduce_to(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (t) {
    case DType::F32:
      return reduce_to_typed(op, static_cast<float*>(out), static_cast<const float*>(a), static_cast<const float*>(b), n);
    case DType::I32:
      return reduce_to_typed(op, static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                             static_cast<const int32_t*>(b), n);
    case DType::I64:
      return reduce_to_typed(op, static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                             static_cast<const int64_t*>(b), n);
    default: TESSERA_CHECK(false, "reduce_to: unsupported dtype " + std::string(dtype_name(t)));
  }
}

void reduce_into(DType t, ReduceOp op, void* acc, const void* in, size_t n) {
  switch (t) {
    case DType::F32: return reduce_typed(op, static_cast<float*>(acc), static_cast<const float*>(in), n);
    case DType::I32: return reduce_typed(op, static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n);
    case DType::I64: return reduce_typed(op, static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), n);
    default: TESSERA_CHECK(false, "reduce_into: unsupported dtype " + std::string(dtype_name(t)));
  }
}

int find_split_group(const std::vector<std::vector<int>>& groups, int size, int rank) {
  std::vector<int> seen(size, -1);
  int mine = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    TESSERA_CHECK(!groups[g].empty(), "split: group " + std::to_string(g) + " is empty");
    for (int r : groups[g]) {
      TESSERA_CHECK(r >= 0 && r < size, "split: rank " + std::to_string(r) + " is not in a group of " +
                                            std::to_string(size));
      TESSERA_CHECK(seen[r] < 0, "split: rank " + std::to_string(r) + " is listed in groups " +
                                     std::to_string(seen[r]) + " and " + std::to_string(g));
      seen[r] = static_cast<int>(g);
      if (r == rank) mine = static_cast<int>(g);
    }
  }
  return mine;
}

}  // namespace tessera::comm_detail
