// Context parallelism (Megatron's --context-parallel-size with --cp-comm-type p2p): every
// micro-batch's sequence split over the CP ranks, attention over the whole sequence by a ring.
//
// The split (megatron/training/utils.py get_batch_on_this_cp_rank): the sequence of S tokens
// in 2·CP chunks of C = S/(2·CP); rank r keeps chunks r and 2·CP−1−r, in that order, as its
// S/CP rows, so every rank has the same share of the causal attention work. Each row keeps its
// token's true position (RoPE, learned positions, the causal mask, dropout's element index).
//
// The ring (Megatron's p2p type: TransformerEngine's AttnFuncWithCPAndKVP2P): step i of CP,
// rank r attends its queries to the keys and values of rank src = r − i (mod CP), which came
// round the ring, merging each block into its output by the log-sum-exp
// (ops::flash_attention_forward with AttentionBlock::merge); the mask follows the true
// positions, so the blocks are diagonal, full or partly empty as the chunks fall. Only keys
// and values travel (ops::attention_kv_pack: NG*2*HD of a row's NG*(R+2)*HD), and the next
// block's send/receive is posted before the current block is computed and waited after it
// (the communicator's send_async/recv_async: Gloo's own threads move the bytes, NCCL its
// stream). The backward runs the same ring; each block's dK, dV gather the contributions of
// the ranks it visits and travel one step behind it, in the same message as the next block's
// keys and values (TransformerEngine's p2p_comm_buffers), so they too move while a block is
// computed; after the last step they go home to the block's owner.
//
// Where the fused attention is not run (--deterministic-mode, a device without it), the
// attention gathers the whole sequence (all-gather over CP), runs the unfused ops on it on
// every rank and keeps its own rows: the same arithmetic as one process, so the same bits,
// at the cost of whole-sequence attention memory and work on every rank.
#pragma once

#include <cstdint>

#include "tessera/comm/communicator.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/ops.h"

namespace tessera {

// Where rank `cp_rank`'s S/CP rows sit in the sequence of S (cp_size 1: all of it).
ops::SequenceRows cp_rows(int64_t seq_length, int cp_size, int cp_rank);

// This rank's rows of a host [B,S] array: local [B,S/CP] = chunks r and 2·CP−1−r of each sample.
template <typename T>
void cp_local_rows(T* local, const T* whole, int64_t B, int64_t seq_length, int cp_size, int cp_rank) {
  const ops::SequenceRows rows = cp_rows(seq_length, cp_size, cp_rank);
  const int64_t Tl = seq_length / cp_size;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t) local[b * Tl + t] = whole[b * seq_length + rows.position(t)];
}

// The ring's buffers. message: two [2,B,T,NG*2*HD] (one being sent while the other arrives),
// each a block's packed keys and values, then a block's packed dK, dV. kv, dkv: [B,T,QKV],
// the qkv layout the fused attention reads keys and values in and writes their gradients in.
struct RingBuffers {
  Tensor message[2];
  Tensor kv, dkv;
};

// out, lse (written) <- attention of qkv's queries over the whole sequence of seq_length
// (ops::flash_attention_forward's contract; qkv holds this rank's rows). cp: the
// context-parallel group, rank i holding cp_rows(.., i).
void ring_attention_forward(Communicator& cp, const RingBuffers& ring, Tensor out, Tensor lse, Tensor qkv,
                            int64_t num_groups, const ops::Rope& rope, const ops::Dropout& dropout,
                            int64_t seq_length);
// dqkv += the gradient through it (flash_attention_backward's contract over the whole sequence):
// this rank's queries' part and every rank's contributions to its keys and values.
void ring_attention_backward(Communicator& cp, const RingBuffers& ring, Tensor dqkv, Tensor scratch, Tensor dout,
                             Tensor qkv, Tensor out, Tensor lse, int64_t num_groups, const ops::Rope& rope,
                             const ops::Dropout& dropout, int64_t seq_length);

// whole [B,S,W] <- every rank's local [B,S/CP,W] in sequence order (all-gather over cp
// through staging, [CP,B,S/CP,W] of local's dtype).
void cp_gather_sequence(Communicator& cp, Tensor whole, Tensor staging, Tensor local);
// local [B,S/CP,W] <- this rank's rows of whole [B,S,W].
void cp_take_local(Tensor local, Tensor whole, int cp_size, int cp_rank);

}  // namespace tessera
