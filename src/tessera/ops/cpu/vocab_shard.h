// Index checks shared by the embedding and the cross-entropy: token, target and position
// ids, and the vocabulary shard [start, start+rows) a tensor-parallel rank holds (see
// vocab_start / vocab_size in ops.h); and the cross-entropy gradient's in-place rule.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

// Indices come from data files and flags, but by the time they reach a kernel they are an
// invariant: an out-of-range id would read or write outside a table (or, for a vocabulary
// shard, silently count as "held by another rank").
inline void check_ids(const int32_t* ids, int64_t n, int64_t limit, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < limit, std::string(what) + " " + std::to_string(ids[i]) + " at " +
                                                     std::to_string(i) + " outside [0, " + std::to_string(limit) +
                                                     ")");
}

// Rows [start, start+rows) of a vocabulary of `total` rows.
struct VocabShard {
  int64_t start = 0, rows = 0, total = 0;
  bool holds(int64_t id) const { return id >= start && id - start < rows; }
};

// vocab_size 0 means unsharded: the shard is the whole vocabulary (vocab_start must be 0).
inline VocabShard vocab_shard(int64_t vocab_start, int64_t rows, int64_t vocab_size, const char* op) {
  const VocabShard s{vocab_start, rows, vocab_size == 0 ? rows : vocab_size};
  TESSERA_CHECK(vocab_size != 0 || vocab_start == 0,
                std::string(op) + ": vocab_start " + std::to_string(vocab_start) +
                    " needs the full vocab_size (0 means unsharded)");
  TESSERA_CHECK(s.start >= 0 && s.rows >= 0 && s.start + s.rows <= s.total,
                std::string(op) + ": vocabulary shard [" + std::to_string(s.start) + ", " +
                    std::to_string(s.start + s.rows) + ") outside [0, " + std::to_string(s.total) + ")");
  return s;
}

// cross_entropy_backward may write dlogits over logits only as a whole (the same memory and
// dtype) and with GradWrite::Assign: accumulating into the logits would be meaningless.
inline void check_in_place(const Tensor& dlogits, const Tensor& logits, GradWrite write) {
  if (!dlogits.same_memory(logits)) return;
  TESSERA_CHECK(write == GradWrite::Assign && dlogits.dtype == logits.dtype,
                "cross_entropy_backward: dlogits is logits (in place) but is accumulated into, or has another "
                "dtype; in place needs GradWrite::Assign and one dtype");
}

}  // namespace tessera::ops::cpu
