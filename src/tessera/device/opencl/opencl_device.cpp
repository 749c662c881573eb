#include "tessera/device/opencl/opencl_device.h"

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/device/opencl/cl_context.h"

namespace tessera {
namespace {

class OpenClDevice final : public Device {
 public:
  explicit OpenClDevice(opencl::ClContext& cl) : cl_(cl) {}

  const char* backend_name() const override { return "opencl"; }
  int ordinal() const override { return cl_.info().ordinal; }
  std::string name() const override { return "opencl:" + std::to_string(ordinal()); }
  std::string description() const override {
    const opencl::ClDeviceInfo& i = cl_.info();
    return i.name + " (" + i.type + ", " + i.platform_name + ", driver " + i.driver_version + ", " +
           i.device_version + ")";
  }
  bool is_host() const override { return false; }
  // OpenCL reports no free-memory figure; what tessera has not allocated is the best guess.
  MemoryInfo memory_info() const override {
    const size_t total = cl_.info().global_memory;
    const size_t used = allocated_bytes();
    return {total, used < total ? total - used : 0};
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    if (bytes > cl_.info().max_allocation)
      throw runtime_error(name() + ": one allocation of " + std::to_string(bytes >> 20) + " MiB exceeds the device's " +
                              "CL_DEVICE_MAX_MEM_ALLOC_SIZE of " + std::to_string(cl_.info().max_allocation >> 20) +
                              " MiB (" + cl_.info().name + ")",
                          "split the model with --tensor-model-parallel-size / --pipeline-model-parallel-size, or "
                          "lower --micro-batch-size");
    cl_mem mem = cl_.create_buffer(bytes);
    account(static_cast<ptrdiff_t>(bytes));
    return mem;
  }
  void free(void* handle, size_t bytes) override {
    if (!handle) return;
    cl_.release_buffer(static_cast<cl_mem>(handle));
    account(-static_cast<ptrdiff_t>(bytes));
  }

  void copy_to_host(void* dst, const void* src, size_t src_offset, size_t bytes) override {
    cl_.read(dst, mem(src), src_offset, bytes);
  }
  void copy_from_host(void* dst, size_t dst_offset, const void* src, size_t bytes) override {
    cl_.write(mem(dst), dst_offset, src, bytes);
  }
  void copy(void* dst, size_t dst_offset, const void* src, size_t src_offset, size_t bytes) override {
    // clEnqueueCopyBuffer refuses overlapping ranges of one buffer (CL_MEM_COPY_OVERLAP);
    // Device::copy allows them, so those go through the host.
    if (dst == src && src_offset < dst_offset + bytes && dst_offset < src_offset + bytes) {
      std::vector<char> staged(bytes);
      cl_.read(staged.data(), mem(src), src_offset, bytes);
      cl_.write(mem(dst), dst_offset, staged.data(), bytes);
      return;
    }
    cl_.copy(mem(dst), dst_offset, mem(src), src_offset, bytes);
  }
  void fill_zero(void* dst, size_t dst_offset, size_t bytes) override { cl_.fill_zero(mem(dst), dst_offset, bytes); }
  void copy_to_host_async(void* dst, const void* src, size_t src_offset, size_t bytes, Stream) override {
    cl_.read_async(dst, mem(src), src_offset, bytes);
  }
  void copy_from_host_async(void* dst, size_t dst_offset, const void* src, size_t bytes, Stream) override {
    cl_.write_async(mem(dst), dst_offset, src, bytes);
  }
  void* allocate_pinned(size_t bytes) override { return bytes == 0 ? nullptr : cl_.map_pinned(bytes); }
  void free_pinned(void* host, size_t) override {
    if (host) cl_.unmap_pinned(host);
  }

  // One in-order queue serves every stream: work runs in issue order, so a stream is the
  // default one and waiting for an event on it needs nothing. An event is a marker: the
  // point in the queue that synchronize_event waits for.
  Event create_event() override { return {new cl_event(nullptr)}; }
  void destroy_event(Event e) override {
    auto* ev = static_cast<cl_event*>(e.handle);
    if (ev && *ev) clReleaseEvent(*ev);
    delete ev;
  }
  void record_event(Event e, Stream) override {
    auto* ev = static_cast<cl_event*>(e.handle);
    if (*ev) clReleaseEvent(*ev);
    *ev = cl_.marker();
  }
  void synchronize_event(Event e) override {
    auto* ev = static_cast<cl_event*>(e.handle);
    if (*ev) cl_.wait(*ev);
  }
  void synchronize(Stream) override { cl_.finish(); }

  opencl::ClContext& cl() const { return cl_; }

 private:
  static cl_mem mem(const void* handle) { return static_cast<cl_mem>(const_cast<void*>(handle)); }
  opencl::ClContext& cl_;
};

}  // namespace

std::vector<std::string> opencl_device_names() {
  std::vector<std::string> names;
  for (const opencl::ClDeviceInfo& d : opencl::list_cl_devices()) names.push_back(d.describe());
  return names;
}

int opencl_device_count() { return static_cast<int>(opencl::list_cl_devices().size()); }

Device& opencl_device(int ordinal) {
  static std::mutex lock;
  // Leaked on purpose: the ICD loader may unload its drivers before static destructors run.
  static auto* devices = new std::map<int, std::unique_ptr<OpenClDevice>>();
  std::lock_guard<std::mutex> guard(lock);
  auto it = devices->find(ordinal);
  if (it == devices->end())
    it = devices->emplace(ordinal, std::make_unique<OpenClDevice>(opencl::cl_context_for(ordinal))).first;
  return *it->second;
}

opencl::ClContext& opencl_context(const Device& device) {
  const auto* cl = dynamic_cast<const OpenClDevice*>(&device);
  TESSERA_CHECK(cl != nullptr, "OpenCL kernel given a tensor on " + device.name());
  return cl->cl();
}

void build_opencl_program(const Device& device, const std::string& name, const std::string& source,
                          const std::string& kernel) {
  const char* sources[] = {source.c_str()};
  opencl_context(device).kernel(name, sources, 1, "-cl-std=CL1.2", kernel);
}

}  // namespace tessera
