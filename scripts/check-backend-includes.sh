#!/usr/bin/env bash
# The device seam as a build rule: a backend's library headers (Gloo, oneDNN, OpenCL, CLBlast,
# CUDA, cuBLAS, cuDNN, NCCL, Ascend's ACL/aclnn/HCCL) are included only by files under
# src/tessera/device/<backend>/, src/tessera/ops/<backend>/ or src/tessera/comm/<backend>/, and
# tessera's own backend folders (tessera/device/<backend>/..., tessera/ops/<backend>/...,
# tessera/comm/<backend>/...) only from device/, ops/ and comm/. Everything else (model,
# train, doctor, cli, ...) talks to the seam: device.h, registry.h, ops.h, communicator.h,
# backend.h. Tests and benchmarks may reach a backend directly and are not checked.
#
#   scripts/check-backend-includes.sh [ROOT]     checks ROOT/src/tessera (default: this repository)
#   scripts/check-backend-includes.sh --self-test  proves on a scratch tree that a violation fails
# Run by CTest as suite.backend_includes and suite.backend_includes_self_test.
set -euo pipefail

library='gloo/|dnnl|oneapi/dnnl|CL/|clblast|cuda|cublas|cudnn|curand|nccl|acl/|aclnn|hccl'
folders='tessera/(device|ops|comm)/[a-z_0-9]+/'

check() {
  local src=$1/src/tessera
  local found=""
  # Library headers outside a backend folder.
  found+=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($library)" "$src" \
             --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
           | grep -vE "^$src/(device|ops|comm)/[a-z_0-9]+/" || true)
  # Backend folders of tessera reached from outside device/, ops/ and comm/.
  local inner
  inner=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$folders" "$src" \
            --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
          | grep -vE "^$src/(device|ops|comm)/" || true)
  [[ -n $found && -n $inner ]] && found+=$'\n'
  found+=$inner
  if [[ -n $found ]]; then
    echo "${found//$1\//}"
    echo "error: $(wc -l <<<"$found") include(s) cross the device seam" >&2
    echo "hint: a backend's headers belong in device/<backend>/, ops/<backend>/ or comm/<backend>/;" \
         "elsewhere use the seam (device/device.h, device/registry.h, ops/ops.h, comm/communicator.h," \
         "comm/backend.h) and add what is missing there" >&2
    return 1
  fi
  echo "ok: no backend header is included outside its backend folder"
}

self_test() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp/src/tessera/"{model,doctor,comm/gloo,ops/opencl,device/cuda}
  echo '#include <gloo/allreduce.h>' >"$tmp/src/tessera/comm/gloo/ok.cpp"
  echo '#include <CL/cl.h>' >"$tmp/src/tessera/ops/opencl/ok.cpp"
  echo '#include <cuda_runtime.h>' >"$tmp/src/tessera/device/cuda/ok.cpp"
  echo '#include "tessera/device/cuda/ok.h"' >"$tmp/src/tessera/comm/ok.cpp"
  printf '// #include <CL/cl.h> in a comment is fine\n#include "tessera/comm/backend.h"\n' \
    >"$tmp/src/tessera/doctor/ok.cpp"
  check "$tmp" >/dev/null || { echo "self-test: a clean tree failed the check" >&2; return 1; }
  echo '  #include <CL/cl.h>' >"$tmp/src/tessera/model/bad.cpp"
  echo '#include "tessera/comm/gloo/gloo_communicator.h"' >"$tmp/src/tessera/doctor/bad.cpp"
  local out
  if out=$(check "$tmp" 2>&1); then
    echo "self-test: the check passed a tree with violations" >&2
    return 1
  fi
  for want in "src/tessera/model/bad.cpp:1:" "src/tessera/doctor/bad.cpp:1:" "2 include(s) cross the device seam"; do
    grep -qF "$want" <<<"$out" || { echo "self-test: the failure does not name '$want':" >&2; echo "$out" >&2; return 1; }
  done
  echo "ok: the check passes a clean tree and names both violations of a bad one"
}

if [[ ${1:-} == --self-test ]]; then
  self_test
else
  check "${1:-$(cd "$(dirname "$0")/.." && pwd)}"
fi
