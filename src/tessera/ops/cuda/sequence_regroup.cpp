// Sequence-parallel regrouping on CUDA: the same contiguous runs as
// ops/cpu/sequence_regroup.cpp, each one device-to-device copy on the default stream.
#include "tessera/device/device.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
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
  const size_t bytes = seq.bytes();
  TESSERA_CHECK(bytes == 0 || out.handle != inp.handle || out.offset + bytes <= inp.offset ||
                    inp.offset + bytes <= out.offset,
                std::string(op) + ": out overlaps inp");
  const int64_t Ts = T / parts;
  const size_t elem = dtype_size(seq.dtype), run = static_cast<size_t>(Ts * C) * elem;
  for (int64_t i = 0; i < parts * B; ++i) {
    const int64_t r = i / B, b = i % B;
    const size_t seq_off = static_cast<size_t>((b * T + r * Ts) * C) * elem;
    const size_t rm_off = static_cast<size_t>(i * Ts * C) * elem;  // block (r, b) of [parts, B, Ts, C]
    const size_t src = inp.offset + (to_rank_major ? seq_off : rm_off);
    const size_t dst = out.offset + (to_rank_major ? rm_off : seq_off);
    out.device->copy(out.handle, dst, inp.handle, src, run);
  }
}

}  // namespace

void sequence_to_rank_major(Tensor out, Tensor inp, int parts) {
  regroup(out, inp, parts, true, "sequence_to_rank_major");
}

void rank_major_to_sequence(Tensor out, Tensor inp, int parts) {
  regroup(out, inp, parts, false, "rank_major_to_sequence");
}

}  // namespace tessera::ops::cuda
