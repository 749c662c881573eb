// Raw Gloo plumbing under the Gloo transport and RawGlooGroup (internal to comm/gloo): a TCP
// transport device bound to an interface, a full-mesh gloo::Context bootstrapped through our
// Store, and the typed in-place buffer of Gloo's all-reduce.
#pragma once

#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <memory>
#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/comm/net_interface.h"
#include "tessera/comm/store.h"

namespace tessera::gloo_backend {

// gloo::rendezvous::Store over our Store; every key is prefixed with `prefix`.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(tessera::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  tessera::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// A TCP device listening on `iface.ipv4`.
std::shared_ptr<gloo::transport::Device> create_device(const InterfaceChoice& iface);

// Connects rank `rank` of `size` to the others of the group whose keys live under `prefix`.
// Errors name `group` and say what to check.
std::shared_ptr<gloo::Context> connect_context(tessera::Store& store, const std::string& prefix,
                                               const std::string& group, int rank, int size,
                                               std::shared_ptr<gloo::transport::Device> device,
                                               const InterfaceChoice& iface, std::chrono::milliseconds timeout);

// `count` elements of `dtype` at `data` as the all-reduce's input and output, reduced by `op`
// (f32, i32, i64).
void set_all_reduce_data(gloo::AllreduceOptions& opts, void* data, size_t count, DType dtype, ReduceOp op);

}  // namespace tessera::gloo_backend
