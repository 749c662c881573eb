#!/usr/bin/env python3
"""Benchmark: per-rank memory of context parallelism at a long sequence. One training iteration
of a small GPT (hidden 32, 2 heads, --num-layers, sequence 8192 by default) at each
--context-parallel-size, on the CPU; per CP size, the largest rank's measured `max allocated`
(Megatron's memory report line, which tessera prints per rank at the end) and the activation
part of the memory estimate (`Theoretical memory footprints`, the static plan the model
allocates), and their ratios to CP 1. CP splits activations, not weights: the activation ratio
approaches 1/CP as layers grow; the ring's buffers (one layer's keys and values and their
gradients, shared by every layer: model/context_parallel.h) are the rest.

  /usr/bin/python3 bench/context_parallel_memory.py [--tessera build/src/tessera/cli/tessera]
      [--seq-length 8192] [--num-layers 4] [--cp 1 2 4]

Prints figures; never fails a build.
"""
import argparse
import os
import re
import subprocess


def run(tessera, cp, seq, layers):
    flags = ["--hidden-size", "32", "--num-attention-heads", "2", "--num-layers", str(layers), "--seq-length", str(seq),
             "--max-position-embeddings", str(seq), "--micro-batch-size", "1", "--global-batch-size", "1",
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--make-vocab-size-divisible-by", "16",
             "--mock-data", "--lr", "1e-3", "--train-iters", "1", "--log-interval", "1", "--eval-iters", "0",
             "--context-parallel-size", str(cp)]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [tessera, "train"] if cp == 1 else [tessera, "launch", "--standalone", "--nproc_per_node", str(cp), "train"]
    p = subprocess.run(cmd + flags, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        raise SystemExit("CP %d failed (rc %d):\n%s" % (cp, p.returncode, p.stderr[-2000:]))
    peaks = [float(m) for m in re.findall(r"max allocated: ([0-9.]+)", p.stdout + p.stderr)]
    activation = float(re.search(r"activation=([0-9.]+) MB", p.stdout + p.stderr).group(1))
    return max(peaks), activation


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", default="build/src/tessera/cli/tessera")
    ap.add_argument("--seq-length", type=int, default=8192)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    print("sequence %d, %d layers, hidden 32, 2 heads, micro-batch 1, fp32 on the CPU" % (a.seq_length, a.num_layers))
    print("| CP | max allocated per rank (MB) | x CP 1 | activations, estimate (MB) | x CP 1 |")
    print("| --- | --- | --- | --- | --- |")
    base = None
    for cp in a.cp:
        peak, act = run(a.tessera, cp, a.seq_length, a.num_layers)
        base = base or (peak, act)
        print("| %d | %.1f | %.2f | %.1f | %.2f |" % (cp, peak, peak / base[0], act, act / base[1]), flush=True)


if __name__ == "__main__":
    main()
