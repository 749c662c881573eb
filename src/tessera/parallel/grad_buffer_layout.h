// Where every parameter's gradient (and, element for element, its value) sits in a rank's
// flat buffer, as Megatron's _ParamAndGradBuffer lays it out
// (megatron/core/distributed/param_and_grad_buffer.py, core_r0.10.0):
//  - parameters in the reverse of registration order (roughly the order backward produces
//    their gradients), so a bucket fills while backward runs;
//  - buckets of contiguous parameters: a bucket closes after the parameter that brings it to
//    `bucket_size` elements (one bucket when bucket_size is unbounded), and a parameter
//    marked `own_bucket` (the tied embedding shared by the first and last pipeline stage)
//    sits in a bucket of its own;
//  - with the interleaved schedule each model chunk has its own buffer in Megatron, so no
//    bucket spans two chunks, and only the first chunk is split by `bucket_size`: the others
//    are one bucket each (distributed_data_parallel.py passes bucket_size None for model
//    chunks other than the first); tessera places the chunks' buffers one after another;
//  - with the distributed optimizer every parameter starts at a multiple of 64 elements and
//    every bucket ends at a multiple of lcm(DP, 128), so each of the DP ranks owns an equal,
//    contiguous range of every bucket: rank r owns [start + r*n/DP, start + (r+1)*n/DP) of a
//    bucket of n elements, wherever parameter boundaries fall.
//  - under expert parallelism the experts' parameters sit in buffers of their own after the
//    others (Megatron's expert_parallel_buffers, distributed_data_parallel.py), bucketed by the
//    same rules and, with the distributed optimizer, owned over the expert data-parallel group:
//    their buckets end at multiples of lcm(expert DP, 128);
// Without the distributed optimizer Megatron packs densely; tessera starts each parameter at
// a multiple of `dense_alignment` elements instead (64 bytes of f32, the device alignment
// its kernels and sub-buffers expect), which no reduction or ownership depends on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace tessera {

struct GradBufferOptions {
  int data_parallel = 1;
  int expert_data_parallel = 1;  // the expert data-parallel size (the experts' buckets)
  int64_t bucket_size = std::numeric_limits<int64_t>::max();  // elements
  bool distributed_optimizer = false;
  int64_t dense_alignment = 16;  // elements, without the distributed optimizer
};

struct GradBufferLayout {
  struct Param {
    int64_t start = 0, numel = 0;  // elements [start, start + numel) of the buffer
    size_t bucket = 0;
  };
  struct Bucket {
    int64_t start = 0, end = 0;    // [start, end), padded
    int64_t numel_unpadded = 0;    // last parameter's end - start (Megatron's numel_unpadded)
    // The registration indices [first, end) its parameters span; under expert parallelism a
    // bucket holds only those of its kind (Param::bucket says which).
    size_t first_param = 0, end_param = 0;
    bool expert = false;  // the experts' parameters, reduced over the expert data-parallel group
    int64_t numel() const { return end - start; }
  };
  std::vector<Param> params;    // by registration index
  std::vector<Bucket> buckets;  // in buffer order: bucket 0 holds the last-registered parameters
  int64_t numel = 0;            // the buffer's elements, padding included
  int data_parallel = 1;
  int expert_data_parallel = 1;

  // The ranks bucket b is reduced over (data-parallel, or expert data-parallel).
  int group_size(size_t b) const { return buckets[b].expert ? expert_data_parallel : data_parallel; }
  // The range of bucket b that data-parallel rank r owns with the distributed optimizer.
  int64_t owned_begin(size_t b, int r) const { return buckets[b].start + r * (buckets[b].numel() / group_size(b)); }
  int64_t owned_end(size_t b, int r) const { return owned_begin(b, r + 1); }
};

// numels: every parameter's element count in registration order; own_bucket (empty, or one
// flag per parameter): parameters that get a bucket of their own with the distributed
// optimizer; chunks (empty: all 0, or one per parameter, non-decreasing): each parameter's
// model chunk; expert (empty: none, or one flag per parameter): the experts' parameters under
// expert parallelism.
GradBufferLayout build_grad_buffer_layout(const std::vector<int64_t>& numels, const GradBufferOptions& options,
                                          const std::vector<bool>& own_bucket = {},
                                          const std::vector<int>& chunks = {}, const std::vector<bool>& expert = {});

}  // namespace tessera
