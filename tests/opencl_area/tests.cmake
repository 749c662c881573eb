# The OpenCL backend end to end against the CPU backend (tests/integration/opencl_train_test.py):
# one process, TP=2 x DP=2 and PP=2 under the launcher, checkpoints across backends, the Llama
# family (one process, TP=2), the error
# where no OpenCL driver is installed. Registered
# in builds with the backend; skipped (exit 77) on a machine without an OpenCL device.
# Labelled "opencl":   ctest --test-dir build -L opencl
if(TESSERA_WITH_OPENCL)
  foreach(part one-process launch checkpoint llama no-device)
    add_test(NAME opencl.train_${part}
             COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/opencl_train_test.py
                     $<TARGET_FILE:tessera> ${part})
    # Hang guards: 5 s, 20 s and 13 s on PoCL unloaded (2 cores); ten times that under ctest -j3.
    set_tests_properties(opencl.train_${part} PROPERTIES TIMEOUT 200 SKIP_RETURN_CODE 77 LABELS opencl)
  endforeach()
  # Context parallelism (the ring on OpenCL's flash attention) against one CPU process.
  add_test(NAME opencl.train_context_parallel
           COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/context_parallel_test.py
                   $<TARGET_FILE:tessera> --device opencl)
  set_tests_properties(opencl.train_context_parallel PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS opencl)
endif()
