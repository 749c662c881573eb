#include "tessera/comm/gloo/raw_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>

#include "tessera/comm/gloo/gloo_context.h"

namespace tessera {

struct RawGlooGroup::Impl {
  std::shared_ptr<gloo::Context> ctx;
  uint32_t tag = 1;  // one per call, equal on every rank
};

RawGlooGroup::RawGlooGroup(Store& store, const std::string& prefix, int rank, int size, const GlooOptions& options)
    : impl_(std::make_unique<Impl>()) {
  const InterfaceChoice iface = gloo_interface(options);
  impl_->ctx = gloo_backend::connect_context(store, prefix, "group 'raw'", rank, size,
                                             gloo_backend::create_device(iface), iface, options.timeout);
}

RawGlooGroup::~RawGlooGroup() = default;

void RawGlooGroup::all_reduce(Tensor t, ReduceOp op) {
  gloo::AllreduceOptions opts(impl_->ctx);
  gloo_backend::set_all_reduce_data(opts, t.host<char>(), static_cast<size_t>(t.numel()), t.dtype, op);
  opts.setTag(impl_->tag++);
  gloo::allreduce(opts);
}

void RawGlooGroup::all_gather(Tensor out, Tensor in) {
  gloo::AllgatherOptions opts(impl_->ctx);
  opts.setInput(in.host<uint8_t>(), in.bytes());
  opts.setOutput(out.host<uint8_t>(), out.bytes());
  opts.setTag(impl_->tag++);
  gloo::allgather(opts);
}

void RawGlooGroup::broadcast(Tensor t, int root) {
  gloo::BroadcastOptions opts(impl_->ctx);
  opts.setOutput(t.host<uint8_t>(), t.bytes());
  opts.setRoot(root);
  opts.setTag(impl_->tag++);
  gloo::broadcast(opts);
}

}  // namespace tessera
