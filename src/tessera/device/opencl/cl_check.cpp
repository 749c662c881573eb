#include "tessera/device/opencl/cl_check.h"

#include "tessera/core/error.h"

namespace tessera::opencl {

const char* cl_error_name(cl_int code) {
  switch (code) {
#define NAME(c) \
  case c:       \
    return #c;
    NAME(CL_SUCCESS) NAME(CL_DEVICE_NOT_FOUND) NAME(CL_DEVICE_NOT_AVAILABLE) NAME(CL_COMPILER_NOT_AVAILABLE)
    NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE) NAME(CL_OUT_OF_RESOURCES) NAME(CL_OUT_OF_HOST_MEMORY)
    NAME(CL_PROFILING_INFO_NOT_AVAILABLE) NAME(CL_MEM_COPY_OVERLAP) NAME(CL_IMAGE_FORMAT_MISMATCH)
    NAME(CL_IMAGE_FORMAT_NOT_SUPPORTED) NAME(CL_BUILD_PROGRAM_FAILURE) NAME(CL_MAP_FAILURE)
    NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET) NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    NAME(CL_COMPILE_PROGRAM_FAILURE) NAME(CL_LINKER_NOT_AVAILABLE) NAME(CL_LINK_PROGRAM_FAILURE)
    NAME(CL_DEVICE_PARTITION_FAILED) NAME(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) NAME(CL_INVALID_VALUE)
    NAME(CL_INVALID_DEVICE_TYPE) NAME(CL_INVALID_PLATFORM) NAME(CL_INVALID_DEVICE) NAME(CL_INVALID_CONTEXT)
    NAME(CL_INVALID_QUEUE_PROPERTIES) NAME(CL_INVALID_COMMAND_QUEUE) NAME(CL_INVALID_HOST_PTR)
    NAME(CL_INVALID_MEM_OBJECT) NAME(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) NAME(CL_INVALID_IMAGE_SIZE)
    NAME(CL_INVALID_SAMPLER) NAME(CL_INVALID_BINARY) NAME(CL_INVALID_BUILD_OPTIONS) NAME(CL_INVALID_PROGRAM)
    NAME(CL_INVALID_PROGRAM_EXECUTABLE) NAME(CL_INVALID_KERNEL_NAME) NAME(CL_INVALID_KERNEL_DEFINITION)
    NAME(CL_INVALID_KERNEL) NAME(CL_INVALID_ARG_INDEX) NAME(CL_INVALID_ARG_VALUE) NAME(CL_INVALID_ARG_SIZE)
    NAME(CL_INVALID_KERNEL_ARGS) NAME(CL_INVALID_WORK_DIMENSION) NAME(CL_INVALID_WORK_GROUP_SIZE)
    NAME(CL_INVALID_WORK_ITEM_SIZE) NAME(CL_INVALID_GLOBAL_OFFSET) NAME(CL_INVALID_EVENT_WAIT_LIST)
    NAME(CL_INVALID_EVENT) NAME(CL_INVALID_OPERATION) NAME(CL_INVALID_GL_OBJECT) NAME(CL_INVALID_BUFFER_SIZE)
    NAME(CL_INVALID_MIP_LEVEL) NAME(CL_INVALID_GLOBAL_WORK_SIZE) NAME(CL_INVALID_PROPERTY)
    NAME(CL_INVALID_IMAGE_DESCRIPTOR) NAME(CL_INVALID_COMPILER_OPTIONS) NAME(CL_INVALID_LINKER_OPTIONS)
    NAME(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef NAME
    case -1001:
      return "CL_PLATFORM_NOT_FOUND_KHR";  // the ICD loader found no platform
    default:
      return "unknown OpenCL error";
  }
}

void cl_call_failed(const char* call, cl_int code, const std::string& where) {
  const std::string what = std::string(call) + " failed with " + cl_error_name(code) + " (" +
                           std::to_string(code) + ") on " + where;
  const bool memory = code == CL_MEM_OBJECT_ALLOCATION_FAILURE || code == CL_OUT_OF_RESOURCES ||
                      code == CL_OUT_OF_HOST_MEMORY || code == CL_INVALID_BUFFER_SIZE;
  throw runtime_error(what, memory ? "the device is out of memory: lower --micro-batch-size or split the model "
                                     "with --tensor-model-parallel-size / --pipeline-model-parallel-size"
                                   : "`clinfo` lists the OpenCL platforms and devices this machine has; "
                                     "`tessera doctor --device opencl` runs a kernel on one");
}

}  // namespace tessera::opencl
