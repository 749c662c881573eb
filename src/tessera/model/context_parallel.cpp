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
// completes only when its receive is posted: Megatron's batch_isend_irecv pairing); nothing
// when both are empty.
struct Exchange {
  std::unique_ptr<Work> send, recv;
  Exchange(const Ring& ring, const Tensor& out, const Tensor& in) {
    if (out.empty()) return;
    send = ring.cp.send_async(out, ring.next);
    recv = ring.cp.recv_async(in, ring.prev);
  }
  void wait() {
    if (send) send->wait(), recv->wait();
  }
};

// A message (RingBuffers::message, [2,B,T,KVW]) as its halves: the keys and values of a
// block, then the gradient of a block's keys and values.
struct Message {
  Tensor whole;
  Tensor kv() const { return whole.slice_rows(0, 1).view(half_shape()); }
  Tensor dkv() const { return whole.slice_rows(1, 1).view(half_shape()); }
  // Halves [first, end) as one tensor (empty when none): what one step sends.
  Tensor halves(int first, int end) const { return first < end ? whole.slice_rows(first, end - first) : Tensor(); }
  Shape half_shape() const { return {whole.dim(1), whole.dim(2), whole.dim(3)}; }
};

// After backward step i >= 1: the dK, dV of its block so far into the message that carries
// them on (`arriving`, sent at step i+1, or home after the last step): this rank's share from
// the qkv-layout dkv, plus from step 2 on the earlier visitors' sum, which arrived with the
// next block. sent's dK, dV half has left by then, so it holds the share meanwhile.
void carry_block_gradient(int step, const Message& sent, const Message& arriving, const Tensor& dkv,
                          int64_t num_groups) {
  if (step == 1) return ops::attention_kv_pack(arriving.dkv(), dkv, num_groups);
  ops::attention_kv_pack(sent.dkv(), dkv, num_groups);
  ops::residual_forward(arriving.dkv(), arriving.dkv(), sent.dkv());
}

}  // namespace

void ring_attention_forward(Communicator& cp, const RingBuffers& buffers, Tensor out, Tensor lse, Tensor qkv,
                            int64_t num_groups, const ops::Rope& rope, const ops::Dropout& dropout,
                            int64_t seq_length) {
  const Ring ring(cp);
  const Message message[2] = {{buffers.message[0]}, {buffers.message[1]}};
  if (ring.size > 1) ops::attention_kv_pack(message[0].kv(), qkv, num_groups);
  for (int i = 0; i < ring.size; ++i) {
    // The block of step i+1 arrives while this one is computed.
    const Message &sent = message[i % 2], &arriving = message[(i + 1) % 2];
    const bool more = i + 1 < ring.size;
    Exchange exchange(ring, more ? sent.kv() : Tensor(), more ? arriving.kv() : Tensor());
    ops::flash_attention_forward(out, lse, qkv, i == 0 ? Tensor() : buffers.kv, num_groups, rope, dropout,
                                 ring.block(i, seq_length, i > 0));
    exchange.wait();
    if (more) ops::attention_kv_unpack(buffers.kv, arriving.kv(), num_groups, ops::GradWrite::Assign);
  }
}

// Step i of the backward computes block src(i) and sends on the halves [first, end) of its
// message: the block's keys and values while a step follows, and from step 2 on the dK, dV of
// the block of step i−1 (the one the next rank computes now), which this rank completed.
void ring_attention_backward(Communicator& cp, const RingBuffers& buffers, Tensor dqkv, Tensor scratch, Tensor dout,
                             Tensor qkv, Tensor out, Tensor lse, int64_t num_groups, const ops::Rope& rope,
                             const ops::Dropout& dropout, int64_t seq_length) {
  const Ring ring(cp);
  const Message message[2] = {{buffers.message[0]}, {buffers.message[1]}};
  const int n = ring.size;
  if (n > 1) ops::attention_kv_pack(message[0].kv(), qkv, num_groups);
  for (int i = 0; i < n; ++i) {
    const Message &sent = message[i % 2], &arriving = message[(i + 1) % 2];
    const int first = i + 1 < n ? 0 : 1, end = i >= 2 ? 2 : 1;
    Exchange exchange(ring, sent.halves(first, end), arriving.halves(first, end));
    if (i == 0) {  // this rank's own block: its keys' gradients go straight into dqkv
      ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, num_groups, rope, dropout,
                                    ring.block(0, seq_length, false));
      exchange.wait();
      if (n > 1) ops::attention_kv_unpack(buffers.kv, arriving.kv(), num_groups, ops::GradWrite::Assign);
      continue;
    }
    fill_zero(buffers.dkv);
    ops::flash_attention_backward(dqkv, buffers.dkv, scratch, dout, qkv, buffers.kv, out, lse, num_groups, rope,
                                  dropout, ring.block(i, seq_length, false));
    exchange.wait();
    carry_block_gradient(i, sent, arriving, buffers.dkv, num_groups);
    if (i + 1 < n) ops::attention_kv_unpack(buffers.kv, arriving.kv(), num_groups, ops::GradWrite::Assign);
  }
  if (n == 1) return;
  // The last block's dK, dV go to its owner, the next rank; this rank's own come from the previous.
  const Message &done = message[n % 2], &home = message[(n + 1) % 2];
  Exchange(ring, done.dkv(), home.dkv()).wait();
  ops::attention_kv_unpack(dqkv, home.dkv(), num_groups, ops::GradWrite::Accumulate);
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
