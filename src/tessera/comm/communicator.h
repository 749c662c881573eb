// The Communicator: collectives over a group of ranks, the only way ranks exchange tensors.
// Backends: gloo/ (CPU tensors over TCP), in-process (ranks as threads, for unit tests),
// later nccl/ (CUDA). Calls are collective over the group: every member calls them in the
// same order. Asynchronous variants return a Work handle to wait on.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/tensor.h"

namespace tessera {

enum class ReduceOp { Sum, Max };

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;   // rank within this group
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;  // "gloo", "in-process", ...

  virtual void all_reduce(Tensor t, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> all_reduce_async(Tensor t, ReduceOp op) = 0;
  // out: [size * n] gathered in rank order from every rank's in: [n].
  virtual void all_gather(Tensor out, Tensor in) = 0;
  // in: [size * n] reduced; this rank receives its chunk out: [n].
  virtual void reduce_scatter(Tensor out, Tensor in, ReduceOp op) = 0;
  virtual void broadcast(Tensor t, int root) = 0;
  virtual void send(Tensor t, int dst) = 0;
  virtual void recv(Tensor t, int src) = 0;
  virtual void barrier() = 0;
  // A communicator over a subset of this group's ranks (listed in group-rank order).
  // Collective: every rank of this group calls it with the same list of lists (Megatron's
  // group construction), and gets the communicator of the subgroup it belongs to.
  virtual std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups) = 0;
};

}  // namespace tessera
