# The OpenCL backend end to end against the CPU backend (tests/integration/opencl_train_test.py):
# one process, TP=2 x DP=2 and PP=2 under the launcher, checkpoints across backends. Registered
# in builds with the backend; skipped (exit 77) on a machine without an OpenCL device.
# Labelled "opencl":   ctest --test-dir build -L opencl
if(TESSERA_WITH_OPENCL)
  foreach(part one-process launch checkpoint)
    add_test(NAME opencl.train_${part}
             COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/opencl_train_test.py
                     $<TARGET_FILE:tessera> ${part})
    # Hang guards: about twice the time measured on PoCL under ctest -j3 on a loaded 2-core machine.
    set_tests_properties(opencl.train_${part} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS opencl)
  endforeach()
endif()
