#include "tessera/comm/ordered_sum.h"

#include <cstring>
#include <memory>

#include "tessera/comm/collective_util.h"
#include "tessera/core/error.h"
#include "tessera/device/device.h"

namespace tessera {

namespace {

void add_steps(int lo, int hi, std::vector<std::pair<int, int>>& steps) {
  if (hi - lo < 2) return;
  int half = 1;
  while (2 * half < hi - lo) half *= 2;
  add_steps(lo, lo + half, steps);
  add_steps(lo + half, hi, steps);
  steps.emplace_back(lo, lo + half);
}

// Elements [begin, end) of t seen as a flat f32 vector.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t end) {
  return Tensor(t.handle, t.offset + static_cast<size_t>(begin) * sizeof(float), DType::F32, {end - begin}, t.device);
}

Tensor host_floats(std::vector<float>& v, size_t begin, size_t n) {
  return Tensor(v.data() + begin, DType::F32, {static_cast<int64_t>(n)}, nullptr);
}

void read_to_host(float* dst, const Tensor& src) {
  if (src.device) copy_to_host(dst, src.bytes(), src);
  else std::memcpy(dst, src.host<char>(), src.bytes());
}

void write_from_host(const Tensor& dst, const float* src) {
  if (dst.device) copy_from_host(dst, src, dst.bytes());
  else std::memcpy(dst.host<char>(), src, dst.bytes());
}

void wait_all(std::vector<std::unique_ptr<Work>>& work) {
  for (auto& w : work) w->wait();
  work.clear();
}

// Chunk c of the flat input is elements [bounds[c], bounds[c + 1]); this rank receives chunk
// rank() from every member and returns their canonical sum in host memory.
std::vector<float> sum_my_chunk(Communicator& group, const Tensor& in, const std::vector<int64_t>& bounds) {
  const int n = group.size(), me = group.rank();
  const size_t len = static_cast<size_t>(bounds[me + 1] - bounds[me]);
  std::vector<float> pieces(len * n);
  std::vector<std::unique_ptr<Work>> work;
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && len > 0) work.push_back(group.recv_async(host_floats(pieces, len * peer, len), peer));
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && bounds[peer + 1] > bounds[peer])
      work.push_back(group.send_async(flat_range(in, bounds[peer], bounds[peer + 1]), peer));
  read_to_host(pieces.data() + len * me, flat_range(in, bounds[me], bounds[me + 1]));
  wait_all(work);
  for (const auto& [into, from] : canonical_sum_steps(n))
    comm_detail::reduce_into(DType::F32, ReduceOp::Sum, pieces.data() + len * into, pieces.data() + len * from, len);
  pieces.resize(len);
  return pieces;
}

void check_f32(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.dtype == DType::F32, std::string(op) + ": f32 only, got " + std::string(dtype_name(t.dtype)));
}

}  // namespace

std::vector<std::pair<int, int>> canonical_sum_steps(int n) {
  std::vector<std::pair<int, int>> steps;
  add_steps(0, n, steps);
  return steps;
}

void ordered_all_reduce_sum(Communicator& group, Tensor t) {
  check_f32(t, "ordered_all_reduce_sum");
  const int n = group.size(), me = group.rank();
  if (n == 1) return;
  const int64_t numel = t.numel();
  std::vector<int64_t> bounds(n + 1);
  for (int c = 0; c <= n; ++c) bounds[c] = numel * c / n;
  std::vector<float> sum = sum_my_chunk(group, t, bounds);
  // The all-gather of the summed chunks (of unequal sizes when size does not divide numel).
  std::vector<std::unique_ptr<Work>> work;
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && bounds[peer + 1] > bounds[peer])
      work.push_back(group.recv_async(flat_range(t, bounds[peer], bounds[peer + 1]), peer));
  const Tensor mine = flat_range(t, bounds[me], bounds[me + 1]);
  write_from_host(mine, sum.data());
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && !sum.empty()) work.push_back(group.send_async(mine, peer));
  wait_all(work);
}

void ordered_reduce_scatter_sum(Communicator& group, Tensor out, Tensor in) {
  check_f32(out, "ordered_reduce_scatter_sum");
  check_f32(in, "ordered_reduce_scatter_sum");
  const int n = group.size();
  const int64_t len = out.numel();
  TESSERA_CHECK(in.numel() == len * n, "ordered_reduce_scatter_sum: in holds one chunk of out's size per rank");
  std::vector<int64_t> bounds(n + 1);
  for (int c = 0; c <= n; ++c) bounds[c] = len * c;
  write_from_host(out, sum_my_chunk(group, in, bounds).data());
}

}  // namespace tessera
