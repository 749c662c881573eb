// all_to_all_v over a group, built from send_async/recv_async (torch's all_to_all_single with
// split sizes, which Megatron's MoE alltoall dispatcher calls): every rank sends a run of rows to
// every rank and receives one from every rank, the runs' sizes known on both sides beforehand.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera {

// in's rows, in runs of send_rows[j] for group rank j (in rank order), go to rank j; out's rows
// receive runs of recv_rows[i] from rank i, in rank order. Collective over the group; the
// counts must agree pairwise (send_rows[j] on rank i == recv_rows[i] on rank j). Runs of zero
// rows send nothing. This rank's own run is copied on its device.
void all_to_all_v(Communicator& group, Tensor out, const std::vector<int64_t>& recv_rows, Tensor in,
                  const std::vector<int64_t>& send_rows);

}  // namespace tessera
