#!/usr/bin/python3
"""Llama RoPE as transformers 5 and Llama 3.1/3.2 write it, trained from Hugging Face weights
by `tessera train --init-from-hf` against the float64 reference (tests/reference/
llama_reference.py run with the tools venv's python: transformers 5, whose config.json keeps
RoPE in rope_parameters, without a top-level rope_theta):
  - a transformers-5 Llama with RoPE base 500000, 10 iterations at sequence 16;
  - a Llama 3.2-style model (rope_type "llama3", factor 32: --use-rope-scaling
    --rope-scaling-factor 32) at sequence 1024, where the scaled frequencies turn by tenths
    of a radian, 2 iterations;
each iteration's loss and grad norm within 1e-5 of the reference's (relative), and the
reference's loss with RoPE misread (base 10000; no scaling) over 20x that bound away from its
own, so the comparison sees the RoPE. Both models have weights of std 0.2, which makes
attention sharp enough for RoPE to show in the loss. `ckpt import-hf` derives the RoPE flags
from the transformers-5 config.json, and a run whose flags leave RoPE at Megatron's defaults
stops naming rope_theta and rope_type (it used to train base 10000 silently).
usage: llama_rope_scaling_test.py TESSERA_BINARY TOOLS_VENV"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
from llama_hf_test import compare_to_reference, tessera, train, without  # noqa: E402
import safetensors_io  # noqa: E402

TOOLS_PYTHON = os.path.join(sys.argv[2], "bin", "python")
REFERENCE = os.path.join(os.path.dirname(HERE), "reference", "llama_reference.py")
# float32 against float64 over these iterations, relative: measured <= 3e-7 on both models.
RTOL = 1e-5
CASES = {
    "transformers-5 Llama, base 500000": ["--rotary-base", "500000"],
    "Llama 3.2 style, factor 32, sequence 1024": ["--rotary-base", "500000", "--rope-scaling-factor", "32",
                                                  "--seq-length", "1024", "--train-iters", "2",
                                                  # Megatron's mock documents hold ids up to 4094.
                                                  "--vocab-size", "4096"],
}


def reference(out, options):
    t0 = time.monotonic()
    p = subprocess.run([TOOLS_PYTHON, REFERENCE, "--out", out, "--init-method-std", "0.2"] + options,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, "llama_reference.py: rc %d\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    cfg = json.load(open(os.path.join(out, "train_config.json")))
    assert cfg["transformers"].startswith("5."), cfg["transformers"]
    hf = json.load(open(os.path.join(out, "hf", "config.json")))
    assert "rope_theta" not in hf and hf["rope_parameters"]["rope_theta"] == 500000, hf
    print(p.stdout.strip().splitlines()[-1] + " (%.1f s)" % (time.monotonic() - t0), flush=True)
    return cfg


def test_case(tmp, label, options):
    ref = os.path.join(tmp, label.split(",")[0].replace(" ", "_"))
    cfg = reference(ref, options)
    loss = cfg["forward_loss"]
    for misread, other in cfg["forward_loss_misread"].items():
        assert abs(other - loss) / loss > 20 * RTOL, (label, misread, other, loss)
    args = cfg["megatron_args"]
    scaled = "--use-rope-scaling" in args

    p = tessera(["ckpt", "import-hf", os.path.join(ref, "hf"), os.path.join(tmp, label[:5] + "_imported")])
    want = "--rotary-base 500000" + (" --use-rope-scaling --rope-scaling-factor 32" if scaled else "")
    assert want in p.stdout, p.stdout

    # RoPE flags left at Megatron's defaults contradict config.json, in one error.
    bare = without(args, "--rotary-base", 1)
    if scaled:
        bare = without(without(bare, "--rope-scaling-factor", 1), "--use-rope-scaling", 0)
    p = tessera(["train"] + bare + ["--eval-iters", "0"], expect_rc=2)
    needles = ["rope_theta is 500000 but --rotary-base is 10000"] + (
        ["rope_type is \"llama3\"", "--use-rope-scaling --rope-scaling-factor 32"] if scaled else [])
    assert all(n in p.stderr for n in needles), p.stderr[-2000:]

    expected, _, _ = safetensors_io.read(os.path.join(ref, "expected_train.safetensors"))
    t0 = time.monotonic()
    got = train(tmp, label[:5], args)
    worst = compare_to_reference(expected, got, label, RTOL, RTOL)
    print("ok  %s: %d iterations, loss within %.2g, grad norm within %.2g of the reference; misread RoPE moves the "
          "loss by %s (%.1f s)" % (label, len(got), worst[0], worst[1],
                                   ", ".join("%.2g" % (abs(v - loss) / loss)
                                             for v in cfg["forward_loss_misread"].values()),
                                   time.monotonic() - t0), flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for label, options in CASES.items():
            test_case(tmp, label, options)


if __name__ == "__main__":
    main()
