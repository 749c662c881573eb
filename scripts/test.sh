#!/usr/bin/env bash
# Runs the whole test suite (unit, reference comparisons, integration) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure --timeout 600 -j"$(nproc)" "$@"
