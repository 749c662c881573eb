# The suite itself: the port registry that keeps concurrently running tests off each other's
# ports (tests/integration/ports.py), and the repository citing only what its users get
# (Megatron-LM's own source paths, never documents outside the repository).
#   ctest --test-dir build -L suite
add_test(NAME suite.ports COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/ports_test.py)
set_tests_properties(suite.ports PROPERTIES TIMEOUT 120 LABELS suite)

add_test(NAME suite.citations COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check-citations.sh)
set_tests_properties(suite.citations PROPERTIES TIMEOUT 60 LABELS suite)
