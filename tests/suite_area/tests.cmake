# The suite itself: the port registry that keeps concurrently running tests off each other's
# ports (tests/integration/ports.py), and the repository citing only what its users get
# (Megatron-LM's own source paths, never documents outside the repository).
#   ctest --test-dir build -L suite
add_test(NAME suite.ports COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/ports_test.py)
set_tests_properties(suite.ports PROPERTIES TIMEOUT 120 LABELS suite)

add_test(NAME suite.citations COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check-citations.sh)
set_tests_properties(suite.citations PROPERTIES TIMEOUT 60 LABELS suite)

# The device seam: no backend library header (Gloo, oneDNN, OpenCL, CUDA, NCCL, HCCL, ...)
# outside device/<backend>, ops/<backend>, comm/<backend>; model, train, doctor and cli reach
# backends only through the seam. The self-test proves on a scratch tree that a violation fails.
add_test(NAME suite.backend_includes COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check-backend-includes.sh)
set_tests_properties(suite.backend_includes PROPERTIES TIMEOUT 60 LABELS suite)
add_test(NAME suite.backend_includes_self_test
         COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check-backend-includes.sh --self-test)
set_tests_properties(suite.backend_includes_self_test PROPERTIES TIMEOUT 60 LABELS suite)
