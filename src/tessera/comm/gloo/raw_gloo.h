// Gloo's own collectives on a context of their own, with none of tessera's communicator
// around them: `tessera bench comm` times them next to the same calls through the
// Communicator, so the ratio shows what tessera's layer costs. Host tensors only.
#pragma once

#include <memory>
#include <string>

#include "tessera/comm/gloo/gloo_communicator.h"

namespace tessera {

class RawGlooGroup {
 public:
  // Connects rank `rank` of `size` through keys under `prefix` in the store.
  RawGlooGroup(Store& store, const std::string& prefix, int rank, int size, const GlooOptions& options);
  ~RawGlooGroup();

  void all_reduce(Tensor t, ReduceOp op);
  void all_gather(Tensor out, Tensor in);
  void broadcast(Tensor t, int root);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
