// Sums over a group in one canonical order, whatever the backend's algorithm (--deterministic-
// mode's gradient reductions: parallel/data_parallel.h). A ring all-reduce adds each chunk
// starting from a different rank, so its float bits depend on the group's size and on which
// chunk an element falls in; here every element of the result is the same binary tree over the
// group ranks' contributions: sum[lo, hi) = sum[lo, mid) + sum[mid, hi), mid - lo the largest
// power of two below hi - lo ((x0 + x1) + (x2 + x3) for four ranks, (x0 + x1) + x2 for three).
// Its aligned power-of-two blocks are subtrees, so a caller that has already summed each block
// of 2^k consecutive ranks in this order (the experts' gradients of an expert-parallel group:
// model/moe_layer.cpp) and then sums the block sums in this order gets the same bits as the
// sum over every rank.
//
// The collectives are built from send_async/recv_async: each rank receives its chunk from every
// member, adds the pieces on the host in the canonical order, and (all-reduce) sends its sum to
// every member: a reduce-scatter's and an all-gather's bytes, synchronous, through host memory
// (every message a host tensor, which every backend carries; a native library would carry a
// device tensor on another channel); f32 only.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera {

// The canonical order over n pieces as in-place additions: piece[first] += piece[second] in
// turn leaves the sum in piece[0].
std::vector<std::pair<int, int>> canonical_sum_steps(int n);

// The canonical order over pieces that arrive one at a time, with few alive at once: a piece
// is added to the one before it as soon as both sum blocks of the same size (a binary counter),
// and finish() adds what is left from the last to the first, which is the tree above. The
// pieces live in slots; at most slots_for(n) are used.
class CanonicalSumStack {
 public:
  static int slots_for(int n);
  // The slot the next piece goes to.
  int next_slot() const { return static_cast<int>(blocks_.size()); }
  // The piece in next_slot() is ready: the additions (slot[first] += slot[second]) now due.
  std::vector<std::pair<int, int>> push();
  // The additions that leave the sum of every piece pushed in slot 0.
  std::vector<std::pair<int, int>> finish();

 private:
  std::vector<int> blocks_;  // the number of pieces each slot holds the sum of
};

// t (f32) = the sum of every member's t in the canonical order, on every member.
void ordered_all_reduce_sum(Communicator& group, Tensor t);
// in: f32 [size * n]; this rank receives out: [n], chunk rank() of the canonical sum.
void ordered_reduce_scatter_sum(Communicator& group, Tensor out, Tensor in);

}  // namespace tessera
