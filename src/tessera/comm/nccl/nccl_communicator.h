// The NCCL backend (--distributed-backend nccl with --device cuda): a GroupCommunicator
// (group_communicator.h) over a Gloo transport of the job's store, with NCCL as its device
// transport: collectives and p2p on GPU tensors through NCCL, stream-ordered as
// communicator.h says; host tensors (the log's scalars, the grad-norm slots) and barriers go
// to the Gloo group over the same ranks. Call numbers, argument checks and split's plan are
// GroupCommunicator's, as for every backend; this file is only NCCL's transport.
//
// - Bootstrap: world rank 0 makes the ncclUniqueId, the store carries it to the others
//   (unique_id.h, key "<key_prefix>nccl/world"); subgroups come from ncclCommSplit (each rank
//   passes its list's index as the colour and its place in the list as the key).
// - Ordering: each communicator has its own stream on the rank's GPU. A call records an
//   event on the GPU's default stream, the communication stream waits for it, NCCL runs
//   there, and the default stream then waits for the call's completion event (the
//   synchronous calls at once, the asynchronous ones in Work::wait()): no call blocks the
//   host. send_async/recv_async are held and posted together, inside one
//   ncclGroupStart/ncclGroupEnd, at the first wait() or the next call: Megatron's
//   batch_isend_irecv, so "post everything, then wait" never deadlocks.
// - Hangs: one watchdog thread per process polls every communicator's
//   ncclCommGetAsyncError and its oldest unfinished call. When NCCL reports an error, or a
//   call has not finished after --distributed-timeout-minutes, it prints the group, the
//   call, the peer (for p2p) and NCCL's reason, aborts the communicator (ncclCommAbort) and
//   exits the process with status 1: the GPU work cannot be recovered, and the launcher then
//   stops the other ranks.
//
// The GPU is the one current on the thread that creates the world communicator: open the
// device (--device cuda:N) first.
#pragma once

#include <memory>
#include <string>

#include "tessera/comm/backend.h"

namespace tessera {

// "2.28.3": the NCCL this binary runs with (ncclGetVersion).
std::string nccl_version();

// Doctor's all-reduce run (device/cuda/cuda_doctor.h): one NCCL rank per visible GPU of this
// node (ncclCommInitAll) in this process, an all-reduce of `bytes` of f32 whose exact sum is
// checked on the host. Throws tessera::Error naming the failed call.
struct NcclAllReduceRun {
  int devices = 0;
  double ms = 0;         // the timed all-reduce (after one warm-up)
  double busbw_gbs = 0;  // nccl-tests' bus bandwidth: bytes / time x 2 (n - 1) / n
  int64_t wrong = 0;     // elements that are not the exact sum
};
NcclAllReduceRun nccl_all_reduce_run(size_t bytes);

// NCCL as the CUDA backend's native collectives (device/cuda/cuda_backend.cpp registers it).
const NativeCollectives& nccl_collectives();

std::unique_ptr<Communicator> create_nccl_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                       const CommOptions& options);

}  // namespace tessera
