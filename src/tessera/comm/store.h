// The rendezvous store: a TCP key-value store served by the node-0 launcher (or by global
// rank 0 when started by torchrun/Slurm) on MASTER_ADDR:MASTER_PORT. Collective backends
// bootstrap from it; launchers agree on restarts through it. Every connection presents the
// job's token, so a process of another job cannot join by mistake.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until `key` exists (up to the store's timeout), then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer at `key` (created as 0) and returns the result.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; throws tessera::Error after `timeout` naming the keys
  // still missing and the store's address.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

// Serves a store on `port` of every local address, in a background thread, until destroyed.
class TcpStoreServer {
 public:
  TcpStoreServer(int port, std::string job_token);
  ~TcpStoreServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client of a TcpStoreServer. Connecting retries until `timeout`; the error then names
// the address and port and what to check (firewall, address, port, the other side started).
std::unique_ptr<Store> connect_tcp_store(const std::string& host, int port, const std::string& job_token,
                                         std::chrono::milliseconds timeout);

// A store inside this process (thread-safe), for a single process or ranks that are threads.
std::unique_ptr<Store> make_local_store(std::chrono::milliseconds timeout);

// The token a process presents when its launcher passed none; the same rule as
// launch::derived_job_token, so every rank of one job derives the same token:
//   TESSERA_JOB_TOKEN when set and not empty, else
//   "tessera-job:<run id>:<store port>" where the run id is TORCHELASTIC_RUN_ID (torchrun's
//   --rdzv_id), else SLURM_JOB_ID[.SLURM_STEP_ID], else "none"; and the store port is
//   TESSERA_STORE_PORT, else MASTER_PORT + 1 (the port rank 0 serves under torchrun/Slurm),
//   else 0.
// Two jobs with different run ids, or different ports, never accept each other's processes.
std::string default_job_token();

}  // namespace tessera
