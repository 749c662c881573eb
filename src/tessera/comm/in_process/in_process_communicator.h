// The in-process backend: N ranks as threads of one process sharing memory, with the
// Communicator semantics of the Gloo backend, so parallel logic (tensor-parallel layers,
// the pipeline schedule, gradient buckets) is unit-tested without processes or sockets.
//
// Deterministic: reductions add in rank order (((r0 + r1) + r2) + ...), so with inputs whose
// sums are exact (small integers in floats) the results equal Gloo's bit for bit. Collectives
// check that every rank called the same operation (a mismatch is an Error naming both), and
// a rank that does not arrive within the timeout is named in the timeout Error.
//
//   InProcessWorld world(4, std::chrono::seconds(10));
//   std::vector<std::thread> threads;
//   for (int r = 0; r < 4; ++r)
//     threads.emplace_back([&, r] { auto comm = world.communicator(r); ... });
//
// or simply run_in_process_ranks(4, [](Communicator& comm) { ... }).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "tessera/comm/communicator.h"

namespace tessera {

namespace comm_detail {
struct InProcessGroup;
class Transport;
}

class InProcessWorld {
 public:
  explicit InProcessWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~InProcessWorld();
  int size() const;
  // The world communicator of `rank` (group name "world"). Take each rank's once.
  std::unique_ptr<Communicator> communicator(int rank);
  // The same rank's group as a bare host Transport (group_communicator.h), for tests that
  // build a GroupCommunicator with a device transport beside it. Either this or
  // communicator(rank), once per rank.
  std::unique_ptr<comm_detail::Transport> transport(int rank);

 private:
  std::shared_ptr<comm_detail::InProcessGroup> group_;
};

// Runs body(world communicator of rank r) on `size` threads and waits for all of them; then
// rethrows the exception of the lowest rank that threw, if any.
void run_in_process_ranks(int size, const std::function<void(Communicator&)>& body,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace tessera
