#!/usr/bin/python3
"""A resumed run's validation split holds every sample the run reads (an indexed dataset of
its own, small enough that Megatron's count is the whole split):
- train 40 iterations evaluating 10 batches every 20, resume to 50 with --eval-iters 2: the
  checkpoint's run read 160 validation samples, more than the 48 Megatron's formula gives the
  new flags, so the split is built for the 176 this run reads, and the final evaluation runs
  (it used to fail after training and saving: "sample 160 is out of range");
- a resume that keeps its flags asks for exactly Megatron's count, (train_iters //
  eval_interval + 1) x eval_iters x global batch, so its samples are Megatron's.
usage: resume_validation_test.py TESSERA_BINARY"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

TESSERA = os.path.abspath(sys.argv[1])
GBS = 8


def make_dataset(tmp):
    rng = random.Random(7)
    src = os.path.join(tmp, "docs.jsonl")
    with open(src, "w") as f:
        for _ in range(2000):
            f.write(json.dumps({"text": " ".join(str(rng.randrange(255)) for _ in range(rng.randrange(20, 200)))}) + "\n")
    prefix = os.path.join(tmp, "docs")
    subprocess.run([TESSERA, "preprocess", "--input", src, "--output-prefix", prefix, "--tokenizer-type",
                    "NullTokenizer", "--vocab-size", "256", "--append-eod"], check=True, capture_output=True,
                   timeout=60)
    return prefix + "_text_document"


def train(data, ckpt, args):
    cmd = [TESSERA, "train", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4",
           "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "4",
           "--global-batch-size", str(GBS), "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
           "--data-path", data, "--split", "98,1,1", "--lr", "1e-3", "--save", ckpt, "--save-interval", "20",
           "--eval-interval", "20"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, "rc %d\n%s\n%s" % (p.returncode, p.stdout[-2500:], p.stderr[-2500:])
    return p.stdout


def validation_target(out):
    return int(re.search(r"validation: +(\d+)", out).group(1))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = make_dataset(tmp)
        ckpt = os.path.join(tmp, "changed")
        train(data, ckpt, ["--train-iters", "40", "--eval-iters", "10"])
        out = train(data, ckpt, ["--load", ckpt, "--train-iters", "50", "--eval-iters", "2",
                                 "--override-opt_param-scheduler"])
        assert "validation sized for this resumed run: it reads to sample 176, past the 48" in out, out[-3000:]
        assert validation_target(out) == 160 + 2 * GBS, out[-3000:]
        assert "validation loss at iteration 50 on validation set" in out, out[-3000:]

        ckpt = os.path.join(tmp, "kept")
        train(data, ckpt, ["--train-iters", "40", "--eval-iters", "10", "--exit-interval", "20"])
        out = train(data, ckpt, ["--load", ckpt, "--train-iters", "40", "--eval-iters", "10"])
        assert "sized for this resumed run" not in out, out[-3000:]
        assert validation_target(out) == (40 // 20 + 1) * 10 * GBS, out[-3000:]
        assert "validation loss at iteration 40 on validation set" in out, out[-3000:]
    print("ok  resumed validation sized for what it reads; unchanged flags keep Megatron's count")


if __name__ == "__main__":
    main()
