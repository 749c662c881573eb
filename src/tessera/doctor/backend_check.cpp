// The doctor's rows that each built backend reports about itself (Backend::doctor_rows: the
// CUDA backend's driver, libraries, GPUs, GEMM and NCCL rows live in device/cuda), with the
// device --device names opened for the backend it names.
#include "tessera/core/error.h"
#include "tessera/device/backend.h"
#include "tessera/device/registry.h"
#include "tessera/doctor/doctor.h"

namespace tessera::doctor {
namespace {

Status status_of(BackendRow::Status s) {
  switch (s) {
    case BackendRow::Status::Pass: return Status::Pass;
    case BackendRow::Status::Info: return Status::Info;
    case BackendRow::Status::Warn: return Status::Warn;
    case BackendRow::Status::Fail: return Status::Fail;
  }
  return Status::Fail;
}

}  // namespace

std::vector<Row> check_backends(const std::string& spec) {
  std::vector<Row> rows;
  for (const Backend* b : registered_backends()) {
    if (b->doctor_rows == nullptr) continue;
    const std::string name = b->name;
    const bool requested = spec == name || spec.rfind(name + ":", 0) == 0;
    Device* device = nullptr;
    if (requested) {
      try {
        device = &open_device(spec);  // the device check_compute_device opened
      } catch (const Error&) {
        // its row says why; the platform rows still say what is there
      }
    }
    for (const BackendRow& r : b->doctor_rows(requested, device))
      rows.push_back({r.check, status_of(r.status), r.detail, r.fix, ""});
  }
  return rows;
}

}  // namespace tessera::doctor
