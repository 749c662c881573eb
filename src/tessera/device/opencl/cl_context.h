// One OpenCL device as tessera uses it: its identity, a context, one in-order command
// queue (so every enqueued command runs after the ones before it, as the CPU's calls do),
// buffers, copies and the cache of built programs and kernels. Programs are built once
// per process and device; a build failure throws with the compiler's build log.
//
// Devices are numbered across all platforms in a stable order: GPUs first, then
// accelerators, then CPUs, each group in the ICD loader's platform order and the
// platform's device order. `opencl:N` is entry N of that list (list_cl_devices).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/device/opencl/cl_check.h"

namespace tessera::opencl {

struct ClDeviceInfo {
  int ordinal = 0;
  cl_platform_id platform = nullptr;
  cl_device_id id = nullptr;
  std::string name, vendor, platform_name, driver_version, device_version;
  std::string type;  // "GPU", "accelerator", "CPU"
  uint64_t global_memory = 0, max_allocation = 0;
  bool fp64 = false;  // cl_khr_fp64: sum_squares accumulates in double
  // "opencl:0 (pthread-haswell-AMD EPYC 7B13)": what errors and logs call the device.
  std::string describe() const;
};

// Every OpenCL device of every platform, numbered as above. Empty when the ICD loader
// finds no platform.
std::vector<ClDeviceInfo> list_cl_devices();

// A built kernel and the lock that guards its arguments: cl_kernel objects hold their
// arguments as state, so setting them and enqueuing must not interleave between threads
// (in-process ranks call ops concurrently).
struct ClKernel {
  cl_kernel kernel = nullptr;
  std::string name;  // for errors: which kernel a failed call was for
  std::mutex lock;
};

class ClContext {
 public:
  explicit ClContext(const ClDeviceInfo& info);
  ~ClContext();
  ClContext(const ClContext&) = delete;
  ClContext& operator=(const ClContext&) = delete;

  const ClDeviceInfo& info() const { return info_; }
  const std::string& where() const { return where_; }
  cl_context context() const { return context_; }
  cl_command_queue queue() const { return queue_; }

  cl_mem create_buffer(size_t bytes);
  void release_buffer(cl_mem mem);
  // Blocking copies between host memory and [offset, offset+bytes) of a buffer.
  void write(cl_mem dst, size_t offset, const void* src, size_t bytes);
  void read(void* dst, cl_mem src, size_t offset, size_t bytes);
  // The same, returning once enqueued: the host memory must stay untouched until finish()
  // or an event recorded after the copy completes.
  void write_async(cl_mem dst, size_t offset, const void* src, size_t bytes);
  void read_async(void* dst, cl_mem src, size_t offset, size_t bytes);
  // Device-to-device copy and zero fill, enqueued (ordered after earlier commands).
  void copy(cl_mem dst, size_t dst_offset, cl_mem src, size_t src_offset, size_t bytes);
  void fill_zero(cl_mem dst, size_t offset, size_t bytes);
  // Waits until every enqueued command has finished.
  void finish();
  // A marker event completing when every command enqueued so far has (the caller releases
  // it with clReleaseEvent), and waiting for one.
  cl_event marker();
  void wait(cl_event event);

  // Host memory the device copies fastest: a CL_MEM_ALLOC_HOST_PTR buffer mapped for the
  // host (page-locked on drivers that pin). unmap_pinned takes the mapped address back.
  void* map_pinned(size_t bytes);
  void unmap_pinned(void* host);

  // The kernel `name` of the program `program`, built from `sources` (concatenated in
  // order) with `options` the first time any kernel of it is asked for.
  ClKernel& kernel(const std::string& program, const char* const* sources, int count, const std::string& options,
                   const std::string& name);

 private:
  cl_program build(const std::string& program, const char* const* sources, int count, const std::string& options);

  ClDeviceInfo info_;
  std::string where_;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::mutex cache_lock_;
  std::map<std::string, cl_program> programs_;
  std::map<std::string, std::unique_ptr<ClKernel>> kernels_;  // key: program + "/" + name
  std::mutex pinned_lock_;
  std::map<void*, cl_mem> pinned_;  // mapped host address -> its buffer
};

// The process-wide context of device `ordinal` (created on first use). Throws naming the
// ordinal and the devices found when there is no such device.
ClContext& cl_context_for(int ordinal);

}  // namespace tessera::opencl
