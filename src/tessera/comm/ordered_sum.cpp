#include "tessera/comm/ordered_sum.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "tessera/comm/all_to_all.h"
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

// The collectives move host memory only: a native device library carries device tensors and
// host tensors over different channels, so both ends of every message must be of one kind.
std::vector<float> read_to_host(const Tensor& src) {
  std::vector<float> out(static_cast<size_t>(src.numel()));
  if (src.device) copy_to_host(out.data(), src.bytes(), src);
  else std::memcpy(out.data(), src.host<char>(), src.bytes());
  return out;
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
// rank() from every member (all_to_all_v) and returns their canonical sum.
std::vector<float> sum_my_chunk(Communicator& group, std::vector<float>& in, const std::vector<int64_t>& bounds) {
  const int n = group.size(), me = group.rank();
  const int64_t len = bounds[me + 1] - bounds[me];
  std::vector<int64_t> send(n), recv(n, len);
  for (int c = 0; c < n; ++c) send[c] = bounds[c + 1] - bounds[c];
  std::vector<float> pieces(static_cast<size_t>(len) * n);
  all_to_all_v(group, host_floats(pieces, 0, pieces.size()), recv, host_floats(in, 0, in.size()), send);
  for (const auto& [into, from] : canonical_sum_steps(n))
    comm_detail::reduce_into(DType::F32, ReduceOp::Sum, pieces.data() + len * into, pieces.data() + len * from,
                             static_cast<size_t>(len));
  pieces.resize(static_cast<size_t>(len));
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

int CanonicalSumStack::slots_for(int n) {
  int slots = 1;
  while ((1 << slots) <= n) ++slots;  // bit_width(n): a binary counter's digits, plus the new piece
  return slots;
}

std::vector<std::pair<int, int>> CanonicalSumStack::push() {
  std::vector<std::pair<int, int>> steps;
  blocks_.push_back(1);
  for (size_t n = blocks_.size(); n >= 2 && blocks_[n - 1] == blocks_[n - 2]; --n) {
    steps.emplace_back(static_cast<int>(n - 2), static_cast<int>(n - 1));
    blocks_[n - 2] *= 2;
    blocks_.pop_back();
  }
  return steps;
}

std::vector<std::pair<int, int>> CanonicalSumStack::finish() {
  std::vector<std::pair<int, int>> steps;
  for (size_t n = blocks_.size(); n >= 2; --n) steps.emplace_back(static_cast<int>(n - 2), static_cast<int>(n - 1));
  blocks_.clear();
  return steps;
}

void ordered_all_reduce_sum(Communicator& group, Tensor t) {
  check_f32(t, "ordered_all_reduce_sum");
  const int n = group.size(), me = group.rank();
  if (n == 1) return;
  const int64_t numel = t.numel();
  std::vector<int64_t> bounds(n + 1);
  for (int c = 0; c <= n; ++c) bounds[c] = numel * c / n;
  std::vector<float> all = read_to_host(t);
  const std::vector<float> sum = sum_my_chunk(group, all, bounds);
  std::copy(sum.begin(), sum.end(), all.begin() + bounds[me]);
  // The all-gather of the summed chunks (of unequal sizes when size does not divide numel).
  std::vector<std::unique_ptr<Work>> work;
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && bounds[peer + 1] > bounds[peer])
      work.push_back(group.recv_async(host_floats(all, bounds[peer], bounds[peer + 1] - bounds[peer]), peer));
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && !sum.empty()) work.push_back(group.send_async(host_floats(all, bounds[me], sum.size()), peer));
  wait_all(work);
  write_from_host(t, all.data());
}

void ordered_reduce_scatter_sum(Communicator& group, Tensor out, Tensor in) {
  check_f32(out, "ordered_reduce_scatter_sum");
  check_f32(in, "ordered_reduce_scatter_sum");
  const int n = group.size();
  const int64_t len = out.numel();
  TESSERA_CHECK(in.numel() == len * n, "ordered_reduce_scatter_sum: in holds one chunk of out's size per rank");
  if (n == 1) {
    if (out.device) copy_tensor(out, flat_range(in, 0, len));
    else std::memcpy(out.host<char>(), in.host<char>(), out.bytes());
    return;
  }
  std::vector<int64_t> bounds(n + 1);
  for (int c = 0; c <= n; ++c) bounds[c] = len * c;
  std::vector<float> all = read_to_host(in);
  write_from_host(out, sum_my_chunk(group, all, bounds).data());
}

}  // namespace tessera
