// Sequence-parallel regrouping between the sequence layout [B,T,C] and the rank-major
// layout (for r = 0..parts-1: the block [B, T/parts, C] of rows [r*T/parts, (r+1)*T/parts)),
// which is what an all-gather / reduce-scatter over `parts` ranks exchanges. Pure copies:
// each (rank, sample) pair moves one contiguous run of T/parts*C elements.
#include <cstring>
#include <string>

#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {
namespace {

void regroup(const Tensor& out, const Tensor& inp, int parts, bool to_rank_major, const char* op) {
  const Tensor& seq = to_rank_major ? inp : out;
  const Tensor& rm = to_rank_major ? out : inp;
  TESSERA_CHECK(seq.ndim() == 3, std::string(op) + ": sequence-layout tensor " + shape_str(seq.shape) +
                                     " is not [B,T,C]");
  const int64_t B = seq.dim(0), T = seq.dim(1), C = seq.dim(2);
  TESSERA_CHECK(parts >= 1 && T % parts == 0,
                std::string(op) + ": " + std::to_string(parts) + " parts do not divide T = " + std::to_string(T));
  TESSERA_CHECK(rm.numel() == seq.numel() && rm.dtype == seq.dtype,
                std::string(op) + ": out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape));
  const char* src = cpu_memory(inp);
  char* dst = cpu_memory(out);
  const size_t bytes = seq.bytes();
  TESSERA_CHECK(bytes == 0 || dst + bytes <= src || src + bytes <= dst, std::string(op) + ": out overlaps inp");
  const int64_t Ts = T / parts;
  const size_t elem = dtype_size(seq.dtype), run = static_cast<size_t>(Ts * C) * elem;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < parts * B; ++i) {
    const int64_t r = i / B, b = i % B;
    const size_t seq_off = static_cast<size_t>((b * T + r * Ts) * C) * elem;
    const size_t rm_off = static_cast<size_t>(i * Ts * C) * elem;  // block (r, b) of [parts, B, Ts, C]
    if (to_rank_major)
      std::memcpy(dst + rm_off, src + seq_off, run);
    else
      std::memcpy(dst + seq_off, src + rm_off, run);
  }
}

}  // namespace

void sequence_to_rank_major(Tensor out, Tensor inp, int parts) {
  regroup(out, inp, parts, true, "sequence_to_rank_major");
}

void rank_major_to_sequence(Tensor out, Tensor inp, int parts) {
  regroup(out, inp, parts, false, "rank_major_to_sequence");
}

}  // namespace tessera::ops::cpu
