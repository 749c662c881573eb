# Resolves TESSERA_OPENCL (AUTO | ON | OFF) into TESSERA_WITH_OPENCL. The OpenCL backend
# needs the Khronos headers, the ICD loader (libOpenCL) and CLBlast for its GEMMs: Debian's
# opencl-headers, ocl-icd-opencl-dev and libclblast-dev (scripts/setup.sh installs them,
# with pocl-opencl-icd as the device CI runs on). AUTO builds the backend when all three
# are found and says in one line what is missing otherwise; ON makes a missing one an error.
string(TOUPPER "${TESSERA_OPENCL}" _tessera_opencl)
set(TESSERA_WITH_OPENCL OFF)
if(_tessera_opencl STREQUAL "ON" OR _tessera_opencl STREQUAL "AUTO")
  find_package(OpenCL QUIET)
  find_package(CLBlast CONFIG QUIET)
  set(_missing "")
  if(NOT OpenCL_FOUND)
    list(APPEND _missing "OpenCL headers and ICD loader (opencl-headers, ocl-icd-opencl-dev)")
  endif()
  if(NOT CLBlast_FOUND)
    list(APPEND _missing "CLBlast (libclblast-dev)")
  endif()
  if(_missing STREQUAL "")
    set(TESSERA_WITH_OPENCL ON)
    message(STATUS "TESSERA_OPENCL=${_tessera_opencl}: building the OpenCL backend (OpenCL ${OpenCL_VERSION_STRING}, CLBlast)")
  elseif(_tessera_opencl STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_OPENCL=ON but not found: ${_missing}; run scripts/setup.sh")
  else()
    message(STATUS "TESSERA_OPENCL=AUTO: no OpenCL backend (missing ${_missing})")
  endif()
elseif(NOT _tessera_opencl STREQUAL "OFF")
  message(FATAL_ERROR "TESSERA_OPENCL must be OFF, ON or AUTO (got '${TESSERA_OPENCL}')")
endif()
