# Metrics area: TensorBoard event files written by tessera::metrics and read back by
# TensorBoard's own Python reader. TensorBoard is a PyPI package, installed by the test-only
# step of scripts/setup.sh into TESSERA_TEST_VENV (keep the two defaults equal); the test fails,
# saying so, when it is missing. Named metrics.* and labelled "metrics":
#   ctest --test-dir build -L metrics

add_executable(write_tensorboard_events ${CMAKE_CURRENT_LIST_DIR}/write_tensorboard_events.cpp)
target_link_libraries(write_tensorboard_events PRIVATE tessera_metrics)

add_test(NAME metrics.tensorboard_reader
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/tensorboard_reader_test.py
                 --writer $<TARGET_FILE:write_tensorboard_events> --venv ${TESSERA_TEST_VENV}
                 --workdir ${PROJECT_BINARY_DIR}/tests/metrics_work/tensorboard_reader)
set_tests_properties(metrics.tensorboard_reader PROPERTIES TIMEOUT 120 LABELS metrics)
