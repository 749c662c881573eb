# Resolves TESSERA_CUDA into TESSERA_WITH_CUDA. The CUDA backend itself arrives with its own
# issue; until then ON is an error that says so and AUTO reports what it found.
string(TOUPPER "${TESSERA_CUDA}" _tessera_cuda)
set(TESSERA_WITH_CUDA OFF)
if(_tessera_cuda STREQUAL "ON" OR _tessera_cuda STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(_tessera_cuda STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_CUDA=ON: the CUDA backend is not part of this build yet; "
                        "configure with -DTESSERA_CUDA=OFF or AUTO")
  elseif(CMAKE_CUDA_COMPILER)
    message(STATUS "TESSERA_CUDA=AUTO: CUDA toolkit found (${CMAKE_CUDA_COMPILER}); "
                   "the CUDA backend is not built yet, building the CPU backend only")
  else()
    message(STATUS "TESSERA_CUDA=AUTO: no CUDA toolkit, building the CPU backend only")
  endif()
elseif(NOT _tessera_cuda STREQUAL "OFF")
  message(FATAL_ERROR "TESSERA_CUDA must be OFF, ON or AUTO (got '${TESSERA_CUDA}')")
endif()
