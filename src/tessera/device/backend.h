// A backend: everything tessera needs to know about one kind of device, as one registration
// object in the backend's own folder (device/<name>/<name>_backend.cpp): its --device name,
// its device factory, its kernel table (ops/<name>), its native collective library
// (comm/<lib>) and what doctor reports about its platform. Nothing outside that folder names
// a backend: the registry (registry.h) finds them by name, ops/ reaches the kernels of a
// tensor's device through device.backend().kernels, comm/ its collectives.
//
// Registration: each backend's library exports one function, register_<name>_backend(),
// that calls register_backend() with its objects. CMake writes the list of the backends a
// build has into backend_list.cpp (tessera_add_backend in src/tessera/CMakeLists.txt), which
// every executable compiles in (the tessera_backends target), and the registry calls it once
// on first use. An explicit list rather than static constructors, because a linker drops the
// unreferenced objects of a static library, constructors and all.
//
// The kernel table and the collectives are types of the layers above (ops/, comm/): declared
// here, never used here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Device;
namespace ops {
class KernelTable;
}
struct NativeCollectives;  // comm/backend.h

// One row of `tessera doctor` that a backend reports about itself (doctor/ prints it among
// its own rows, with the same meaning: PASS, INFO, WARN, FAIL; a fix for anything not PASS).
struct BackendRow {
  enum class Status { Pass, Info, Warn, Fail };
  std::string check;  // "cuda: driver"
  Status status = Status::Pass;
  std::string detail;
  std::string fix;
};

struct Backend {
  const char* name = "";  // --device's spelling, and its devices' names' prefix ("cuda:0")
  const char* display_name = nullptr;  // in messages ("CUDA"); null: name
  // Listed among the built backends (device_backends(), error hints); the strict test device
  // is not, though --device accepts it.
  bool listed = true;
  // Its memory handles are host addresses: the CPU kernels and the host paths of comm/ may
  // reach them (cpu, strict). Not the same as Device::is_host (strict says no there).
  bool host_memory = false;
  // Runs only the ops a run declared at start-up (ops::check_supported): the strict device.
  bool runs_declared_ops_only = false;
  // How many devices it sees; when none, the platform's reason in *why.
  int (*device_count)(std::string* why) = nullptr;
  // The process-wide device `ordinal` (the registry checks the ordinal first).
  Device& (*open_device)(int ordinal) = nullptr;
  // The ordinal a spec without ":N" opens, given the count; null: 0. (CUDA under a launcher:
  // LOCAL_RANK's GPU, as Megatron's torch.cuda.set_device(local_rank).)
  int (*default_ordinal)(int count) = nullptr;
  // What to do when it is built but sees no device.
  const char* no_device_hint = "";
  // Its doctor rows: the platform (driver, libraries, devices) on every doctor run, and when
  // `device` is given (--device names this backend and it opened) runs on it (a GEMM, its
  // collectives). `requested`: --device names this backend, so a missing piece FAILs rather
  // than INFO. Null: none.
  std::vector<BackendRow> (*doctor_rows)(bool requested, Device* device) = nullptr;
  // Its kernel table (ops/kernel_table.h).
  const ops::KernelTable& (*kernels)() = nullptr;
  // Whether its fused attention (ops flash_attention_*) is also the fast path with attention
  // dropout on. False (CUDA: cuDNN draws its own dropout bits, so a dropped call runs
  // tessera's simple flash kernel): the model runs the unfused attention ops when attention
  // dropout is on (GPTModel::uses_fused_attention).
  bool fused_attention_dropout = true;
  // Its native collective library (comm/backend.h), for --distributed-backend nccl; null:
  // collectives go through Gloo, host-staged for device tensors.
  const NativeCollectives* collectives = nullptr;
};

// Adds `backend` (which must outlive the process: a static object) to the registry; a name
// registered twice is a bug.
void register_backend(const Backend& backend);
// The backend registered under `name`, or nullptr.
const Backend* find_backend(std::string_view name);
// Every registered backend, in registration order.
std::vector<const Backend*> registered_backends();

}  // namespace tessera
