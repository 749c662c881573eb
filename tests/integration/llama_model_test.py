#!/usr/bin/python3
"""The Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied embeddings, no
linear biases) through `tessera train`, against its own single-process run:
- every parallel layout (TP with query groups split over ranks, SP, PP 1F1B and interleaved,
  DP with the distributed optimizer, their products) and both recomputations give the losses
  and gradient norms of one process within 1e-5 relative over 10 iterations (dropout on for
  some: the masks are keyed by full-tensor element);
- the strict test device gives the CPU's bits;
- --bf16 layouts stay within the mixed-precision test's bounds of one bf16 process;
- checkpoints: a resume is bit-exact; a TP=2 save (SwiGLU's fc1 split as [gate_r; up_r])
  resumes at PP=2, in tessera's format and in Megatron's (--ckpt-format torch);
- the memory estimate is what a Llama rank allocates;
- the variants (Qwen2's --add-qkv-bias, --rotary-percent 0.5, RoPE without query groups)
  train and split over TP;
- bad flags (query groups that do not divide the heads or TP, an odd rotated width) are
  errors naming the flag.
The model is tiny: hidden 32, 4 heads in 2 query groups (head dim 8), SwiGLU's default
ffn size int(4*32*2/3/64)*64 = 64.
usage: llama_model_test.py TESSERA_BINARY"""
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mixed_precision_test as mixed  # noqa: E402  (the bf16 tolerance)
import model_parallel_test as mp  # noqa: E402  (the tiny run, its runner and log reader)

LLAMA = ["--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
         "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
         "--disable-bias-linear"]
FOUR = LLAMA + mp.FOUR
EIGHT = LLAMA + mp.EIGHT

# (label, processes, flags)
LAYOUTS = [
    ("tp2", 2, ["--tensor-model-parallel-size", "2"]),
    ("tp2 sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ("pp2", 2, ["--pipeline-model-parallel-size", "2"]),
    ("pp4 interleaved", 4, ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1"]),
    ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                      "--overlap-param-gather", "--ddp-bucket-size", "3000"]),
    ("tp2 pp2 dp2", 8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    ("tp2 sp pp2 dp2", 8, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                           "--pipeline-model-parallel-size", "2"]),
    ("recompute full", 1, ["--recompute-granularity", "full", "--recompute-method", "uniform",
                           "--recompute-num-layers", "2"]),
    ("recompute selective", 1, ["--recompute-activations"]),
]
WITH_DROPOUT = ["tp2", "pp4 interleaved", "tp2 sp pp2 dp2", "recompute full"]


def test_layouts(tmp, dropout):
    extra = [] if dropout else mp.NO_DROPOUT
    tag = "dropout" if dropout else "no-dropout"
    references = {}
    for layers in (FOUR, EIGHT):
        references[layers[-1]], _ = mp.train(tmp, "llama single %s %s" % (layers[-1], tag), 1, layers + extra)
    fp32_gpt, _ = mp.train(tmp, "gpt single " + tag, 1, mp.FOUR + extra)
    assert references["4"][0]["lm_loss"] != fp32_gpt[0]["lm_loss"], "the Llama flags changed nothing"
    for label, procs, flags in LAYOUTS:
        if dropout and label not in WITH_DROPOUT:
            continue
        layers = EIGHT if "interleaved" in label else FOUR
        t0 = time.monotonic()
        got, _ = mp.train(tmp, "llama %s %s" % (label, tag), procs, layers + flags + extra)
        mp.compare(references[layers[-1]], got, label + " " + tag, exact=label.startswith("recompute"))
        print("ok  llama %-26s %-10s %d processes  %.1f s" % (label, tag, procs, time.monotonic() - t0), flush=True)
    if not dropout:
        strict, _ = mp.train(tmp, "llama strict", 1, FOUR + extra + ["--device", "strict"])
        mp.compare(references["4"], strict, "llama on the strict device", exact=True)
        print("ok  llama on the strict device: the CPU's bits", flush=True)


def test_bf16(tmp):
    bf16 = FOUR + mp.NO_DROPOUT + ["--bf16"]
    reference, _ = mp.train(tmp, "llama bf16 single", 1, bf16)
    fp32, _ = mp.train(tmp, "llama fp32 single", 1, FOUR + mp.NO_DROPOUT)
    mixed.compare_within(fp32, reference, "llama bf16 against fp32")
    for label, procs, flags in (("tp2 sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                                ("pp2", 2, ["--pipeline-model-parallel-size", "2"])):
        got, _ = mp.train(tmp, "llama bf16 " + label, procs, bf16 + flags)
        worst = mixed.compare_within(reference, got, "llama bf16 " + label)
        print("ok  llama bf16 %-8s worst relative difference: loss %.1e, grad norm %.1e"
              % (label, worst["lm_loss"], worst["grad_norm"]), flush=True)


def test_checkpoints(tmp):
    flags = FOUR + mp.NO_DROPOUT
    straight, _ = mp.train(tmp, "llama straight", 1, flags)
    ckpt = os.path.join(tmp, "llama_ckpt")
    first, _ = mp.train(tmp, "llama first half", 1, flags + ["--save", ckpt, "--save-interval", "5",
                                                              "--exit-interval", "5"])
    second, _ = mp.train(tmp, "llama second half", 1, flags + ["--load", ckpt])
    mp.compare(straight, first + second, "llama resume", exact=True)
    for fmt in ("tessera", "torch"):
        saved = os.path.join(tmp, "llama_tp2_" + fmt)
        fmt_flags = ["--ckpt-format", "torch"] if fmt == "torch" else []
        mp.train(tmp, "llama tp2 first half " + fmt, 2, flags + fmt_flags + [
            "--tensor-model-parallel-size", "2", "--save", saved, "--save-interval", "5", "--exit-interval", "5"])
        resumed, _ = mp.train(tmp, "llama pp2 second half " + fmt, 2, flags + fmt_flags + [
            "--pipeline-model-parallel-size", "2", "--load", saved])
        mp.compare(straight[5:], resumed, "llama TP=2 %s checkpoint resumed at PP=2" % fmt)
    print("ok  llama resume is bit-exact; TP=2 checkpoints (tessera, Megatron torch) resume at PP=2", flush=True)


THEORETICAL = re.compile(r"Theoretical memory footprints: .* total=([\d.]+) MB")
MEASURED = re.compile(r"max allocated: ([\d.]+)")


def test_memory():
    """The per-rank estimate every rank plans with is what a Llama rank allocates."""
    flags = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "64",
             "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "5000", "--mock-data", "--train-iters", "2",
             "--lr", "1e-4", "--eval-iters", "0", "--bf16"] + LLAMA
    p = subprocess.run([mp.TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "train",
                        "--tensor-model-parallel-size", "2"] + flags, capture_output=True, text=True, timeout=240,
                       env=mp.env_without_launch())
    assert p.returncode == 0, p.stderr[-3000:]
    estimate = float(THEORETICAL.search(p.stdout).group(1))
    measured = [float(x) for x in MEASURED.findall(p.stdout)]
    assert measured and all(estimate <= m <= estimate * 1.01 for m in measured), (estimate, measured)
    print("ok  llama TP=2 bf16: estimate %.2f MB, max allocated %s MB" % (estimate, measured), flush=True)


def test_variants(tmp):
    """Qwen2's qkv bias, a partial rotation and RoPE without query groups: one process and TP=2
    agree."""
    base = [f for f in FOUR if f not in ("--group-query-attention", "--num-query-groups", "2")]
    variants = [("add-qkv-bias", FOUR + ["--add-qkv-bias"]),
                ("rotary-percent 0.5", FOUR + ["--rotary-percent", "0.5", "--rotary-base", "500000"]),
                ("rope, no query groups", base)]
    for label, flags in variants:
        single, _ = mp.train(tmp, "llama %s single" % label, 1, flags + mp.NO_DROPOUT)
        tp2, _ = mp.train(tmp, "llama %s tp2" % label, 2, flags + mp.NO_DROPOUT + ["--tensor-model-parallel-size", "2"])
        mp.compare(single, tp2, "llama %s tp2" % label)
        print("ok  llama %-22s TP=2 equals one process" % label, flush=True)


def test_errors():
    cases = [
        ([f if f != "2" else "3" for f in LLAMA] + mp.FOUR,
         "--num-attention-heads 4 is not divisible by --num-query-groups 3"),
        (FOUR + ["--tensor-model-parallel-size", "4"], "--num-query-groups (2) is not divisible by "
                                                       "--tensor-model-parallel-size 4"),
        (FOUR + ["--rotary-percent", "0.2"], "RoPE needs an even number"),
        (FOUR + ["--rotary-percent", "1.5"], "--rotary-percent must be in (0, 1]"),
        (FOUR + ["--normalization", "ScaleNorm"], "--normalization"),
    ]
    for flags, message in cases:
        world = 4 if "--tensor-model-parallel-size" in flags else 1
        env = mp.env_without_launch()
        if world > 1:
            env.update({"RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(mp.ports.claim(2))})
        p = subprocess.run([mp.TESSERA, "train"] + mp.TRAIN + flags + ["--dry-run"], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 2 and message in p.stderr, (flags, p.returncode, p.stderr[-2000:])
    print("ok  bad Llama flags are usage errors naming the flag", flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_errors()
        test_memory()
        test_layouts(tmp, dropout=False)
        test_layouts(tmp, dropout=True)
        test_bf16(tmp)
        test_checkpoints(tmp)
        test_variants(tmp)


if __name__ == "__main__":
    main()
