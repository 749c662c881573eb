// The bootstrap of a native collective library: one rank of a group makes an opaque id
// (NCCL's ncclGetUniqueId: 128 bytes; HCCL's HcclGetRootInfo: a 4,108-byte root info) that
// every other rank must hold before it can create its communicator (ncclCommInitRank,
// HcclCommInitRootInfo). The job's store carries it, whatever its size, bytes unchanged.
//
//   auto id = share_unique_id(store, prefix + "nccl/world", rank == 0, [] { ...ncclGetUniqueId... },
//                             timeout);
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/comm/store.h"

namespace tessera {

// On the root: make() and publish it under `key`. Elsewhere: wait up to `timeout` for the
// root's id. Every rank returns the same bytes. The error names the key and says that the
// root has not published (it is slower, stuck or failed).
std::vector<uint8_t> share_unique_id(Store& store, const std::string& key, bool is_root,
                                     const std::function<std::vector<uint8_t>()>& make,
                                     std::chrono::milliseconds timeout);

}  // namespace tessera
