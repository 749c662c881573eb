// One kernel table per backend: a kernel for each op of ops.inc, stored by the op's number
// and set through the op itself, so a kernel of another signature does not compile. A
// backend reaches it from its devices (device/backend.h); an unset entry means "not
// supported", which check_supported() reports at start-up naming the op and the device.
//
// A backend declares its kernels and fills its table from the one list, so an op's
// signature is written once (ops.inc):
//
//   // ops/<backend>/<backend>_ops.h, in namespace tessera::ops::<backend>:
//   #define TESSERA_OP TESSERA_DECLARE_KERNEL
//   #include "tessera/ops/ops.inc"
//
//   // ops/<backend>/kernel_table.cpp: a kernel for every op the backend has
//   constexpr bool has_kernel(std::string_view op) { return op != "some_fused_op"; }
//   KernelTable table("<backend>", libraries);
//   #define TESSERA_OP TESSERA_SET_KERNEL
//   #include "tessera/ops/ops.inc"
//
// A definition spelled differently from the declaration is another overload, leaving the
// declared kernel undefined: the table's set() then fails to link.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/ops/ops.h"

namespace tessera {
class Device;
}

namespace tessera::ops {

class KernelTable {
 public:
  // `backend` as doctor and the errors name it; `libraries`: the libraries the kernels run on,
  // with versions ("oneDNN 2.6.3"), for doctor.
  KernelTable(const char* backend, std::string (*libraries)()) : backend_(backend), libraries_(libraries) {}

  template <typename Signature> void set(const Op<Signature>& op, Signature* kernel) {
    kernels_[static_cast<size_t>(op.id)] = reinterpret_cast<AnyKernel>(kernel);
  }
  AnyKernel get(OpId op) const { return kernels_[static_cast<size_t>(op)]; }
  bool has(OpId op) const { return get(op) != nullptr; }
  const char* backend() const { return backend_; }
  std::string libraries() const { return libraries_ ? libraries_() : std::string(); }

 private:
  const char* backend_;
  std::string (*libraries_)();
  std::array<AnyKernel, kOpCount> kernels_{};
};

#define TESSERA_DECLARE_KERNEL(name, precision, signature) ::tessera::ops::signatures::name name;
// In a function building a KernelTable `table`, with a constexpr has_kernel(std::string_view)
// in scope: sets the backend's kernel of every op it has. The kernels of the others are never
// named (a discarded statement), so they need no definition.
#define TESSERA_SET_KERNEL(name, precision, signature) \
  if constexpr (has_kernel(#name)) table.set(::tessera::ops::name, name);

// The table of the backend `device` belongs to.
const KernelTable& kernels_for(const Device& device);

// The op named `name` (as in ops.inc), if there is one.
std::optional<OpId> op_named(std::string_view name);
const char* op_name(OpId op);
Precision precision_of(OpId op);
std::optional<Precision> precision_of(std::string_view name);
// Every op, in ops.inc's order.
std::vector<OpId> all_ops();

// Whether `device` has a kernel for `op`; false for unknown names.
bool supports(const Device& device, OpId op);
bool supports(const Device& device, std::string_view op);
template <typename Signature> bool supports(const Device& device, const Op<Signature>& op) {
  return supports(device, op.id);
}
// Throws a runtime Error naming the first of `ops` that `device` lacks, and the device.
// On the strict test device it also declares them: from then on an op outside every list it
// was given fails there, naming the op (the test that the start-up list is complete).
void check_supported(const Device& device, const std::vector<OpId>& ops);

}  // namespace tessera::ops
