#!/usr/bin/env bash
# Runs the whole test suite (unit, reference comparisons, integration) through CTest.
#   scripts/test.sh [CTEST_ARGS...]           once, one job per core
#   scripts/test.sh --stress [CTEST_ARGS...]  twice in a row, one job more than there are cores
#                                             (a loaded CI machine); nothing is retried
# TESSERA_BUILD_DIR names the build folder (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TESSERA_BUILD_DIR:-build}
run_suite() {  # JOBS CTEST_ARGS...
  local jobs=$1 start=$SECONDS
  shift
  ctest --test-dir "$build" --output-on-failure --timeout 600 -j"$jobs" "$@"
  echo "test.sh: ctest -j$jobs passed in $((SECONDS - start)) s"
}
if [[ "${1:-}" == --stress ]]; then
  shift
  for pass in 1 2; do
    echo "test.sh --stress: pass $pass of 2"
    run_suite $(($(nproc) + 1)) "$@"
  done
else
  run_suite "$(nproc)" "$@"
fi
