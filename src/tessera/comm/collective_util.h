// Checks, reductions and message text shared by the communicator backends (internal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::comm_detail {

// Reductions take f32, i32 and i64.
void check_reducible(const Tensor& t, const char* op);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);

const char* reduce_op_name(ReduceOp op);
// "all_reduce(sum) of 1024 f32"
std::string call_text(const std::string& op, const Tensor& t);
// "group 'dp' (world ranks 0, 2, 4, 6)"
std::string group_text(const std::string& name, const std::vector<int>& world_ranks);
std::string ranks_text(const std::vector<int>& ranks);

// acc[i] = acc[i] (op) in[i] for n elements of dtype t.
void reduce_into(DType t, ReduceOp op, void* acc, const void* in, size_t n);
// out[i] = a[i] (op) b[i]; out may alias a or b.
void reduce_to(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t n);

// What a point-to-point error says, the same in every backend:
//   what:   "send of 4 f32 to world rank 1"
//   where:  "(message 3 from world rank 0 to world rank 1 on group 'pp' (world ranks 0, 1), this
//            is world rank 0)", message counted from 0 per pair and direction
//   absent: "world rank 1 did not post the matching recv in time"
struct P2PText {
  std::string what, where, absent;
};
P2PText p2p_text(const char* op, const Tensor& t, bool is_send, uint64_t message, const std::string& group,
                 const std::vector<int>& world_ranks, int rank, int peer);
// The hint of a p2p timeout.
extern const char* const kP2PTimeoutHint;

// Checks the lists given to split: ranks in [0, size), none listed twice. Returns the index
// of the list that holds `rank`, or -1.
int find_split_group(const std::vector<std::vector<int>>& groups, int size, int rank);

}  // namespace tessera::comm_detail
