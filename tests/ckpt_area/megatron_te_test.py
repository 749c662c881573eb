#!/usr/bin/env python3
"""Megatron files in Transformer Engine's layout (Megatron's default --transformer-impl) against
megatron-core 0.10.0's own TE layer spec (tests/reference/megatron_te.py; Transformer Engine itself
is a stand-in there, tests/reference/transformer_engine_stub.py):

  1. megatron-core's TE GPTModel (a GPT, and an MoE Llama) saves a TP=1 PP=1 checkpoint (io.BytesIO
     extra states, fused norm names); `tessera ckpt convert` reads it and writes it at TP=2 PP=2
     (--to torch), each rank's
     file loading strictly into that rank's TE model with the model's key order and extra-state
     types, its tensors the source's slices;
  2. the same conversion --to torch_dist loads with dist_checkpointing.load into the TE model;
     converted to tessera's format and back with `--transformer-impl transformer_engine`, it
     loads as in 1;
  3. `tessera train --load SRC --finetune --transformer-impl transformer_engine --ckpt-format torch`
     at PP=2 (lr 0: the weights stay the source's) saves files that load likewise, optimizer state in
     the TE model's parameter order, and such a save resumes in tessera bit for bit.

    megatron_te_test.py TESSERA TOOLS_PYTHON TDIST_PYTHON     (exit 77: a venv is missing)
"""
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "reference", "megatron_te.py")
GPT = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
       "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer", "--vocab-size", "99",
       "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0", "--attention-dropout", "0"]


def run(cmd, **kw):
    started = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), **kw)
    print("$ %s  (%.1f s)" % (" ".join(cmd), time.time() - started))
    print((p.stdout + p.stderr).strip())
    if p.returncode != 0:
        raise SystemExit("FAILED (exit %d): %s" % (p.returncode, " ".join(cmd)))
    return p.stdout


def losses(log):
    return re.findall(r"iteration +(\d+)/.*?lm loss: (\S+)", log)


def check_resume(tessera, tmp):
    """A --transformer-impl transformer_engine save (model and optimizer state in the TE order)
    resumes in tessera bit for bit."""
    flags = [*GPT, "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-2",
             "--eval-iters", "0", "--log-interval", "1", "--transformer-impl", "transformer_engine",
             "--ckpt-format", "torch", "--deterministic-mode", "--train-iters", "4"]
    whole = losses(run([tessera, "train", *flags, "--save", os.path.join(tmp, "whole"), "--save-interval", "2"]))
    half = os.path.join(tmp, "half")
    os.makedirs(half)
    os.rename(os.path.join(tmp, "whole", "iter_0000002"), os.path.join(half, "iter_0000002"))
    with open(os.path.join(half, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("2")
    resumed = losses(run([tessera, "train", *flags, "--load", half]))
    if len(whole) != 4 or resumed != whole[2:]:
        raise SystemExit("the resume gives %s, the uninterrupted run %s" % (resumed, whole[2:]))


def main():
    tessera, tools, tdist = sys.argv[1:4]
    if not (os.path.exists(tools) and os.path.exists(tdist)):
        print("skipped: %s or %s is missing" % (tools, tdist))
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("gpt", "moe"):
            src = os.path.join(tmp, model)
            run([tools, REFERENCE, "save", src, model])
            for to, checker, action in (("torch", tools, "check"), ("torch_dist", tdist, "dist-check")):
                out = os.path.join(tmp, model + "_" + to)
                run([tessera, "ckpt", "convert", src, out, "--to", to, "--target-tensor-parallel-size", "2",
                     "--target-pipeline-parallel-size", "2"])
                run([checker, REFERENCE, action, out, src])
        src = os.path.join(tmp, "gpt")
        # Through tessera's own format (local) and back to Transformer Engine's layout on request.
        own, back = os.path.join(tmp, "gpt_tessera"), os.path.join(tmp, "gpt_back")
        run([tessera, "ckpt", "convert", src, own, "--to", "tessera"])
        run([tessera, "ckpt", "convert", own, back, "--to", "torch", "--transformer-impl", "transformer_engine",
             "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"])
        run([tools, REFERENCE, "check", back, src])
        trained = os.path.join(tmp, "trained")
        run([tessera, "launch", "--standalone", "--nproc_per_node", "2", "train", *GPT, "--load", src, "--finetune",
             "--pipeline-model-parallel-size", "2", "--transformer-impl", "transformer_engine",
             "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1", "--lr", "0",
             "--eval-iters", "0", "--save", trained, "--save-interval", "1", "--ckpt-format", "torch"])
        run([tools, REFERENCE, "check", trained, src])
        check_resume(tessera, tmp)
    print("OK")


if __name__ == "__main__":
    main()
