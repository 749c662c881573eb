#!/usr/bin/python3
"""16-bit storage (--bf16, --fp16; Megatron's Float16Module) through the command line:
- one bf16 process on the strict test device gives the CPU's bits;
- parallel layouts in bf16 (TP=2, TP=2 with --sequence-parallel, PP=2, DP=2 with overlapped
  buckets, TP=2 x PP=2) stay within a stated tolerance of one bf16 process over 10 iterations,
  and pure pipeline parallelism of an untied bf16 model gives the single process's bits;
- a bf16 resume is bit-exact, and a TP=2 bf16 checkpoint resumes at PP=2;
- the activation memory of a --bf16 run (the estimate, and the measured `max allocated` less
  the weights and optimizer) is at most 0.6x the fp32 run's, for GPT-2 124M at micro-batch 4,
  sequence 256 (estimate, from --dry-run) and for a small model that really trains;
- the per-rank estimate with and without the distributed optimizer is what each rank allocates;
- a bf16 run's checkpoint save and load (replicated, and the distributed optimizer at DP=2)
  stream the f32 main parameters and the optimizer state one tensor or piece at a time: each
  adds well under the main parameters' size to a rank's peak resident memory; Megatron's
  distrib_optim.pt adds its gathered state and one of its tensors, no copy of the file.
usage: mixed_precision_test.py TESSERA_BINARY"""
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_parallel_test as mp  # noqa: E402  (the same tiny model, runner and log reader)

# A bf16 layout sums the same products in another order (TP splits the GEMMs' reductions,
# tensor-parallel partial sums are rounded to bf16 once more after the all-reduce), and every
# activation is rounded to 8 mantissa bits. Measured over the 10 iterations of this model
# (worst case, TP=2): losses 4.5e-5 relative, gradient norms 2.4e-3; layouts that do not split
# the GEMMs (PP, DP) agree to rounding of the norm's f64 sum. The bounds leave ~4x margin.
LOSS_RTOL, NORM_RTOL = 2e-4, 1e-2
BF16 = ["--bf16"] + mp.NO_DROPOUT + mp.FOUR

LAYOUTS = [
    ("bf16 tp2", 2, ["--tensor-model-parallel-size", "2"]),
    ("bf16 tp2 sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ("bf16 pp2", 2, ["--pipeline-model-parallel-size", "2"]),
    ("bf16 dp2 overlap", 2, ["--overlap-grad-reduce", "--ddp-bucket-size", "3000"]),
    ("bf16 tp2 pp2", 4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
]


def compare_within(reference, got, label):
    assert [r["iteration"] for r in got] == [r["iteration"] for r in reference], label
    worst = {"lm_loss": 0.0, "grad_norm": 0.0}
    for a, b in zip(reference, got):
        for key, rtol in (("lm_loss", LOSS_RTOL), ("grad_norm", NORM_RTOL)):
            err = abs(a[key] - b[key]) / abs(a[key])
            worst[key] = max(worst[key], err)
            assert err <= rtol, (label, a["iteration"], key, a[key], b[key])
    return worst


def test_bf16_layouts(tmp):
    reference, _ = mp.train(tmp, "bf16 single", 1, BF16)
    fp32, _ = mp.train(tmp, "fp32 single", 1, mp.NO_DROPOUT + mp.FOUR)
    assert [r["lm_loss"] for r in reference] != [r["lm_loss"] for r in fp32], "--bf16 changed nothing"
    compare_within(fp32, reference, "bf16 against fp32")
    # The strict device (host memory the model may not read): the CPU kernels, the same bits.
    strict, _ = mp.train(tmp, "bf16 strict", 1, BF16 + ["--device", "strict"])
    mp.compare(reference, strict, "bf16 on the strict device", exact=True)
    for label, procs, flags in LAYOUTS:
        t0 = time.monotonic()
        got, _ = mp.train(tmp, label, procs, BF16 + flags)
        worst = compare_within(reference, got, label)
        print("ok  %-18s %d processes, worst relative difference: loss %.1e, grad norm %.1e  %.1f s"
              % (label, procs, worst["lm_loss"], worst["grad_norm"], time.monotonic() - t0), flush=True)
    untied = BF16 + ["--untie-embeddings-and-output-weights"]
    single, _ = mp.train(tmp, "bf16 single untied", 1, untied)
    got, _ = mp.train(tmp, "bf16 pp2 untied", 2, untied + ["--pipeline-model-parallel-size", "2"])
    mp.compare(single, got, "bf16 pp2 untied", exact=True)
    print("ok  pure PP of an untied bf16 model is bit-exact", flush=True)


def test_bf16_checkpoints(tmp):
    """tessera's checkpoints keep the f32 main parameters: a bf16 run stopped and resumed gives
    the uninterrupted run's bits, and a TP=2 save resumes at PP=2 (resharded) within the
    layout bound."""
    straight, _ = mp.train(tmp, "bf16 straight", 1, BF16)
    ckpt = os.path.join(tmp, "bf16_ckpt")
    first, _ = mp.train(tmp, "bf16 first half", 1, BF16 + ["--save", ckpt, "--save-interval", "5",
                                                           "--exit-interval", "5"])
    second, _ = mp.train(tmp, "bf16 second half", 1, BF16 + ["--load", ckpt])
    mp.compare(straight, first + second, "bf16 resume", exact=True)
    tp_ckpt = os.path.join(tmp, "bf16_tp2_ckpt")
    mp.train(tmp, "bf16 tp2 first half", 2, BF16 + ["--tensor-model-parallel-size", "2", "--save", tp_ckpt,
                                                    "--save-interval", "5", "--exit-interval", "5"])
    resharded, _ = mp.train(tmp, "bf16 pp2 second half", 2, BF16 + ["--pipeline-model-parallel-size", "2",
                                                                     "--load", tp_ckpt])
    compare_within(straight[5:], resharded, "bf16 TP=2 save resumed at PP=2")
    print("ok  bf16 resume is bit-exact; a TP=2 bf16 checkpoint resumes at PP=2", flush=True)


THEORETICAL = re.compile(r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB, activation=([\d.]+) MB")
MEASURED = re.compile(r"max allocated: ([\d.]+)")


def memory(flags):
    p = subprocess.run([mp.TESSERA, "train"] + flags, capture_output=True, text=True, timeout=240,
                          env=mp.env_without_launch())
    assert p.returncode == 0, p.stderr[-3000:]
    weights, activations = (float(x) for x in THEORETICAL.search(p.stdout).groups())
    measured = MEASURED.search(p.stdout)
    return weights, activations, float(measured.group(1)) if measured else None


def test_activation_memory():
    gpt2 = ["--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "256",
            "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "4",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "50256", "--mock-data", "--train-iters", "1",
            "--lr", "1e-4", "--dry-run"]
    _, fp32, _ = memory(gpt2)
    _, bf16, _ = memory(gpt2 + ["--bf16"])
    assert bf16 <= 0.6 * fp32, (bf16, fp32)
    print("ok  GPT-2 124M at micro-batch 4, seq 256: activation estimate %.0f MB in bf16, %.0f MB in fp32 (%.2fx)"
          % (bf16, fp32, bf16 / fp32), flush=True)
    # A model whose activations outweigh its weights, trained for 2 iterations: what was measured.
    small = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "256",
             "--max-position-embeddings", "256", "--micro-batch-size", "4", "--global-batch-size", "4",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "500", "--mock-data", "--train-iters", "2",
             "--lr", "1e-4", "--eval-iters", "0"]
    ratio = {}
    for tag, extra in (("fp32", []), ("bf16", ["--bf16"])):
        weights, estimate, peak = memory(small + extra)
        measured = peak - weights
        # The estimate is the activation slab the model allocates; the measured peak adds only
        # small per-step buffers (the batch, the norm slots).
        assert estimate <= measured <= estimate * 1.1 + 1.0, (tag, estimate, measured)
        ratio[tag] = measured
    assert ratio["bf16"] <= 0.6 * ratio["fp32"], ratio
    print("ok  measured activation memory (max allocated - weights and optimizer): %.1f MB bf16, %.1f MB fp32 "
          "(%.2fx)" % (ratio["bf16"], ratio["fp32"], ratio["bf16"] / ratio["fp32"]), flush=True)


TOTAL = re.compile(r"Theoretical memory footprints: .* total=([\d.]+) MB")


def test_distributed_optimizer_memory():
    """Megatron's bytes per parameter with and without the distributed optimizer (bf16, DP=2):
    the estimate every rank plans with is what each rank then allocates."""
    flags = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "64",
             "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "5000", "--mock-data", "--train-iters", "2",
             "--lr", "1e-4", "--eval-iters", "0", "--bf16"]
    totals = {}
    for tag, extra in (("replicated", []), ("distributed", ["--use-distributed-optimizer"])):
        p = subprocess.run([mp.TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "train"] + flags + extra,
                           capture_output=True, text=True, timeout=240, env=mp.env_without_launch())
        assert p.returncode == 0, p.stderr[-3000:]
        estimate = float(TOTAL.search(p.stdout).group(1))
        measured = [float(x) for x in MEASURED.findall(p.stdout)]
        assert len(measured) == 2, p.stdout[-2000:]
        # The slabs are the estimate; the batch and the norm slots add well under 1%. The log
        # rounds the estimate to 0.01 MB, hence the 0.005 below it.
        assert all(estimate - 0.005 <= m <= estimate * 1.01 for m in measured), (tag, estimate, measured)
        totals[tag] = estimate
    assert totals["distributed"] < 0.85 * totals["replicated"], totals
    print("ok  bf16 DP=2 per rank: %.1f MB replicated, %.1f MB with the distributed optimizer (estimate = max "
          "allocated)" % (totals["replicated"], totals["distributed"]), flush=True)


PEAK_RESIDENT = re.compile(r"\[Rank \d+\] .* peak resident: ([\d.]+)")


def peak_resident_mb(procs, flags):
    """The largest peak resident memory (MB) of the run's ranks (each logs its own rusage)."""
    launch = [mp.TESSERA, "launch", "--standalone", "--nproc_per_node", str(procs)] if procs > 1 else [mp.TESSERA]
    env = mp.env_without_launch()
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run(launch + ["train"] + flags, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    peaks = [float(x) for x in PEAK_RESIDENT.findall(p.stdout)]
    assert len(peaks) == procs, p.stdout[-2000:]
    return max(peaks)


def test_bounded_checkpoint_memory(tmp):
    """Eight layers of hidden size 512: 96 MiB of f32 main parameters in tensors of at most
    4 MB. A save after one iteration and a load that runs the second each add less than a
    quarter of the main parameters to the peak of a run of one iteration without either: a
    whole host copy of the main parameters (or of the distributed optimizer's state) adds all
    of it, one tensor or piece at a time adds a few MB. The replicated run saves in the default
    torch_dist format, the distributed optimizer's in tessera's."""
    hidden, layers = 512, 8
    main_mb = layers * 12 * hidden * hidden * 4 / 2**20  # the layers' weights alone
    model = ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", "8",
             "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--mock-data", "--lr", "1e-4",
             "--eval-iters", "0", "--train-iters", "2", "--bf16"]
    for label, procs, extra in (("replicated", 1, ["--global-batch-size", "1"]),
                                # tessera's format writes the state where it lives; torch_dist gathers
                                # it to DP rank 0 as Megatron's plain optimizer layout needs
                                ("distributed optimizer DP=2", 2, ["--global-batch-size", "2",
                                                                   "--use-distributed-optimizer",
                                                                   "--ckpt-format", "tessera"])):
        ckpt = os.path.join(tmp, "bounded_" + str(procs))
        plain = peak_resident_mb(procs, model + extra + ["--exit-interval", "1"])
        saved = peak_resident_mb(procs, model + extra + ["--exit-interval", "1", "--save", ckpt,
                                                         "--save-interval", "1"])
        loaded = peak_resident_mb(procs, model + extra + ["--load", ckpt])
        extra_mb = {"save": saved - plain, "load": loaded - plain}
        assert all(v < main_mb / 4 for v in extra_mb.values()), (label, plain, extra_mb, main_mb)
        print("ok  bf16 %s: a checkpoint save adds %.1f MB, a load %.1f MB to a rank's peak of %.1f MB (main "
              "parameters %.0f MB)" % (label, extra_mb["save"], extra_mb["load"], plain, main_mb), flush=True)
    # Megatron's distrib_optim.pt holds the state as whole flat tensors, gathered to host: the
    # main parameters and two moments (3x), and the file is written one such tensor at a time
    # (1x more; measured +400 MB). Copies of the whole file or state on top of that add 3x or
    # more (the previous writer: +1481 MB).
    distributed = model + ["--global-batch-size", "2", "--use-distributed-optimizer", "--exit-interval", "1"]
    plain = peak_resident_mb(2, distributed)
    saved = peak_resident_mb(2, distributed + ["--save", os.path.join(tmp, "bounded_torch"), "--save-interval", "1",
                                               "--ckpt-format", "torch"])
    assert saved - plain < 5 * main_mb, (plain, saved, main_mb)
    print("ok  bf16 distributed optimizer DP=2, --ckpt-format torch: a save adds %.1f MB to a rank's peak (main "
          "parameters %.0f MB; distrib_optim.pt holds 3x them whole)" % (saved - plain, main_mb), flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_bounded_checkpoint_memory(tmp)
        test_activation_memory()
        test_distributed_optimizer_memory()
        test_bf16_layouts(tmp)
        test_bf16_checkpoints(tmp)


if __name__ == "__main__":
    main()
