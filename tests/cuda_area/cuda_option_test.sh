#!/usr/bin/env bash
# cmake/cuda_option.cmake's contract, on a probe project (option_probe/) configured in a
# scratch folder: AUTO builds the backend exactly when the toolkit is found (sm_80 and sm_90
# plus PTX by default), AUTO without a toolkit is off with a one-line message, ON without one
# and an unknown value are configure errors, OFF is off. "Without a toolkit" is simulated with
# CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit.
#   cuda_option_test.sh TOOLKIT_FOUND(ON|OFF)
set -euo pipefail
toolkit=$1
probe=$(cd "$(dirname "$0")/option_probe" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

# expect NAME WANTED_RC WANTED_TEXT CMAKE_ARGS...
expect() {
  local name=$1 want_rc=$2 want_text=$3
  shift 3
  rm -rf "$scratch/build"
  local out rc=0
  out=$(cmake -S "$probe" -B "$scratch/build" "$@" 2>&1) || rc=$?
  if [[ $rc -ne 0 && $want_rc -eq 0 || $rc -eq 0 && $want_rc -ne 0 ]] || ! grep -qF -- "$want_text" <<<"$out"; then
    echo "FAIL $name: rc $rc (wanted $([[ $want_rc -eq 0 ]] && echo 0 || echo 'non-zero')), output lacks '$want_text':"
    echo "$out" | tail -8
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

if [[ $toolkit == ON ]]; then
  expect "AUTO with the toolkit builds CUDA for sm_80, sm_90 + PTX" 0 "probe: TESSERA_WITH_CUDA=ON archs=80-real;90"
  expect "ON with the toolkit" 0 "probe: TESSERA_WITH_CUDA=ON" -DTESSERA_CUDA=ON
  expect "the architectures can be chosen" 0 "archs=90" -DCMAKE_CUDA_ARCHITECTURES=90
fi
expect "AUTO without a toolkit is off, saying so" 0 "TESSERA_CUDA=AUTO: no CUDA backend (missing the CUDA toolkit" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
expect "ON without a toolkit is an error" 1 "TESSERA_CUDA=ON but not found: the CUDA toolkit" \
  -DTESSERA_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
expect "OFF is off" 0 "probe: TESSERA_WITH_CUDA=OFF" -DTESSERA_CUDA=OFF
expect "an unknown value is an error" 1 "TESSERA_CUDA must be OFF, ON or AUTO (got 'yes')" -DTESSERA_CUDA=yes
exit $((failures > 0))
