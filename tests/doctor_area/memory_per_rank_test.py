#!/usr/bin/python3
"""doctor's memory row against what `tessera train` allocates, under `tessera launch` with 2
processes as TP 2, as PP 2 and as CP 2: the row's per-rank figure is the largest rank's own share (the
"max allocated" train prints per rank), not the whole model on every rank.
usage: memory_per_rank_test.py TESSERA_BINARY"""
import os
import re
import subprocess
import sys

TESSERA = os.path.abspath(sys.argv[1])
MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
         "--train-iters", "1", "--eval-iters", "0", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "1000"]
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TESSERA_LAUNCHER", "SLURM_PROCID",
               "SLURM_NTASKS")
ENV = dict({k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}, OMP_NUM_THREADS="1")


def launch(*args):
    p = subprocess.run([TESSERA, "launch", "--standalone", "--nproc_per_node", "2", TESSERA, *args],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 0, "exit %d\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout + p.stderr


def doctor_per_rank(out):
    m = re.search(r"config: memory .*?; per rank (?:up to )?([0-9.]+) MiB", out)
    assert m, out
    return m.group(1)


def check_layout(layout):
    train = launch("train", *MODEL, *layout)
    allocated = [float(x) for x in re.findall(r"\[Rank \d\] .* max allocated: ([0-9.]+)", train)]
    assert len(allocated) == 2, train[-3000:]
    doctor = launch("doctor", *MODEL, *layout, "--doctor-timeout", "30")
    per_rank = doctor_per_rank(doctor)
    assert per_rank == "%.1f" % max(allocated), "doctor says %s MiB per rank, train allocated %s" % (
        per_rank, allocated)
    return float(per_rank), allocated


whole = subprocess.run([TESSERA, "doctor", *MODEL], capture_output=True, text=True, timeout=120, env=ENV)
whole_mib = float(doctor_per_rank(whole.stdout))
tp, _ = check_layout(["--tensor-model-parallel-size", "2"])
assert tp < 0.6 * whole_mib, (tp, whole_mib)
pp, allocated = check_layout(["--pipeline-model-parallel-size", "2"])
assert allocated[0] != allocated[1] and pp < whole_mib, (allocated, whole_mib)
# Context parallelism splits the activations, not the weights.
cp, _ = check_layout(["--context-parallel-size", "2"])
assert cp < whole_mib, (cp, whole_mib)
print("ok: one process %.1f MiB; TP 2 %.1f MiB per rank; PP 2 up to %.1f MiB (ranks %s); CP 2 %.1f MiB per rank" % (
    whole_mib, tp, pp, allocated, cp))
