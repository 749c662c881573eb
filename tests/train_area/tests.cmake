# `tessera train` through its command line.
add_test(NAME train_cli
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/train_cli_test.py
                 $<TARGET_FILE:tessera> ${PROJECT_SOURCE_DIR})
set_tests_properties(train_cli PROPERTIES TIMEOUT 300)

# Data parallelism against the single-process run, on loopback and across two network
# namespaces (skipped, exit 77, without the rights to make them).
add_test(NAME train_data_parallel
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/data_parallel_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_data_parallel PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)

# Checkpoints: bit-exact resume (1 process, DP=2), kill -9 during saves, bad files, flags.
add_test(NAME train_checkpoints
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/checkpoint_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_checkpoints PROPERTIES TIMEOUT 300)
