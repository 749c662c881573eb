#!/usr/bin/env bash
# The CUDA backend on one GPU in one prepared run, for a machine that has a GPU, the CUDA 13
# driver, Python 3 with torch and pip's nvidia-* libraries, but no Debian development
# packages (so tessera cannot be built there: oneDNN, ICU, Gloo... are missing).
#
#   scripts/gpu-check.sh bundle [BUILD_DIR]
#       On the build machine, after a CUDA build (default build dir: build-cuda): packs
#       BUILD_DIR/gpu-bundle.tar.xz with the tessera binary, backend_ops_test, precision_test and every
#       shared library they load that is neither glibc nor a CUDA library (oneDNN, ICU,
#       Gloo, ...), xz-compressed to fit a 64 MiB transfer. Carry that file to the GPU
#       machine with the source tree.
#   scripts/gpu-check.sh run [BUNDLE] [--no-peers]
#       On the GPU machine (default bundle: build-cuda/gpu-bundle.tar.xz): unpacks it, finds
#       the CUDA 13 libraries (cuBLASLt, cuDNN, NCCL) among pip's nvidia-* packages, runs
#       doctor and the gpu tests (every op against the CPU backend, 10 training iterations
#       against the CPU), then the benchmark at sequence 1024 in bf16 without dropout (as
#       PyTorch's side): GPT-2 124M and 350M at micro-batch 8 and a 1B Llama shape
#       (Llama 3.2 1B: 16 layers, hidden 2048, 32 heads in 8 groups, SwiGLU 8192, RMSNorm,
#       RoPE) at micro-batch 4, each in the default mode and --deterministic-mode, tokens/s
#       and MFU by Megatron's formula against 989 TFLOP/s; an 8192^3 bf16 GEMM; PyTorch eager
#       and torch.compile of the GPT models; Nsight Compute's per-kernel top list of one
#       iteration of a 2-layer GPT-2 124M (when the machine has ncu); the remaining tests and
#       compute-sanitizer's memcheck. Writes $OUT/gpu-check/summary.md with every log beside
#       it. Each part has a time limit, the parts run in order of importance, and the whole
#       run stays inside one 10-minute device command (GPU_CHECK_BUDGET, default 540 s after
#       unpacking); a part that fails or times out is recorded and the run goes on.
#       --no-peers skips PyTorch's runs (a re-check of tessera alone).
set -uo pipefail

die() {
  echo "gpu-check: $*" >&2
  exit 1
}

# ---------------------------------------------------------------------------------------
bundle() {
  local build=${1:-build-cuda}
  local tessera=$build/src/tessera/cli/tessera ops_test=$build/tests/backend_ops_test
  local precision_test=$build/tests/precision_test
  [[ -x $tessera && -x $ops_test && -x $precision_test ]] ||
    die "no $tessera, $ops_test or $precision_test: build with CUDA first"
  grep -q 'TESSERA_WITH_CUDA:INTERNAL=ON\|TESSERA_CUDA:STRING=\(ON\|AUTO\)' "$build/CMakeCache.txt" ||
    die "$build is not a CUDA build"
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/tessera-gpu/bin" "$stage/tessera-gpu/lib"
  cp "$tessera" "$ops_test" "$precision_test" "$stage/tessera-gpu/bin/"
  # Every library the two load, but glibc's (the GPU machine's own must match its loader)
  # and CUDA's (the GPU machine's driver and pip packages provide them).
  ldd "$tessera" "$ops_test" "$precision_test" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|cudnn[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/tessera-gpu/lib/"; done
  tar -C "$stage" -cf - tessera-gpu | xz -T2 -6 >"$build/gpu-bundle.tar.xz"
  local size
  size=$(stat -c %s "$build/gpu-bundle.tar.xz")
  echo "gpu-check: $build/gpu-bundle.tar.xz: $((size >> 20)) MiB ($(find "$stage/tessera-gpu/lib" -type f | wc -l) libraries)"
  ((size < 60 << 20)) || die "the bundle is over 60 MiB: too big to carry"
}

# ---------------------------------------------------------------------------------------
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-540}  # seconds for everything after unpacking (one 10-minute command with the start-up)

# limit SECONDS_WANTED: what a part may take, never past the budget.
limit() {
  local left=$((BUDGET - (SECONDS - START)))
  ((left < $1)) && echo $((left > 5 ? left : 5)) || echo "$1"
}

# part NAME SECONDS COMMAND...: runs one part with its log in $RESULTS/NAME.log and a row
# in the summary.
part() {
  local name=$1 seconds
  seconds=$(limit "$2")
  shift 2
  local t0=$SECONDS rc=0
  # A fresh bash that knows this script's bench functions, so timeout can run them too.
  timeout -k 10 "$seconds" bash -c "$(declare -f tessera_bench torch_bench)"'; "$@"' part "$@" \
    >"$RESULTS/$name.log" 2>&1 || rc=$?
  local verdict=passed
  ((rc == 124 || rc == 137)) && verdict="timed out after ${seconds} s"
  ((rc == 77)) && verdict=skipped
  ((rc != 0 && rc != 124 && rc != 137 && rc != 77)) && verdict="FAILED (exit $rc)"
  echo "| $name | $verdict | $((SECONDS - t0)) s |" >>"$RESULTS/parts.md"
  echo "gpu-check: $name: $verdict ($((SECONDS - t0)) s)"
  return 0
}

# Where pip's nvidia-* packages keep their libraries (cuBLASLt, NCCL, cuDNN, runtime).
nvidia_library_path() {
  python3 - <<'EOF'
import glob, os, site
dirs = []
for root in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")))
dirs += [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib") if os.path.isdir(d)]
print(":".join(dirs))
EOF
}

# tessera's benchmark run: MODEL (124m|350m|1b) MODE (default|deterministic)
#   -> $RESULTS/tessera_MODEL[_deterministic|_graph].jsonl
# No dropout, as PyTorch's side: the fused attention then runs on cuDNN (ops/cuda/flash_route.h).
tessera_bench() {
  local model=$1 mode=${2:-default} shape mb=8 vocab=50257 suffix=""
  case $model in
    124m) shape="--num-layers 12 --hidden-size 768 --num-attention-heads 12" ;;
    350m) shape="--num-layers 24 --hidden-size 1024 --num-attention-heads 16" ;;
    1b)
      shape="--num-layers 16 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32
             --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm
             --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear"
      mb=4 vocab=128256 ;;
  esac
  [[ $mode == deterministic ]] && shape+=" --deterministic-mode" && suffix=_deterministic
  [[ $mode == graph ]] && shape+=" --enable-cuda-graph" && suffix=_graph
  # shellcheck disable=SC2086  # shape is a list of flags
  "$TESSERA" train $shape --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size $mb \
    --global-batch-size $mb --bf16 --tokenizer-type NullTokenizer --vocab-size $vocab --mock-data \
    --hidden-dropout 0 --attention-dropout 0 \
    --lr 6e-4 --lr-warmup-iters 2 --train-iters 12 --log-interval 4 --eval-iters 1 --eval-interval 1000 \
    --weight-decay 0.1 --clip-grad 1.0 --device cuda --log-json "$RESULTS/tessera_$model$suffix.jsonl"
}

# PyTorch's side: the same GPT (pre-LN, GeLU, tied embeddings, causal SDPA) in bf16 autocast
# with fused AdamW, eager or torch.compile; prints one JSON line. Also the 8192^3 GEMM.
torch_bench() {
  python3 - "$@" <<'EOF'
import json, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

what = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = False
if what == "gemm":
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / reps
    print(json.dumps({"gemm": n, "tflops": 2 * n**3 / dt / 1e12}))
    sys.exit(0)

model, mode = what, sys.argv[2]
L, H, NH = {"124m": (12, 768, 12), "350m": (24, 1024, 16)}[model]
T, B, V = 1024, 8, 50304


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, H))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(T, H)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(H)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


net = GPT().cuda()
opt = torch.optim.AdamW(net.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
step_fn = torch.compile(net) if mode == "compile" else net
x = torch.randint(0, V, (B, T), device="cuda")
y = torch.randint(0, V, (B, T), device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_fn(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


t0 = time.perf_counter()
for _ in range(3):
    step()
torch.cuda.synchronize()
warmup = time.perf_counter() - t0
t0, reps = time.perf_counter(), 10
for _ in range(reps):
    step()
torch.cuda.synchronize()
dt = (time.perf_counter() - t0) / reps
print(json.dumps({"model": model, "mode": mode, "tokens_per_second": B * T / dt, "warmup_s": warmup,
                  "torch": torch.__version__}))
EOF
}

# The summary: what ran, and the benchmark table with MFU by Megatron's formula
# (num_floating_point_operations, without recomputation) against 989 TFLOP/s.
summarize() {
  python3 - "$RESULTS" <<'EOF'
import glob, json, os, sys
res = sys.argv[1]
PEAK = 989e12
# layers, hidden, query groups / heads, FFN / hidden x (3/2 with SwiGLU), padded vocabulary
SHAPES = {"124m": (12, 768, 1.0, 4.0, 50304), "350m": (24, 1024, 1.0, 4.0, 50304),
          "1b": (16, 2048, 0.25, 4.0 * 1.5, 128256)}


def flops_per_token(model, s=1024):
    # Megatron's num_floating_point_operations (training.py, core_r0.10.0) per token: fwd +
    # bwd, no recomputation, grouped-query attention and gated linear units included.
    l, h, kv, ffn, V = SHAPES[model]
    return 12 * l * h * h * ((1 + kv + s / h) + ffn + V / (2 * l * h))


def last_json(path, key):
    try:
        rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
        rows = [r for r in rows if key in r]
        return rows[-1] if rows else None
    except OSError:
        return None


out = ["# gpu-check summary", "", open(os.path.join(res, "machine.md")).read(), "## Parts", "",
       "| part | result | time |", "| --- | --- | --- |", open(os.path.join(res, "parts.md")).read(), "",
       "## Test output", ""]
# Each test part's verdict lines (its figures, failures, the sanitizer's summary), else its
# last lines: the summary is the one file sure to come back from the machine.
VERDICT = ("ok ", "[  PASSED", "[  FAILED", "differ", "ERROR SUMMARY", "error:")
for name in ("test_backend_ops", "test_train_parity", "test_cudnn", "test_checkpoint", "test_bf16", "test_tf32", "memcheck",
             "profile_124m"):
    try:
        lines = [l.rstrip() for l in open(os.path.join(res, name + ".log")) if l.strip()]
    except OSError:
        continue
    picked = [l for l in lines if any(v in l for v in VERDICT)][-16:] or lines[-4:]
    out += ["%s:" % name, "```"] + [l[:300] for l in picked] + ["```", ""]
out += ["## Benchmark (bf16, sequence 1024, no dropout; micro-batch 8, 1b: 4)", ""]
gemm = last_json(os.path.join(res, "gemm_8192.log"), "tflops")
out.append("8192^3 bf16 GEMM (torch.matmul, cuBLAS): %s TFLOP/s" % ("%.0f" % gemm["tflops"] if gemm else "n/a"))
out += ["", "| model | run | tokens/s | MFU (989 TFLOP/s) |", "| --- | --- | --- | --- |"]
for model in ("124m", "350m", "1b"):
    runs = [("tessera", last_json(os.path.join(res, "tessera_%s.jsonl" % model), "tokens_per_second")),
            ("tessera --deterministic-mode",
             last_json(os.path.join(res, "tessera_%s_deterministic.jsonl" % model), "tokens_per_second")),
            ("tessera --enable-cuda-graph",
             last_json(os.path.join(res, "tessera_%s_graph.jsonl" % model), "tokens_per_second"))]
    for mode in ("eager", "compile"):
        runs.append(("PyTorch " + mode, last_json(os.path.join(res, "torch_%s_%s.log" % (model, mode)),
                                                  "tokens_per_second")))
    for name, r in runs:
        if r:
            tps = r["tokens_per_second"]
            out.append("| %s | %s | %.0f | %.1f %% |" % (model, name, tps, 100 * tps * flops_per_token(model) / PEAK))
        else:
            out.append("| %s | %s | n/a | n/a |" % (model, name))
text = "\n".join(out) + "\n"
open(os.path.join(res, "summary.md"), "w").write(text)
print(text)
EOF
}

# Nsight Compute's per-kernel GPU time of one iteration (with its evaluation) of GPT-2 124M's
# width with 2 layers (every layer runs the same kernels; ncu replays each one, so the full
# 12 layers would not fit the budget): the 15 kernels that take longest, from ncu's CSV.
tessera_profile() {
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n $ncu ]] || { echo "no ncu on this machine"; return 77; }
  "$ncu" --metrics gpu__time_duration.sum --csv --print-units base -c 1000 "$TESSERA.bin" train \
    --num-layers 2 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
    --micro-batch-size 8 --global-batch-size 8 --bf16 --tokenizer-type NullTokenizer --vocab-size 50257 \
    --mock-data --lr 6e-4 --train-iters 1 --eval-iters 1 --eval-interval 1000 --device cuda >"$RESULTS/ncu.csv" || return 1
  python3 - "$RESULTS/ncu.csv" <<'EOF'
import collections, csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
name, value = rows[0].index("Kernel Name"), rows[0].index("Metric Value")
ms, calls = collections.Counter(), collections.Counter()
for r in rows[1:]:
    try:
        ms[r[name][:80]] += float(r[value].replace(",", "")) / 1e6
        calls[r[name][:80]] += 1
    except ValueError:
        pass
print("ok  profile: %.1f ms of GPU time in %d kernels" % (sum(ms.values()), sum(calls.values())))
for k, v in ms.most_common(15):
    print("ok  %9.2f ms %5d  %s" % (v, calls[k], k))
EOF
}

run() {
  local bundle=${1:-build-cuda/gpu-bundle.tar.xz} peers=1
  [[ ${2:-} == --no-peers ]] && peers=0
  [[ -f $bundle ]] || die "no $bundle: run '$0 bundle' on the build machine and carry the file"
  RESULTS=${OUT:-/tmp}/gpu-check
  mkdir -p "$RESULTS"
  : >"$RESULTS/parts.md"
  local work
  work=$(mktemp -d)
  xz -dc "$bundle" | tar -C "$work" -xf - || die "cannot unpack $bundle"
  local bin=$work/tessera-gpu/bin nvidia libpath
  nvidia=$(nvidia_library_path)
  libpath="$work/tessera-gpu/lib:$nvidia${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The bundled libraries (an older libstdc++ among them) only for tessera's own binaries:
  # each becomes a wrapper that sets the path, so python3 and torch keep the machine's own.
  for b in tessera backend_ops_test precision_test; do
    mv "$bin/$b" "$bin/$b.bin"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libpath" "$bin/$b.bin" >"$bin/$b"
    chmod +x "$bin/$b"
  done
  export TESSERA=$bin/tessera RESULTS
  local ops_test=$bin/backend_ops_test
  {
    echo "$(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
    python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1
    echo "tessera's LD_LIBRARY_PATH=$libpath"
    LD_LIBRARY_PATH=$libpath ldd "$bin/tessera.bin" | grep -E 'not found|cublas|cudnn|nvrtc|nccl|cudart' || true
    echo '```'
    echo
  } >"$RESULTS/machine.md"
  local missing
  missing=$(LD_LIBRARY_PATH=$libpath ldd "$bin/tessera.bin" | awk '/not found/ {print $1}' | tr '\n' ' ')
  if [[ -n $missing ]]; then
    echo "| libraries | FAILED: ${missing}not found (pip's nvidia-* packages for CUDA 13?) |  |" >>"$RESULTS/parts.md"
    summarize
    return 1
  fi
  # Ordered by importance: what is cut when the budget runs out comes last.
  # A tiny model's flags, so the doctor's config rows pass and its exit status is the GPU's.
  part doctor 20 "$TESSERA" doctor --device cuda --mock-data --tokenizer-type NullTokenizer --vocab-size 60 \
    --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
    --micro-batch-size 2 --global-batch-size 8 --train-iters 2 --lr 1e-3
  part test_backend_ops 60 python3 tests/integration/cuda_test.py "$TESSERA" ops "$ops_test"
  # Every op against float64 within its class's bound on the GPU (the MoE permutes, RoPE, ...).
  part test_precision 30 "$bin/precision_test" --gtest_filter='*cuda*'
  part test_train_parity 40 python3 tests/integration/cuda_test.py "$TESSERA" train
  part test_cudnn 30 python3 tests/integration/cuda_test.py "$TESSERA" cudnn
  part tessera_124m 45 tessera_bench 124m
  part tessera_124m_deterministic 45 tessera_bench 124m deterministic
  if ((peers)); then
    part torch_124m_eager 25 torch_bench 124m eager
    part torch_124m_compile 50 torch_bench 124m compile
  fi
  part tessera_350m 50 tessera_bench 350m
  part tessera_1b 60 tessera_bench 1b
  # What this branch added (native RoPE, embedding backward and MoE kernels; CUDA graphs):
  # its parity first, then the graph's speed beside the eager 124M run above.
  part test_llama 40 python3 tests/integration/cuda_test.py "$TESSERA" llama
  part test_moe 25 python3 tests/integration/cuda_test.py "$TESSERA" moe
  part test_graph 30 python3 tests/integration/cuda_test.py "$TESSERA" graph
  part tessera_124m_graph 45 tessera_bench 124m graph
  part profile_124m 60 env LD_LIBRARY_PATH="$libpath" bash -c "$(declare -f tessera_profile); tessera_profile"
  if ((peers)); then
    part torch_350m_eager 25 torch_bench 350m eager
    part torch_350m_compile 50 torch_bench 350m compile
    part gemm_8192 15 torch_bench gemm
  fi
  part tessera_350m_deterministic 50 tessera_bench 350m deterministic
  part tessera_1b_deterministic 60 tessera_bench 1b deterministic
  part test_bf16 30 python3 tests/integration/cuda_test.py "$TESSERA" bf16
  part test_checkpoint 40 python3 tests/integration/cuda_test.py "$TESSERA" checkpoint
  part test_tf32 30 python3 tests/integration/cuda_test.py "$TESSERA" tf32
  # Out-of-bounds accesses and uninitialised reads in tessera's kernels: a tiny f32 run
  # (hidden dropout on; attention dropout off, so the fused attention runs, on the shared
  # flash kernel as f32 does; evaluation included) under compute-sanitizer.
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [[ -n $sanitizer ]]; then
    part memcheck 40 env LD_LIBRARY_PATH="$libpath" "$sanitizer" --error-exitcode 3 --tool memcheck \
      "$bin/tessera.bin" train --device cuda --mock-data --tokenizer-type NullTokenizer --vocab-size 60 \
      --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
      --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --eval-interval 2 --eval-iters 1 --lr 1e-3 \
      --hidden-dropout 0.1 --attention-dropout 0
    # The native RoPE, embedding-backward and MoE kernels in bf16 (a Llama layout with experts).
    part memcheck_llama_moe 40 env LD_LIBRARY_PATH="$libpath" "$sanitizer" --error-exitcode 3 --tool memcheck \
      "$bin/tessera.bin" train --device cuda --mock-data --tokenizer-type NullTokenizer --vocab-size 60 \
      --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
      --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr 1e-3 --bf16 --hidden-dropout 0 \
      --attention-dropout 0 --normalization RMSNorm --position-embedding-type rope --swiglu \
      --group-query-attention --num-query-groups 2 --disable-bias-linear --num-experts 4 --moe-router-topk 2
  fi
  summarize
}

case ${1:-} in
  bundle) bundle "${@:2}" ;;
  run) run "${@:2}" ;;
  *) die "usage: $0 bundle [BUILD_DIR] | run [BUNDLE] [--no-peers]" ;;
esac
