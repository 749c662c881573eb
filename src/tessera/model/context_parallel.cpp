#include "tessera/model/context_parallel.h"

#include <memory>

#include "tessera/core/error.h"
#include "tessera/device/device.h"

namespace tessera {

ops::SequenceRows cp_rows(int64_t seq_length, int cp_size, int cp_rank) {
  if (cp_size == 1) return {};
  const int64_t C = seq_length / (2 * cp_size);
  TESSERA_CHECK(C * 2 * cp_size == seq_length && cp_rank >= 0 && cp_rank < cp_size,
                "cp_rows: sequence " + std::to_string(seq_length) + " over " + std::to_string(cp_size) + " ranks");
  return {C, cp_rank * C, (2 * cp_size - 1 - cp_rank) * C};
}

namespace {

struct Ring {
  Communicator& cp;
  int size, rank, next, prev;
  explicit Ring(Communicator& c)
      : cp(c), size(c.size()), rank(c.rank()), next((c.rank() + 1) % c.size()),
        prev((c.rank() + c.size() - 1) % c.size()) {}
  int source(int step) const { return (rank - step + size) % size; }  // whose block step i holds
  ops::AttentionBlock block(int step, int64_t seq_length, bool merge) const {
    return {seq_length, cp_rows(seq_length, size, rank), cp_rows(seq_length, size, source(step)), merge};
  }
};

// A send to the next rank and a receive from the previous one, both posted at once (a send
// completes only when its receive is posted: Megatron's batch_isend_irecv pairing).
struct Exchange {
  std::unique_ptr<Work> send, recv;
  Exchange(const Ring& ring, Tensor out, Tensor in)
      : send(ring.cp.send_async(out, ring.next)), recv(ring.cp.recv_async(in, ring.prev)) {}
  void wait() {
    send->wait();
    recv->wait();
  }
};

}  // namespace

void ring_attention_forward(Communicator& cp, const RingBuffers& buffers, Tensor out, Tensor lse, Tensor qkv,
                            int64_t num_groups, const ops::Rope& rope, const ops::Dropout& dropout,
                            int64_t seq_length) {
  const Ring ring(cp);
  Tensor kv = qkv;  // the block of step i: this rank's own first
  for (int i = 0; i < ring.size; ++i) {
    std::unique_ptr<Exchange> arriving;
    if (i + 1 < ring.size) arriving = std::make_unique<Exchange>(ring, kv, buffers.kv[(i + 1) % 2]);
    ops::flash_attention_forward(out, lse, qkv, i == 0 ? Tensor() : kv, num_groups, rope, dropout,
                                 ring.block(i, seq_length, i > 0));
    if (arriving) {
      arriving->wait();
      kv = buffers.kv[(i + 1) % 2];
    }
  }
}

void ring_attention_backward(Communicator& cp, const RingBuffers& buffers, Tensor dqkv, Tensor scratch, Tensor dout,
                             Tensor qkv, Tensor out, Tensor lse, int64_t num_groups, const ops::Rope& rope,
                             const ops::Dropout& dropout, int64_t seq_length) {
  const Ring ring(cp);
  Tensor kv = qkv;
  for (int i = 0; i < ring.size; ++i) {
    std::unique_ptr<Exchange> arriving;
    if (i + 1 < ring.size) arriving = std::make_unique<Exchange>(ring, kv, buffers.kv[(i + 1) % 2]);
    if (i == 0) {  // this rank's own block: its keys' gradients go straight into dqkv
      ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, num_groups, rope, dropout,
                                    ring.block(0, seq_length, false));
    } else {
      // The block's dK, dV so far arrived with it (none yet on its first stop).
      const Tensor dkv = buffers.dkv[i % 2];
      if (i == 1) fill_zero(dkv);
      ops::flash_attention_backward(dqkv, dkv, scratch, dout, qkv, kv, out, lse, num_groups, rope, dropout,
                                    ring.block(i, seq_length, false));
      // On to the next rank; after the last step that is the block's owner, and this rank's
      // own block's gradient arrives from the previous one.
      Exchange(ring, dkv, buffers.dkv[(i + 1) % 2]).wait();
    }
    if (arriving) {
      arriving->wait();
      kv = buffers.kv[(i + 1) % 2];
    }
  }
  // Only the k and v columns of a dkv are written (the q columns stay zero).
  if (ring.size > 1) ops::residual_forward(dqkv, dqkv, buffers.dkv[ring.size % 2]);
}

namespace {

// t [B,T,W] as rows of C*W elements: [B*T/C, C*W].
Tensor chunk_rows(const Tensor& t, int64_t C) { return t.view({t.numel() / (C * t.dim(2)), C * t.dim(2)}); }

}  // namespace

void cp_gather_sequence(Communicator& cp, Tensor whole, Tensor staging, Tensor local) {
  const int n = cp.size();
  const int64_t B = local.dim(0), S = whole.dim(1), C = S / (2 * n);
  TESSERA_CHECK(whole.dim(0) == B && whole.dim(2) == local.dim(2) && local.dim(1) * n == S &&
                    staging.numel() == whole.numel() && staging.dtype == local.dtype,
                "cp_gather_sequence: whole " + shape_str(whole.shape) + ", staging " + shape_str(staging.shape) +
                    ", local " + shape_str(local.shape));
  cp.all_gather(staging, local);
  const Tensor from = chunk_rows(staging.view({n * B, S / n, local.dim(2)}), C), to = chunk_rows(whole, C);
  for (int r = 0; r < n; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int half = 0; half < 2; ++half) {
        const int64_t chunk = half == 0 ? r : 2 * n - 1 - r;
        copy_tensor(to.slice_rows(b * 2 * n + chunk, 1), from.slice_rows((r * B + b) * 2 + half, 1));
      }
}

void cp_take_local(Tensor local, Tensor whole, int cp_size, int cp_rank) {
  const int64_t B = local.dim(0), S = whole.dim(1), C = S / (2 * cp_size);
  TESSERA_CHECK(whole.dim(0) == B && whole.dim(2) == local.dim(2) && local.dim(1) * cp_size == S,
                "cp_take_local: local " + shape_str(local.shape) + " of whole " + shape_str(whole.shape));
  const Tensor from = chunk_rows(whole, C), to = chunk_rows(local, C);
  for (int64_t b = 0; b < B; ++b)
    for (int half = 0; half < 2; ++half) {
      const int64_t chunk = half == 0 ? cp_rank : 2 * cp_size - 1 - cp_rank;
      copy_tensor(to.slice_rows(b * 2 + half, 1), from.slice_rows(b * 2 * cp_size + chunk, 1));
    }
}

}  // namespace tessera
