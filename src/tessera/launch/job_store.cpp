#include "tessera/launch/job_store.h"

#include "tessera/core/error.h"

namespace tessera::launch {

JobStore open_job_store(const WorkerIdentity& id, std::chrono::milliseconds timeout) {
  JobStore js;
  if (!id.distributed()) {
    js.store = make_local_store(timeout);
    return js;
  }
  const std::string who = "rank " + std::to_string(id.rank) + " of " + std::to_string(id.world_size) + " (" +
                          launcher_kind_name(id.launcher) + ")";
  try {
    if (id.serve_store) js.server = std::make_unique<TcpStoreServer>(id.store_port, id.job_token);
    js.store = connect_tcp_store(id.serve_store ? "127.0.0.1" : id.store_host, id.store_port, id.job_token, timeout);
  } catch (const Error& e) {
    throw Error(e.kind(), who + ": " + e.what(), e.hint());
  }
  return js;
}

}  // namespace tessera::launch
