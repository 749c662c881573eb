#include "tessera/device/opencl/cl_context.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::opencl {
namespace {

std::string device_string(cl_device_id id, cl_device_info what) {
  size_t size = 0;
  if (clGetDeviceInfo(id, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  clGetDeviceInfo(id, what, size, s.data(), nullptr);
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string platform_string(cl_platform_id id, cl_platform_info what) {
  size_t size = 0;
  if (clGetPlatformInfo(id, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  clGetPlatformInfo(id, what, size, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T device_value(cl_device_id id, cl_device_info what) {
  T v{};
  clGetDeviceInfo(id, what, sizeof(T), &v, nullptr);
  return v;
}

// GPUs first: on a machine with a GPU, opencl:0 is the device a user means.
int type_rank(cl_device_type t) {
  if (t & CL_DEVICE_TYPE_GPU) return 0;
  if (t & CL_DEVICE_TYPE_ACCELERATOR) return 1;
  return 2;
}

const char* type_name(cl_device_type t) {
  if (t & CL_DEVICE_TYPE_GPU) return "GPU";
  if (t & CL_DEVICE_TYPE_ACCELERATOR) return "accelerator";
  return "CPU";
}

}  // namespace

std::string ClDeviceInfo::describe() const { return "opencl:" + std::to_string(ordinal) + " (" + name + ")"; }

std::vector<ClDeviceInfo> list_cl_devices() {
  cl_uint platforms = 0;
  // No ICD (CL_PLATFORM_NOT_FOUND_KHR) or no platform both mean: no OpenCL devices.
  if (clGetPlatformIDs(0, nullptr, &platforms) != CL_SUCCESS || platforms == 0) return {};
  std::vector<cl_platform_id> ids(platforms);
  TESSERA_CL("the OpenCL platforms", clGetPlatformIDs, platforms, ids.data(), nullptr);
  struct Found {
    int rank;
    ClDeviceInfo info;
  };
  std::vector<Found> found;
  for (cl_platform_id p : ids) {
    cl_uint count = 0;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &count) != CL_SUCCESS || count == 0) continue;
    std::vector<cl_device_id> devices(count);
    TESSERA_CL("platform " + platform_string(p, CL_PLATFORM_NAME), clGetDeviceIDs, p, CL_DEVICE_TYPE_ALL, count,
               devices.data(), nullptr);
    for (cl_device_id d : devices) {
      ClDeviceInfo info;
      info.platform = p;
      info.id = d;
      info.name = device_string(d, CL_DEVICE_NAME);
      info.vendor = device_string(d, CL_DEVICE_VENDOR);
      info.platform_name = platform_string(p, CL_PLATFORM_NAME);
      info.driver_version = device_string(d, CL_DRIVER_VERSION);
      info.device_version = device_string(d, CL_DEVICE_VERSION);
      const auto type = device_value<cl_device_type>(d, CL_DEVICE_TYPE);
      info.type = type_name(type);
      info.global_memory = device_value<cl_ulong>(d, CL_DEVICE_GLOBAL_MEM_SIZE);
      info.max_allocation = device_value<cl_ulong>(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
      info.fp64 = device_string(d, CL_DEVICE_EXTENSIONS).find("cl_khr_fp64") != std::string::npos;
      found.push_back({type_rank(type), std::move(info)});
    }
  }
  std::stable_sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.rank < b.rank; });
  std::vector<ClDeviceInfo> out;
  for (Found& f : found) {
    f.info.ordinal = static_cast<int>(out.size());
    out.push_back(std::move(f.info));
  }
  return out;
}

ClContext::ClContext(const ClDeviceInfo& info) : info_(info), where_(info.describe()) {
  cl_int err = CL_SUCCESS;
  const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(info.platform),
                                         0};
  context_ = clCreateContext(props, 1, &info_.id, nullptr, nullptr, &err);
  if (err != CL_SUCCESS) cl_call_failed("clCreateContext", err, where_);
  // clCreateCommandQueue is deprecated in OpenCL 2.0 but is the 1.2 entry point, which
  // every ICD still exports.
  queue_ = clCreateCommandQueue(context_, info_.id, 0, &err);
  if (err != CL_SUCCESS) cl_call_failed("clCreateCommandQueue", err, where_);
}

ClContext::~ClContext() {
  for (auto& [key, k] : kernels_) clReleaseKernel(k->kernel);
  for (auto& [key, p] : programs_) clReleaseProgram(p);
  if (queue_) clReleaseCommandQueue(queue_);
  if (context_) clReleaseContext(context_);
}

cl_mem ClContext::create_buffer(size_t bytes) {
  cl_int err = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(context_, CL_MEM_READ_WRITE, bytes, nullptr, &err);
  if (err != CL_SUCCESS)
    cl_call_failed(("clCreateBuffer (" + std::to_string(bytes >> 20) + " MiB)").c_str(), err, where_);
  return mem;
}

void ClContext::release_buffer(cl_mem mem) {
  if (mem) clReleaseMemObject(mem);
}

void ClContext::write(cl_mem dst, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  TESSERA_CL(where_, clEnqueueWriteBuffer, queue_, dst, CL_TRUE, offset, bytes, src, 0, nullptr, nullptr);
}

void ClContext::read(void* dst, cl_mem src, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  TESSERA_CL(where_, clEnqueueReadBuffer, queue_, src, CL_TRUE, offset, bytes, dst, 0, nullptr, nullptr);
}

void ClContext::write_async(cl_mem dst, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  TESSERA_CL(where_, clEnqueueWriteBuffer, queue_, dst, CL_FALSE, offset, bytes, src, 0, nullptr, nullptr);
}

void ClContext::read_async(void* dst, cl_mem src, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  TESSERA_CL(where_, clEnqueueReadBuffer, queue_, src, CL_FALSE, offset, bytes, dst, 0, nullptr, nullptr);
}

cl_event ClContext::marker() {
  cl_event event = nullptr;
  TESSERA_CL(where_, clEnqueueMarkerWithWaitList, queue_, 0, nullptr, &event);
  return event;
}

void ClContext::wait(cl_event event) {
  // Commands may still sit in the queue's host-side buffer: flush so the wait can end.
  TESSERA_CL(where_, clFlush, queue_);
  TESSERA_CL(where_, clWaitForEvents, 1, &event);
}

void* ClContext::map_pinned(size_t bytes) {
  cl_int err = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(context_, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, nullptr, &err);
  if (err != CL_SUCCESS) cl_call_failed("clCreateBuffer (pinned host memory)", err, where_);
  void* host = clEnqueueMapBuffer(queue_, mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, nullptr, nullptr,
                                  &err);
  if (err != CL_SUCCESS) {
    clReleaseMemObject(mem);
    cl_call_failed("clEnqueueMapBuffer (pinned host memory)", err, where_);
  }
  std::lock_guard<std::mutex> guard(pinned_lock_);
  pinned_[host] = mem;
  return host;
}

void ClContext::unmap_pinned(void* host) {
  cl_mem mem = nullptr;
  {
    std::lock_guard<std::mutex> guard(pinned_lock_);
    auto it = pinned_.find(host);
    if (it == pinned_.end()) return;
    mem = it->second;
    pinned_.erase(it);
  }
  TESSERA_CL(where_, clEnqueueUnmapMemObject, queue_, mem, host, 0, nullptr, nullptr);
  clReleaseMemObject(mem);  // freed once the unmap has run
}

void ClContext::copy(cl_mem dst, size_t dst_offset, cl_mem src, size_t src_offset, size_t bytes) {
  if (bytes == 0) return;
  TESSERA_CL(where_, clEnqueueCopyBuffer, queue_, src, dst, src_offset, dst_offset, bytes, 0, nullptr, nullptr);
}

void ClContext::fill_zero(cl_mem dst, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  // A one-byte pattern fills any offset and size (wider patterns need both aligned to it).
  const cl_uchar zero = 0;
  TESSERA_CL(where_, clEnqueueFillBuffer, queue_, dst, &zero, 1, offset, bytes, 0, nullptr, nullptr);
}

void ClContext::finish() { TESSERA_CL(where_, clFinish, queue_); }

cl_program ClContext::build(const std::string& name, const char* const* sources, int count,
                            const std::string& options) {
  cl_int err = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(context_, static_cast<cl_uint>(count), const_cast<const char**>(sources),
                                                 nullptr, &err);
  if (err != CL_SUCCESS) cl_call_failed("clCreateProgramWithSource", err, where_);
  err = clBuildProgram(program, 1, &info_.id, options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    size_t size = 0;
    clGetProgramBuildInfo(program, info_.id, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
    std::string log(size, '\0');
    clGetProgramBuildInfo(program, info_.id, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
    clReleaseProgram(program);
    throw runtime_error("clBuildProgram failed with " + std::string(cl_error_name(err)) + " (" +
                            std::to_string(err) + ") on " + where_ + " for program " + name + " (options '" +
                            options + "'); build log:\n" + log,
                        "the device's OpenCL C compiler rejected tessera's kernels; `clinfo` shows its "
                        "OpenCL C version (1.2 or later is needed)");
  }
  return program;
}

ClKernel& ClContext::kernel(const std::string& program, const char* const* sources, int count,
                            const std::string& options, const std::string& name) {
  std::lock_guard<std::mutex> guard(cache_lock_);
  const std::string key = program + "/" + name;
  if (auto it = kernels_.find(key); it != kernels_.end()) return *it->second;
  auto p = programs_.find(program);
  if (p == programs_.end()) p = programs_.emplace(program, build(program, sources, count, options)).first;
  cl_int err = CL_SUCCESS;
  auto k = std::make_unique<ClKernel>();
  k->kernel = clCreateKernel(p->second, name.c_str(), &err);
  k->name = name;
  if (err != CL_SUCCESS) cl_call_failed(("clCreateKernel(" + name + ")").c_str(), err, where_);
  return *kernels_.emplace(key, std::move(k)).first->second;
}

ClContext& cl_context_for(int ordinal) {
  static std::mutex lock;
  // Leaked on purpose: the ICD loader may unload its drivers before static destructors run.
  static auto* contexts = new std::map<int, std::unique_ptr<ClContext>>();
  std::lock_guard<std::mutex> guard(lock);
  if (auto it = contexts->find(ordinal); it != contexts->end()) return *it->second;
  const std::vector<ClDeviceInfo> devices = list_cl_devices();
  if (ordinal < 0 || ordinal >= static_cast<int>(devices.size())) {
    std::string found;
    for (const ClDeviceInfo& d : devices) found += (found.empty() ? "" : ", ") + d.describe();
    throw usage_error("no OpenCL device opencl:" + std::to_string(ordinal) + " (found " +
                          (found.empty() ? std::string("none") : found) + ")",
                      "install an OpenCL driver (Debian: pocl-opencl-icd runs on the CPU) and check `clinfo`; "
                      "--device opencl:N picks entry N");
  }
  return *contexts->emplace(ordinal, std::make_unique<ClContext>(devices[ordinal])).first->second;
}

}  // namespace tessera::opencl
