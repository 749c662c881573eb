// Routes each op to the kernel table of its tensors' device, and answers what ops.inc
// declares (names, precision classes, which ops a device supports).
#include <mutex>
#include <set>
#include <string>

#include "tessera/device/backend.h"
#include "tessera/device/device.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera::ops {
namespace {

struct OpInfo {
  const char* name;
  Precision precision;
};
constexpr OpInfo kOps[] = {
#define TESSERA_OP(name, precision, signature) {#name, Precision::precision},
#include "tessera/ops/ops.inc"
};
static_assert(std::size(kOps) == kOpCount);

const OpInfo& info(OpId op) { return kOps[static_cast<size_t>(op)]; }

[[noreturn]] void unsupported(const char* op, const Device& device) {
  throw runtime_error(std::string("op ") + op + " has no kernel on device " + device.name(),
                      "run on --device cpu, or add the kernel to the " + std::string(kernels_for(device).backend()) +
                          " backend (docs/backends.md)");
}

// The ops a run declared to the strict device through check_supported. Strict runs only
// those, so a start-up list that misses an op the model calls fails every strict test run
// instead of passing on the CPU and failing on the first backend that lacks the op.
struct StrictDeclared {
  std::mutex mutex;
  std::set<OpId> ops;
};
StrictDeclared& strict_declared() {
  static StrictDeclared declared;
  return declared;
}

void check_declared_on_strict(OpId op, const Device& device) {
  StrictDeclared& d = strict_declared();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.ops.empty() || d.ops.count(op)) return;
  throw runtime_error(std::string("op ") + op_name(op) + " ran on device " + device.name() +
                          " but the run did not declare it at start-up, so a backend without it would fail "
                          "mid-step instead of before training",
                      "add it to the list the run passes to ops::check_supported (train/run_device.cpp "
                      "training_ops)");
}

}  // namespace

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Exact: return "Exact";
    case Precision::OrderFree: return "OrderFree";
    case Precision::Product16: return "Product16";
  }
  return "?";
}

namespace op_detail {

void CallDevice::add(const Tensor& t) {
  if (t.empty()) return;
  TESSERA_CHECK(t.device != nullptr, std::string(op_) + ": tensor without a device");
  add(*t.device);
}

void CallDevice::add(const Device& device) {
  if (!device_) device_ = &device;
  TESSERA_CHECK(&device == device_, std::string(op_) + ": tensors on different devices (" + device_->name() + ", " +
                                        device.name() + ")");
}

const Device& CallDevice::device() const {
  TESSERA_CHECK(device_ != nullptr, std::string(op_) + ": no tensors");
  return *device_;
}

}  // namespace op_detail

AnyKernel resolve_kernel(OpId op, const Device& device) {
  if (device.backend().runs_declared_ops_only) check_declared_on_strict(op, device);
  const AnyKernel kernel = kernels_for(device).get(op);
  if (kernel == nullptr) unsupported(op_name(op), device);
  return kernel;
}

const KernelTable& kernels_for(const Device& device) {
  const Backend& backend = device.backend();
  if (backend.kernels != nullptr) return backend.kernels();
  static const KernelTable none("none", nullptr);
  return none;
}

std::optional<OpId> op_named(std::string_view name) {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (name == kOps[i].name) return static_cast<OpId>(i);
  return std::nullopt;
}

const char* op_name(OpId op) { return info(op).name; }
Precision precision_of(OpId op) { return info(op).precision; }
std::optional<Precision> precision_of(std::string_view name) {
  const std::optional<OpId> op = op_named(name);
  if (!op) return std::nullopt;
  return precision_of(*op);
}

std::vector<OpId> all_ops() {
  std::vector<OpId> ops;
  for (int i = 0; i < kOpCount; ++i) ops.push_back(static_cast<OpId>(i));
  return ops;
}

bool supports(const Device& device, OpId op) { return kernels_for(device).has(op); }
bool supports(const Device& device, std::string_view op) {
  const std::optional<OpId> id = op_named(op);
  return id && supports(device, *id);
}

void check_supported(const Device& device, const std::vector<OpId>& ops) {
  for (OpId op : ops)
    if (!supports(device, op)) unsupported(op_name(op), device);
  if (!device.backend().runs_declared_ops_only) return;
  StrictDeclared& d = strict_declared();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.ops.insert(ops.begin(), ops.end());
}

void check_dropout_iteration(const Dropout& d, const Device& device) {
  if (d.iteration.empty()) return;
  TESSERA_CHECK(d.iteration.dtype == DType::I32 && d.iteration.numel() == 1 && d.iteration.device == &device,
                "dropout: the iteration scalar must be an I32 [1] tensor on " + device.name() + ", got " +
                    std::string(dtype_name(d.iteration.dtype)) + " " + shape_str(d.iteration.shape));
}

}  // namespace tessera::ops
