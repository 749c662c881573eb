// Checked OpenCL calls: every failure names the call, the error code (by its CL_ name) and
// the device, e.g. "clEnqueueNDRangeKernel failed with CL_OUT_OF_RESOURCES (-5) on
// opencl:0 (pthread-haswell-AMD EPYC 7B13)". The only file besides the other sources of
// device/opencl and ops/opencl that may include <CL/cl.h> (see docs/backends.md).
#pragma once

// OpenCL 1.2 API: what every ICD and PoCL provide.
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <string>

namespace tessera::opencl {

// "CL_OUT_OF_RESOURCES" for -5; "unknown OpenCL error" for codes outside the 1.2 list.
const char* cl_error_name(cl_int code);

// Throws tessera::Error (runtime): "<call> failed with <name> (<code>) on <where>".
[[noreturn]] void cl_call_failed(const char* call, cl_int code, const std::string& where);

}  // namespace tessera::opencl

// TESSERA_CL(where, clFunction, args...): calls clFunction(args...) and throws naming it
// when it does not return CL_SUCCESS. `where` is the device's description.
#define TESSERA_CL(where, fn, ...)                                                 \
  do {                                                                             \
    const cl_int tessera_cl_err_ = fn(__VA_ARGS__);                                \
    if (tessera_cl_err_ != CL_SUCCESS)                                             \
      ::tessera::opencl::cl_call_failed(#fn, tessera_cl_err_, (where));            \
  } while (0)
