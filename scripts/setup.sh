#!/usr/bin/env bash
# Installs every build and test dependency of tessera from Debian packages.
# Idempotent: packages already present are skipped. Never installs CUDA.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libdnnl-dev            # oneDNN: fp32/bf16 GEMM
  libgloo-dev            # CPU collectives
  libsimdjson-dev        # JSON parsing in preprocess
  nlohmann-json3-dev     # small JSON documents (configs, metadata, logs)
  libpcre2-dev           # the GPT-2 pre-tokenization pattern (reference in tests)
  libicu-dev             # Unicode classes for the GPT-2 pre-tokenizer (ICU 72 = Unicode 15.0)
  zlib1g-dev             # .gz inputs of tessera preprocess
  clang-14 libclang-rt-14-dev   # libFuzzer for fuzz/idx_fuzz (without it a standalone driver runs)
  libssl-dev             # MD5 / SHA-256
  libgtest-dev libgmock-dev
  python3-torch python3-numpy python3-regex   # test-only references (run with /usr/bin/python3)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi
