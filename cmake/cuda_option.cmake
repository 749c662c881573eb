# Resolves TESSERA_CUDA (AUTO | ON | OFF) into TESSERA_WITH_CUDA (the CUDA device and kernel
# table), TESSERA_WITH_NCCL (the NCCL communicator) and TESSERA_WITH_CUDNN (cuDNN's fused
# attention: cuDNN 9 and the cuDNN frontend's headers, which scripts/setup.sh unpacks into
# TESSERA_CUDNN_FRONTEND_DIR; without them CUDA runs tessera's own flash kernel). The backend needs the CUDA toolkit:
# nvcc (for the kernels' fatbin), the runtime (linked statically, so a binary built here
# still starts where no driver is installed) and cuBLASLt; NCCL is optional. AUTO builds
# the backend when the toolkit is found and says in one line that it is off otherwise; ON
# makes a missing toolkit an error.
#
# The kernels are compiled for CMAKE_CUDA_ARCHITECTURES in CMake's spelling: "80-real"
# is sm_80 machine code only, "90" is sm_90 machine code plus compute_90 PTX (which newer
# GPUs JIT-compile). Default: A100 and H100/H200 code, PTX for later GPUs.
string(TOUPPER "${TESSERA_CUDA}" _tessera_cuda)
set(TESSERA_WITH_CUDA OFF)
set(TESSERA_WITH_NCCL OFF)
set(TESSERA_WITH_CUDNN OFF)
set(TESSERA_CUDNN_FRONTEND_DIR /opt/tessera/cudnn-frontend CACHE PATH
    "the cuDNN frontend's headers (scripts/setup.sh unpacks them from PyPI's nvidia-cudnn-frontend)")
if(_tessera_cuda STREQUAL "ON" OR _tessera_cuda STREQUAL "AUTO")
  find_package(CUDAToolkit QUIET)
  set(_missing "")
  if(NOT CUDAToolkit_FOUND OR NOT CUDAToolkit_NVCC_EXECUTABLE)
    list(APPEND _missing "the CUDA toolkit (nvcc, cudart)")
  elseif(NOT TARGET CUDA::cublasLt)
    list(APPEND _missing "cuBLASLt")
  endif()
  if(_missing STREQUAL "")
    set(TESSERA_WITH_CUDA ON)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
    endif()
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(TESSERA_WITH_NCCL ON)
      add_library(tessera_nccl_lib UNKNOWN IMPORTED)
      set_target_properties(tessera_nccl_lib PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    endif()
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
    find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${TESSERA_CUDNN_FRONTEND_DIR}/include NO_DEFAULT_PATH)
    if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY AND CUDNN_FRONTEND_INCLUDE_DIR)
      set(TESSERA_WITH_CUDNN ON)
      add_library(tessera_cudnn_lib UNKNOWN IMPORTED)
      set_target_properties(tessera_cudnn_lib PROPERTIES IMPORTED_LOCATION ${CUDNN_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR};${CUDNN_FRONTEND_INCLUDE_DIR}")
    endif()
    message(STATUS "TESSERA_CUDA=${_tessera_cuda}: building the CUDA backend (CUDA ${CUDAToolkit_VERSION}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${TESSERA_WITH_NCCL}, cuDNN ${TESSERA_WITH_CUDNN})")
  elseif(_tessera_cuda STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_CUDA=ON but not found: ${_missing}; install the CUDA toolkit or "
                        "configure with -DTESSERA_CUDA=OFF")
  else()
    message(STATUS "TESSERA_CUDA=AUTO: no CUDA backend (missing ${_missing})")
  endif()
elseif(NOT _tessera_cuda STREQUAL "OFF")
  message(FATAL_ERROR "TESSERA_CUDA must be OFF, ON or AUTO (got '${TESSERA_CUDA}')")
endif()
