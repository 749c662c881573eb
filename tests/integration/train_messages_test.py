#!/usr/bin/python3
"""`tessera train`'s messages for a new user's mistakes, each naming what to change:
- a resume whose schedule flags differ from the checkpoint's names each differing setting,
  both values and the flag behind it (not two JSON dumps with numeric codes);
- --load at one checkpoint's iter_N folder is an error pointing at its parent (a missing
  folder still warns and trains from scratch, as Megatron does);
- a --data-path without _text_document, or ending in .bin/.idx, is an error whose hint gives
  the prefix to pass, in train and in doctor (one shared function);
- --dry-run checks the data files, and warns when the ranks on this node need more memory
  than the machine has; the theoretical-memory line is the largest rank's.
usage: train_messages_test.py TESSERA_BINARY"""
import json
import os
import subprocess
import sys
import tempfile

TESSERA = os.path.abspath(sys.argv[1])
TRAIN = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--lr", "1e-3", "--eval-iters", "0"]


def run(args, expect_rc, command="train"):
    p = subprocess.run([TESSERA, command] + TRAIN + args, capture_output=True, text=True, timeout=120)
    assert p.returncode == expect_rc, "rc %d (want %d)\n%s\n%s" % (p.returncode, expect_rc, p.stdout[-2000:],
                                                                 p.stderr[-2000:])
    return p


def test_schedule_mismatch(tmp):
    ckpt = os.path.join(tmp, "sched")
    run(["--mock-data", "--train-iters", "2", "--save", ckpt, "--save-interval", "2"], 0)
    err = run(["--mock-data", "--train-iters", "2", "--load", ckpt, "--lr", "2e-3", "--lr-decay-style", "cosine"],
              2).stderr
    assert "peak learning rate 0.001 in the checkpoint, 0.002 from --lr" in err, err
    assert "decay style linear in the checkpoint, cosine from --lr-decay-style" in err, err
    assert "{" not in err, err  # no JSON dump
    err = run(["--mock-data", "--train-iters", "4", "--load", ckpt], 2).stderr
    assert "decay 8 samples in the checkpoint, 16 samples from --lr-decay-iters" in err, err
    assert "--override-opt_param-scheduler" in err, err


def test_load_folders(tmp):
    ckpt = os.path.join(tmp, "sched")  # saved by test_schedule_mismatch
    for folder in (os.path.join(ckpt, "iter_0000002"), os.path.join(ckpt, "iter_0000002") + "/"):
        err = run(["--mock-data", "--train-iters", "2", "--load", folder], 2).stderr
        assert "is the folder of one checkpoint" in err and "hint: pass --load %s " % ckpt in err, err
    err = run(["--mock-data", "--train-iters", "1", "--load", os.path.join(tmp, "missing")], 0).stderr
    assert "could not find a checkpoint" in err, err


def test_data_path_hints(tmp):
    src = os.path.join(tmp, "docs.jsonl")
    with open(src, "w") as f:
        for i in range(50):
            f.write(json.dumps({"text": " ".join(str((i * 7 + j) % 99) for j in range(40))}) + "\n")
    prefix = os.path.join(tmp, "corpus")
    subprocess.run([TESSERA, "preprocess", "--input", src, "--output-prefix", prefix, "--tokenizer-type",
                    "NullTokenizer", "--vocab-size", "100"], check=True, capture_output=True, timeout=60)
    full = prefix + "_text_document"
    cases = ((prefix, "pass %s: `tessera preprocess`" % full),
             (full + ".bin", "takes the prefix without .bin: pass %s" % full),
             (full + ".idx", "takes the prefix without .idx: pass %s" % full),
             (os.path.join(tmp, "nothing"), "the --output-prefix of `tessera preprocess` plus _text_document"))
    for path, hint in cases:
        err = run(["--data-path", path, "--train-iters", "1"], 1).stderr
        assert "no dataset at %s" % path in err and hint in err, (path, err)
        out = run(["--data-path", path, "--train-iters", "1"], 1, command="doctor").stdout
        assert hint in out, (path, out)


def test_dry_run(tmp):
    dry = ["--mock-data", "--train-iters", "1", "--dry-run"]
    out = run(dry, 0).stdout
    assert "--dry-run: the 1 rank(s) on this node need" in out and "GiB free" in out, out[-2000:]
    # A model no machine of this kind holds (~1 TB for its one rank).
    huge = ["--num-layers", "48", "--hidden-size", "8192", "--num-attention-heads", "64"]
    err = run(dry + huge, 0).stderr  # a warning: a dry run also validates flags meant for larger machines
    assert "the 1 rank(s) on this node need" in err and "more than this machine's" in err, err
    assert "training here would fail" in err, err
    err = run(["--data-path", os.path.join(tmp, "corpus"), "--train-iters", "1", "--dry-run"], 1).stderr
    assert "no dataset at" in err and "_text_document" in err, err
    # Two pipeline stages: the line is the largest rank's, and says so.
    p = subprocess.run([TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "train"] + TRAIN + dry +
                       ["--num-layers", "2", "--pipeline-model-parallel-size", "2"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the largest of 2 ranks)" in p.stdout and "the 2 rank(s) on this node need" in p.stdout, p.stdout[-2000:]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        test_schedule_mismatch(tmp)
        test_load_folders(tmp)
        test_data_path_hints(tmp)
        test_dry_run(tmp)
    print("ok")
