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
  libsentencepiece-dev   # Llama2Tokenizer and GPTSentencePieceTokenizer
  zlib1g-dev             # .gz inputs of tessera preprocess
  clang-14 libclang-rt-14-dev   # libFuzzer for fuzz/idx_fuzz (without it a standalone driver runs)
  libssl-dev             # MD5 / SHA-256
  libgtest-dev libgmock-dev
  python3-torch python3-numpy python3-regex   # test-only references (run with /usr/bin/python3)
  libisal-dev            # CRC-32C of TensorBoard event files (Debian 12 has no Google crc32c package)
  opencl-headers ocl-icd-opencl-dev   # the OpenCL backend (--device opencl): Khronos headers, ICD loader
  libclblast-dev         # its GEMMs
  pocl-opencl-icd clinfo # PoCL: an OpenCL device on the CPU, what CI runs the OpenCL backend on
  python3-venv           # test-only: the venv of the PyPI step below
)

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# ---- test-only: PyPI packages (nothing tessera builds or runs uses them) ----------------------
# tests/metrics_area reads tessera's TensorBoard event files with TensorBoard's own reader.
# tensorboard is not packaged by Debian, so it goes into a venv at a fixed path (CMake's
# TESSERA_TEST_VENV; keep the two defaults equal), leaving Debian's python3 untouched.
# Skipped when that venv already has this version.
TEST_VENV=${TESSERA_TEST_VENV:-/opt/tessera/test-venv}
TENSORBOARD_VERSION=2.21.0
if "$TEST_VENV/bin/python" -c "import sys, tensorboard; sys.exit(tensorboard.__version__ != '$TENSORBOARD_VERSION')" 2>/dev/null; then
  echo "setup: tensorboard $TENSORBOARD_VERSION present in $TEST_VENV (test-only)"
else
  echo "setup: installing tensorboard $TENSORBOARD_VERSION from PyPI into $TEST_VENV (test-only)"
  $SUDO /usr/bin/python3 -m venv "$TEST_VENV"
  $SUDO "$TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "tensorboard==$TENSORBOARD_VERSION"
fi
# tests/reference/data/model_file_tokenizers_test.py compares tessera's Hugging Face and
# SentencePiece tokenizers with Megatron's classes on the real libraries.
TOKENIZER_PACKAGES=("tokenizers==0.21.0" "sentencepiece==0.2.0" "transformers==4.47.1")
if "$TEST_VENV/bin/python" -c "
import sys, importlib.metadata as m
sys.exit(any(m.version(p.split('==')[0]) != p.split('==')[1] for p in sys.argv[1:]))" "${TOKENIZER_PACKAGES[@]}" 2>/dev/null; then
  echo "setup: ${TOKENIZER_PACKAGES[*]} present in $TEST_VENV (test-only)"
else
  echo "setup: installing ${TOKENIZER_PACKAGES[*]} from PyPI into $TEST_VENV (test-only)"
  $SUDO "$TEST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${TOKENIZER_PACKAGES[@]}"
fi
# The real tools as references: megatron-core writes and reads
# Megatron-LM checkpoints, and transformers 5 writes and reads today's Hugging Face folders
# (the test venv above keeps transformers 4.47.1 beside it). torch comes from PyPI with its CUDA
# wheels, though only its CPU path runs here; megatron-core's own requirements (apex, TE,
# tensorstore, wandb, ...) are for training with it and are left out (--no-deps). six: what
# Megatron-LM's own tools/preprocess_data.py imports (bench/preprocess_bench.py --megatron).
TOOLS_VENV=${TESSERA_TOOLS_VENV:-/opt/tessera/tools-venv}
TOOLS_PACKAGES=("torch==2.6.0" "numpy==1.26.4" "transformers==5.25.0" "tokenizers==0.23.3" "six==1.17.0")
MEGATRON_CORE=megatron-core==0.10.0
if "$TOOLS_VENV/bin/python" -c "
import sys, importlib.metadata as m
sys.exit(any(m.version(p.split('==')[0]) != p.split('==')[1] for p in sys.argv[1:]))" \
    "${TOOLS_PACKAGES[@]}" "$MEGATRON_CORE" 2>/dev/null; then
  echo "setup: ${TOOLS_PACKAGES[*]} $MEGATRON_CORE present in $TOOLS_VENV (test-only)"
else
  echo "setup: installing ${TOOLS_PACKAGES[*]} $MEGATRON_CORE from PyPI into $TOOLS_VENV (test-only)"
  $SUDO /usr/bin/python3 -m venv "$TOOLS_VENV"
  $SUDO "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${TOOLS_PACKAGES[@]}"
  $SUDO "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$MEGATRON_CORE"
fi
# torch_dist (Megatron's distributed checkpoint) against the code that writes it: core_r0.10.0's
# torch_dist writer fails on torch releases after it, so megatron-core 0.10.0 gets the torch it
# was released with, in a venv of its own (tests/ckpt_area/torch_dist_test.cpp).
TDIST_VENV=${TESSERA_TDIST_VENV:-/opt/tessera/tdist-venv}
TDIST_PACKAGES=("torch==2.5.1" "numpy==1.26.4" "packaging" "psutil")
if "$TDIST_VENV/bin/python" -c "
import sys, importlib.metadata as m
sys.exit(m.version('torch') != '2.5.1' or m.version('megatron-core') != '0.10.0')" 2>/dev/null; then
  echo "setup: torch 2.5.1 and $MEGATRON_CORE present in $TDIST_VENV (test-only)"
else
  echo "setup: installing torch 2.5.1 and $MEGATRON_CORE from PyPI into $TDIST_VENV (test-only)"
  $SUDO /usr/bin/python3 -m venv "$TDIST_VENV"
  $SUDO "$TDIST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${TDIST_PACKAGES[@]}"
  $SUDO "$TDIST_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$MEGATRON_CORE"
fi
# ---- build-only: the cuDNN frontend's headers ------------------------------------------------
# The CUDA backend's fused attention calls cuDNN's SDPA through NVIDIA's cuDNN frontend
# (header-only C++, MIT), which Debian does not package; its PyPI wheel carries the headers
# under include/. Only those are unpacked, into a folder CMake finds (TESSERA_CUDNN_FRONTEND_DIR;
# keep the two defaults equal); nothing is installed into any Python. Skipped when that folder
# already holds this version. A build without them runs tessera's own flash kernel on CUDA.
CUDNN_FRONTEND_VERSION=1.32.0
CUDNN_FRONTEND_DIR=${TESSERA_CUDNN_FRONTEND_DIR:-/opt/tessera/cudnn-frontend}
if [ -f "$CUDNN_FRONTEND_DIR/include/cudnn_frontend.h" ] &&
   [ "$(cat "$CUDNN_FRONTEND_DIR/VERSION" 2>/dev/null)" = "$CUDNN_FRONTEND_VERSION" ]; then
  echo "setup: cuDNN frontend $CUDNN_FRONTEND_VERSION headers present in $CUDNN_FRONTEND_DIR (build-only)"
else
  echo "setup: unpacking the cuDNN frontend $CUDNN_FRONTEND_VERSION headers from PyPI into $CUDNN_FRONTEND_DIR (build-only)"
  wheel_dir=$(mktemp -d)
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$wheel_dir" \
    "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION"
  $SUDO rm -rf "$CUDNN_FRONTEND_DIR"
  $SUDO mkdir -p "$CUDNN_FRONTEND_DIR"
  $SUDO /usr/bin/python3 -c "
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as w:
    w.extractall(sys.argv[2], [n for n in w.namelist() if n.startswith('include/')])" \
    "$(ls "$wheel_dir"/*.whl)" "$CUDNN_FRONTEND_DIR"
  echo "$CUDNN_FRONTEND_VERSION" | $SUDO tee "$CUDNN_FRONTEND_DIR/VERSION" >/dev/null
  rm -rf "$wheel_dir"
fi
