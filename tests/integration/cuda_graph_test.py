#!/usr/bin/python3
"""--enable-cuda-graph without a GPU: on the strict test device a "capture" runs the step's
region (zeroing the gradients, every micro-batch's forward and backward, the gradient norm)
with the capture's refusals on (device.h: an allocation or free, a synchronous copy to or from
the host, a synchronisation inside it is an error naming the call), so these runs prove the
region capturable: GPT and Llama with dropout, --fp16's loss scaler, --eod-mask-loss,
--deterministic-mode and evaluation every 3 iterations each give the losses and gradient norms
of the same run without the flag, to the bit. And the refusals: --device cpu (no capture),
two ranks, MoE, each a usage error (exit 2) naming the reason. Replay itself needs a GPU
(cuda_test.py's graph part, scripts/gpu-check.sh).
usage: cuda_graph_test.py TESSERA_BINARY"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_parallel_test as mp  # noqa: E402  (the tiny run's flags, its runner and log reader)

LLAMA = ["--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
         "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
         "--disable-bias-linear"]
SHORT = ["--num-layers", "2", "--train-iters", "6", "--eval-interval", "3"]
RUNS = [
    ("gpt", []),
    ("llama", LLAMA),
    ("fp16", ["--fp16"]),
    ("eod mask", ["--eod-mask-loss"]),
    ("deterministic", ["--deterministic-mode"]),
]


def test_strict_capture_gives_the_same_bits(tmp):
    for label, flags in RUNS:
        plain, plain_valid = mp.train(tmp, label + " strict", 1, SHORT + flags + ["--device", "strict"])
        graph, graph_valid = mp.train(tmp, label + " strict graph", 1,
                                      SHORT + flags + ["--device", "strict", "--enable-cuda-graph"])
        mp.compare(plain, graph, label + " with --enable-cuda-graph on strict", exact=True)
        assert plain_valid == graph_valid and plain_valid, (label, plain_valid, graph_valid)
        print("ok  %s: %d iterations on strict with the capture's checks, the same bits" % (label, len(graph)))


def test_the_log_says_so():
    p = subprocess.run([mp.TESSERA, "train"] + mp.TRAIN + SHORT + ["--device", "strict", "--enable-cuda-graph"],
                       capture_output=True, text=True, timeout=240, env=mp.env_without_launch())
    assert p.returncode == 0, p.stderr[-3000:]
    line = "--enable-cuda-graph: strict checks every step's region as a capture would"
    assert line in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    print("ok  the log says: %s" % line)


def usage_error(flags, message, launch=()):
    cmd = [mp.TESSERA] + (["launch", "--standalone"] + list(launch) if launch else []) + ["train"]
    p = subprocess.run(cmd + mp.TRAIN + SHORT + flags, capture_output=True, text=True, timeout=240,
                       env=mp.env_without_launch())
    out = p.stdout + p.stderr
    assert p.returncode != 0 and message in out, "rc %d, wanted %r:\n%s" % (p.returncode, message, out[-3000:])
    if not launch:
        assert p.returncode == 2, "rc %d for a usage error:\n%s" % (p.returncode, out[-3000:])
    print("ok  refused: %s" % message)


def test_refusals():
    usage_error(["--enable-cuda-graph"], "--enable-cuda-graph on cpu, which cannot capture work")
    usage_error(["--enable-cuda-graph", "--device", "strict", "--num-experts", "4", "--disable-bias-linear"],
                "--enable-cuda-graph with --num-experts")
    usage_error(["--enable-cuda-graph", "--device", "strict"], "--enable-cuda-graph with 2 ranks",
                launch=["--nproc_per_node", "2"])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_strict_capture_gives_the_same_bits(tmp)
    test_the_log_says_so()
    test_refusals()
    return 0


if __name__ == "__main__":
    sys.exit(main())
