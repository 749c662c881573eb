// A worker's way into tessera's rendezvous store, as its WorkerIdentity (worker_env.h)
// describes it: one call for `tessera train` and the tests.
//
//   auto id = launch::from_environment(argc, argv);
//   launch::JobStore js = launch::open_job_store(id, std::chrono::minutes(10));
//   js.store->set(id.key_prefix + "hello/" + std::to_string(id.rank), ...);
//
// A single process (world size 1) gets an in-process store. Under torchrun or Slurm, global
// rank 0 serves the store on store_port (MASTER_PORT + 1 or TESSERA_STORE_PORT) for as long
// as the JobStore lives, so keep it alive until every rank is done with the store. Under
// `tessera launch` the launcher serves it and every rank only connects.
#pragma once

#include <chrono>
#include <memory>

#include "tessera/comm/store.h"
#include "tessera/launch/worker_env.h"

namespace tessera::launch {

struct JobStore {
  std::unique_ptr<TcpStoreServer> server;  // only on the rank that serves it
  std::unique_ptr<Store> store;
};

// Throws tessera::Error when the store cannot be served (port in use) or reached within
// `timeout`, naming this rank and the address.
JobStore open_job_store(const WorkerIdentity& id, std::chrono::milliseconds timeout);

}  // namespace tessera::launch
