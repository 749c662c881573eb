# The CUDA backend (tests/integration/cuda_test.py, cuda_option_test.sh). Labelled "gpu"
# (ctest --test-dir build -L gpu): the op test on every CUDA device and the 10-iteration
# training parity test against the CPU need a GPU and exit 77 (skipped, saying so) without
# one (so do the checkpoints across CPU and CUDA, --bf16 and --tf32 against the CPU). CPU-side, in every build: the TESSERA_CUDA
# option's behaviour and that every fatbin kernel fits CudaLaunch's arguments; in CUDA builds, the error of --device cuda on a machine without a GPU
# and --tf32's note on the CPU.
add_test(NAME cuda.option COMMAND ${CMAKE_CURRENT_LIST_DIR}/cuda_option_test.sh ${TESSERA_WITH_CUDA})
set_tests_properties(cuda.option PROPERTIES TIMEOUT 120 LABELS cuda)
# Every fatbin kernel fits CudaLaunch's argument array (a GPU-only failure otherwise).
add_test(NAME cuda.kernel_arguments
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/kernel_arguments_test.py ${PROJECT_SOURCE_DIR})
set_tests_properties(cuda.kernel_arguments PROPERTIES TIMEOUT 60 LABELS cuda)
if(TESSERA_WITH_CUDA)
  add_test(NAME cuda.no_gpu_error
           COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/cuda_test.py $<TARGET_FILE:tessera> no-gpu)
  add_test(NAME cuda.backend_ops
           COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/cuda_test.py $<TARGET_FILE:tessera> ops
                   $<TARGET_FILE:backend_ops_test>)
  # The GPU parts of cuda_test.py, each its own test: NAME:PART.
  foreach(test train_parity:train checkpoint:checkpoint bf16:bf16 tf32:tf32 cudnn:cudnn llama:llama moe:moe
          graph:graph two_gpu:two-gpu)
    string(REPLACE ":" ";" test ${test})
    list(GET test 0 name)
    list(GET test 1 part)
    add_test(NAME cuda.${name}
             COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/cuda_test.py $<TARGET_FILE:tessera> ${part})
    set_tests_properties(cuda.${name} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS gpu)
  endforeach()
  set_tests_properties(cuda.no_gpu_error PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77 LABELS cuda)
  set_tests_properties(cuda.backend_ops PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS gpu)
endif()
