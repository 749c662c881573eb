#!/usr/bin/python3
"""The CUDA backend end to end; one part per run:
- no-gpu: on a machine where the CUDA runtime sees no GPU, `tessera train --device cuda`
  exits 1 with an error saying that no CUDA device is visible and why, and a hint (runs in
  CI; skipped where a GPU is visible);
- ops: backend_ops_test's cases on every CUDA device (every op of ops.h forward and
  backward against the CPU backend, per-op tolerances);
- train: `tessera train --device cuda` on a small GPT gives the losses and gradient norms
  of `--device cpu` within 1e-5 relative over 10 iterations, dropout on, f32 (the
  backends sum in different orders: a few f32 ulp per op, the bound the OpenCL backend and
  the parallel layouts are held to);
- checkpoint: a checkpoint saved on CUDA at iteration 5 resumes on the CPU with the next
  losses of an uninterrupted CPU run (within 1e-5), and one saved on the CPU resumes on CUDA;
  a --bf16 one saved on CUDA resumes on the CPU within the bf16 bounds below;
- bf16: `--bf16` (16-bit storage, f32 main parameters) on CUDA stays within 2e-3 (loss) and
  2e-2 (gradient norm) relative of `--bf16` on the CPU over 10 iterations (the GEMMs round
  their bf16 outputs after summing in another order);
- tf32: with --tf32 the same run stays within 5e-3 relative of the CPU but is not the exact
  f32 result (TF32 keeps 10 mantissa bits of each GEMM operand: the flag took effect);
- cudnn: `--bf16` without attention dropout, where CUDA's fused attention runs cuDNN's SDPA
  (ops/cuda/flash_route.h) and the linear + GeLU cuBLASLt's GELU_AUX_BIAS epilogue, within
  the bf16 bounds of the CPU;
- llama: the Llama layout (RMSNorm, RoPE, grouped-query attention, SwiGLU) on CUDA within 1e-5
  of the CPU in f32 with dropout (the native RoPE kernels, rope_kernels.cu, and the unfused
  attention), then in `--bf16` without dropout (RoPE before cuDNN's SDPA) within the bf16 bounds;
- moe: a mixture of experts (4 experts, top-2) on CUDA within 1e-5 of the CPU in f32 (the
  native permute kernels, moe_kernels.cu, and one cuBLASLt linear per expert);
- graph: `--enable-cuda-graph` (the step captured on the second iteration and replayed after)
  gives the bits of the same run without it, f32 GPT with dropout and bf16 Llama without;
- two-gpu: `tessera launch --nproc_per_node 2` on two GPUs with NCCL (data parallel with
  --overlap-grad-reduce, then the distributed optimizer with --overlap-param-gather, then
  tensor parallel with sequence parallelism), each within 1e-5 relative of one CPU process;
  exit 77 with fewer than two GPUs.
no-gpu also checks that --tf32 on the CPU says it has no effect and changes nothing, and
that `tessera doctor` says there is no GPU: INFO rows with --device cpu (exit 0), FAIL rows
with a fix for --device cuda (exit 1).
ops, train and tf32 exit 77 (skipped) with a message when no GPU is visible.
usage: cuda_test.py TESSERA_BINARY no-gpu|ops|train|checkpoint|bf16|tf32|cudnn|llama|moe|graph|two-gpu
       [BACKEND_OPS_TEST_BINARY]"""
import json
import os
import re
import subprocess
import sys
import tempfile

TESSERA = os.path.abspath(sys.argv[1])
TRAIN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--make-vocab-size-divisible-by", "16",
         "--mock-data", "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "10", "--log-interval", "1",
         "--eval-iters", "1", "--eval-interval", "5", "--weight-decay", "0.1", "--clip-grad", "0.5",
         "--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
RTOL = 1e-5
# TF32 rounds each GEMM operand to 10 mantissa bits (relative 2^-11 ~ 5e-4 per element);
# over 10 iterations of a 2-layer model the loss and grad norm move by a few times that.
TF32_RTOL = 5e-3
# --bf16 on two backends: the GEMMs round their bf16 outputs after summing in another order.
BF16_LOSS_RTOL, BF16_NORM_RTOL = 2e-3, 2e-2
NO_GPU = "no CUDA device is visible"


def run(args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def gpu_visible():
    p = run([TESSERA, "train"] + TRAIN + ["--device", "cuda", "--dry-run"], timeout=120)
    if p.returncode != 0 and NO_GPU in p.stderr:
        return False
    assert p.returncode == 0, "rc %d\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return True


def train(tmp, device, extra=(), launch=()):
    path = os.path.join(tmp, "%s_%d.jsonl" % (device, len(os.listdir(tmp))))
    cmd = [TESSERA] + (["launch", "--standalone"] + list(launch) if launch else []) + ["train"]
    p = run(cmd + TRAIN + ["--device", device, "--log-json", path] + list(extra))
    assert p.returncode == 0, "%s: rc %d\n%s\n%s" % (device, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return [json.loads(l) for l in open(path)]


def test_no_gpu():
    p = run([TESSERA, "train"] + TRAIN + ["--device", "cuda"])
    assert p.returncode == 1, "rc %d (wanted 1)\n%s" % (p.returncode, p.stderr[-2000:])
    assert "error: --device cuda: " + NO_GPU in p.stderr, p.stderr[-2000:]
    assert "hint: " in p.stderr and "--device cpu" in p.stderr, p.stderr[-2000:]
    print("ok  --device cuda without a GPU: exit 1, " + p.stderr.strip().splitlines()[-2][:120])
    test_tf32_on_cpu()
    test_doctor_without_gpu()
    return 0


def doctor_rows(device):
    p = run([TESSERA, "doctor", "--json"] + TRAIN + ["--device", device], timeout=120)
    rows = {r["check"]: r for r in json.loads(p.stdout)["checks"]}
    return p.returncode, rows


def test_doctor_without_gpu():
    rc, rows = doctor_rows("cpu")
    assert rc == 0, "doctor --device cpu: rc %d\n%s" % (rc, json.dumps(rows, indent=1)[-3000:])
    gpus = rows["cuda: GPUs"]
    assert gpus["status"] == "INFO" and gpus["detail"].startswith("no GPU ("), gpus
    assert rows["cuda: libraries"]["status"] == "PASS" and "NCCL 2." in rows["cuda: libraries"]["detail"], rows
    assert "cuda: GEMM" not in rows and "cuda: NCCL all_reduce" not in rows, sorted(rows)
    rc, rows = doctor_rows("cuda")
    assert rc == 1, "doctor --device cuda without a GPU: rc %d (wanted 1)" % rc
    gpus = rows["cuda: GPUs"]
    assert gpus["status"] == "FAIL" and gpus["detail"].startswith("no GPU (") and "--device cpu" in gpus["fix"], gpus
    print("ok  doctor without a GPU: " + gpus["detail"][:100])


def test_tf32_on_cpu():
    with tempfile.TemporaryDirectory() as tmp:
        p = run([TESSERA, "train"] + TRAIN + ["--device", "cpu", "--tf32", "--train-iters", "2"])
        assert p.returncode == 0, "rc %d\n%s" % (p.returncode, p.stderr[-2000:])
        assert "warning: --tf32 has no effect on cpu: its f32 GEMMs stay exact" in p.stderr, p.stderr[-2000:]
        exact = train(tmp, "cpu", ["--train-iters", "2"])
        tf32 = train(tmp, "cpu", ["--train-iters", "2", "--tf32"])
    assert [(r["lm_loss"], r["grad_norm"]) for r in exact] == [(r["lm_loss"], r["grad_norm"]) for r in tf32]
    print("ok  --tf32 on the CPU: a warning, and the same bits as without it")


def relative_gap(a_rows, b_rows, key=None):
    worst = 0.0
    for a, b in zip(a_rows, b_rows):
        for k in (key,) if key else ("lm_loss", "grad_norm"):
            worst = max(worst, abs(a[k] - b[k]) / abs(a[k]))
    return worst


def test_checkpoint():
    with tempfile.TemporaryDirectory() as tmp:
        cpu = train(tmp, "cpu")
        for saver, loader in (("cuda", "cpu"), ("cpu", "cuda")):
            ckpt = os.path.join(tmp, "ckpt_" + saver)
            train(tmp, saver, ["--save", ckpt, "--save-interval", "5", "--exit-interval", "5"])
            resumed = train(tmp, loader, ["--load", ckpt])
            assert [r["iteration"] for r in resumed] == list(range(6, 11)), [r["iteration"] for r in resumed]
            gap = relative_gap(cpu[5:], resumed)
            assert gap <= RTOL, "saved on %s, resumed on %s: %.3g relative of the CPU" % (saver, loader, gap)
            print("ok  saved on %s at 5, resumed on %s: iterations 6-10 within %.2g relative" % (saver, loader, gap))
        # 16-bit parameters and f32 main parameters staged out of and into the GPU.
        cpu16 = train(tmp, "cpu", ["--bf16"])
        ckpt = os.path.join(tmp, "ckpt_bf16")
        train(tmp, "cuda", ["--bf16", "--save", ckpt, "--save-interval", "5", "--exit-interval", "5"])
        resumed = train(tmp, "cpu", ["--bf16", "--load", ckpt])
        loss, norm = relative_gap(cpu16[5:], resumed, "lm_loss"), relative_gap(cpu16[5:], resumed, "grad_norm")
        assert loss <= BF16_LOSS_RTOL and norm <= BF16_NORM_RTOL, \
            "bf16 saved on cuda: loss %.3g, norm %.3g" % (loss, norm)
        print("ok  --bf16 saved on cuda at 5, resumed on cpu: loss within %.2g, grad norm within %.2g" % (loss, norm))
    return 0


def bf16_parity(flags, what):
    """`--bf16` with `flags` on CUDA against the CPU, within the bf16 bounds."""
    with tempfile.TemporaryDirectory() as tmp:
        cpu, gpu = train(tmp, "cpu", ["--bf16"] + flags), train(tmp, "cuda", ["--bf16"] + flags)
    assert [r["iteration"] for r in gpu] == list(range(1, 11)), [r["iteration"] for r in gpu]
    loss, norm = relative_gap(cpu, gpu, "lm_loss"), relative_gap(cpu, gpu, "grad_norm")
    assert loss <= BF16_LOSS_RTOL and norm <= BF16_NORM_RTOL, \
        "%s: loss %.3g, grad norm %.3g relative of the CPU" % (what, loss, norm)
    print("ok  %s: 10 iterations, loss within %.2g and grad norm within %.2g relative of the CPU" % (what, loss, norm))


def test_bf16():
    bf16_parity([], "cuda --bf16")
    return 0


def test_tf32():
    with tempfile.TemporaryDirectory() as tmp:
        cpu, gpu = train(tmp, "cpu"), train(tmp, "cuda", ["--tf32"])
    assert [r["iteration"] for r in gpu] == list(range(1, 11)), [r["iteration"] for r in gpu]
    gap = relative_gap(cpu, gpu)
    assert 0 < gap <= TF32_RTOL, "--tf32 on cuda: %.3g relative of the CPU (wanted in (0, %g])" % (gap, TF32_RTOL)
    print("ok  cuda --tf32: 10 iterations within %.2g relative of the CPU (exact f32 is held to %g)" % (gap, RTOL))
    return 0


def without_dropout(flags):
    return [f if flags[i - 1] not in ("--hidden-dropout", "--attention-dropout") else "0" for i, f in enumerate(flags)]


def test_cudnn():
    global TRAIN
    TRAIN = without_dropout(TRAIN)
    bf16_parity([], "cuda --bf16 without dropout (cuDNN attention, cuBLASLt GeLU epilogue)")
    return 0


# tests/integration/llama_model_test.py's LLAMA flags: 4 heads in 2 query groups.
LLAMA = ["--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
         "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
         "--disable-bias-linear"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear"]


def f32_parity(flags, what):
    with tempfile.TemporaryDirectory() as tmp:
        cpu, gpu = train(tmp, "cpu", flags), train(tmp, "cuda", flags)
    assert [r["iteration"] for r in gpu] == list(range(1, 11)), [r["iteration"] for r in gpu]
    gap = relative_gap(cpu, gpu)
    assert gap <= RTOL, "%s on cuda: %.3g relative of the CPU" % (what, gap)
    print("ok  %s on cuda, f32: 10 iterations within %.2g relative of the CPU" % (what, gap))


def test_llama():
    f32_parity(LLAMA, "llama (RMSNorm, RoPE, GQA, SwiGLU)")
    global TRAIN
    TRAIN = without_dropout(TRAIN)
    bf16_parity(LLAMA, "llama --bf16 without dropout on cuda (RoPE, then cuDNN)")
    return 0


def test_moe():
    f32_parity(MOE, "MoE (4 experts, top-2)")
    return 0


def test_graph():
    for flags, what in (([], "gpt f32 with dropout"), (["--bf16"] + LLAMA, "llama bf16")):
        with tempfile.TemporaryDirectory() as tmp:
            eager = train(tmp, "cuda", flags)
            graph = train(tmp, "cuda", flags + ["--enable-cuda-graph"])
        for a, b in zip(eager, graph):
            for key in ("lm_loss", "grad_norm"):
                assert a[key] == b[key], (what, b["iteration"], key, a[key], b[key])
        print("ok  %s: --enable-cuda-graph replays the step with the eager run's bits" % what)
    return 0


def gpu_count():
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([l for l in p.stdout.splitlines() if l.startswith("GPU ")]) if p.returncode == 0 else 0


def test_two_gpu():
    if gpu_count() < 2:
        print("skipped: fewer than two GPUs (this test needs two; NCCL between ranks has not run anywhere else)")
        return 77
    layouts = [["--overlap-grad-reduce"],
               ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"],
               ["--tensor-model-parallel-size", "2", "--sequence-parallel"]]
    with tempfile.TemporaryDirectory() as tmp:
        cpu = train(tmp, "cpu")
        for flags in layouts:
            gpu = train(tmp, "cuda", flags + ["--distributed-backend", "nccl"], launch=["--nproc_per_node", "2"])
            gap = relative_gap(cpu, gpu)
            assert gap <= RTOL, "two GPUs with %s: %.3g relative of one CPU process" % (" ".join(flags), gap)
            print("ok  two GPUs, NCCL, %s: 10 iterations within %.2g relative of the CPU" % (" ".join(flags), gap))
    return 0


def test_ops():
    p = run([os.path.abspath(sys.argv[3]), "--gtest_filter=*/cuda_*"], timeout=1200)
    print(p.stdout[-6000:])
    assert p.returncode == 0, p.stderr[-3000:]
    passed = re.search(r"\[  PASSED  \] (\d+) test", p.stdout)
    assert passed and int(passed.group(1)) > 0, "no CUDA case ran"
    return 0


def test_train():
    with tempfile.TemporaryDirectory() as tmp:
        cpu, gpu = train(tmp, "cpu"), train(tmp, "cuda")
    assert [r["iteration"] for r in gpu] == list(range(1, 11)), [r["iteration"] for r in gpu]
    worst = 0.0
    for a, b in zip(cpu, gpu):
        for key in ("lm_loss", "grad_norm"):
            rel = abs(a[key] - b[key]) / abs(a[key])
            worst = max(worst, rel)
            assert rel <= RTOL, (b["iteration"], key, a[key], b[key])
    print("ok  cuda, 1 process: 10 iterations within %.2g relative of the CPU" % worst)
    return 0


def main():
    part = sys.argv[2]
    visible = gpu_visible()
    if part == "no-gpu":
        if visible:
            print("skipped: a GPU is visible; this test checks the error on a machine without one")
            return 77
        return test_no_gpu()
    if not visible:
        print("skipped: no CUDA device is visible (this test needs a GPU; scripts/gpu-check.sh runs it on one)")
        return 77
    parts = {"ops": test_ops, "train": test_train, "checkpoint": test_checkpoint, "bf16": test_bf16,
             "tf32": test_tf32, "cudnn": test_cudnn, "llama": test_llama, "moe": test_moe,
             "graph": test_graph,
             "two-gpu": test_two_gpu}
    return parts[part]()


if __name__ == "__main__":
    sys.exit(main())
