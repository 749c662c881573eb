#!/usr/bin/python3
"""What `tessera train` says at start-up, before any iteration, about --save, --load and
--ckpt-format:
- a --save that cannot be written (a path under a regular file, a folder without write
  permission) is an error naming the flag and the path at start-up (and with --dry-run), not
  at the first save --save-interval iterations later;
- a --load checkpoint past --train-iters is an error saying so, with or without
  --override-opt_param-scheduler (not a schedule error, not a run that does nothing and exits
  0); one exactly at --train-iters says it has nothing to train;
- --ckpt-format: torch_dist (the default, Megatron's) with --save writes Megatron's distributed
  checkpoint, saying so and warning about nothing; zarr with --save is a usage error.
usage: train_startup_test.py TESSERA_BINARY"""
import os
import shutil
import subprocess
import sys
import tempfile

TESSERA = os.path.abspath(sys.argv[1])
TRAIN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "60", "--mock-data", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0"]
NOBODY = 65534


def env():
    return {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}


def train(flags, rc=0, prefix=(), cwd=None):
    p = subprocess.run(list(prefix) + [TESSERA, "train"] + TRAIN + flags, capture_output=True, text=True, timeout=60,
                       env=env(), cwd=cwd)
    assert p.returncode == rc, "exit %d, expected %d: %s\n%s\n%s" % (p.returncode, rc, flags, p.stdout[-2000:],
                                                                    p.stderr[-2000:])
    return p


def test_unwritable_save(tmp):
    regular = os.path.join(tmp, "a_file")
    open(regular, "w").close()
    for extra in (["--dry-run"], []):
        err = train(["--train-iters", "2", "--save", regular + "/ckpt", "--save-interval", "1"] + extra, rc=2).stderr
        assert "error: --save %s/ckpt: %s is a file, not a folder" % (regular, regular) in err, err
    print("ok  --save under a regular file stops at start-up, naming the flag and the file")

    # A folder without write permission: root may write anywhere, so as root the run drops to
    # nobody (setpriv), which must be able to reach the binary.
    read_only = os.path.join(tmp, "read_only")
    os.mkdir(read_only, 0o555)
    os.chmod(read_only, 0o555)  # whatever the umask
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        reachable = subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
                                    TESSERA, "--version"], capture_output=True).returncode == 0 if setpriv else False
        if not reachable:
            print("skip a --save without write permission: running as root, and user %d cannot run %s through "
                  "setpriv" % (NOBODY, TESSERA))
            return
        prefix = [setpriv, "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]
    err = train(["--train-iters", "2", "--save", read_only + "/ckpt", "--save-interval", "1", "--dry-run"], rc=2,
                prefix=prefix, cwd=tmp).stderr
    assert "error: --save %s/ckpt: cannot create files in %s: Permission denied" % (read_only, read_only) in err, err
    print("ok  --save in a folder without write permission stops at start-up%s" % (" (as nobody)" if prefix else ""))


def test_checkpoint_past_train_iters(tmp):
    ckpt = os.path.join(tmp, "ckpt")
    train(["--train-iters", "4", "--save", ckpt, "--save-interval", "2"])
    past = "error: the checkpoint in --load %s is at iteration 4, already past --train-iters 2" % ckpt
    for extra in ([], ["--override-opt_param-scheduler"]):
        p = train(["--train-iters", "2", "--load", ckpt] + extra, rc=2)
        assert past in p.stderr and "schedule of the flags differs" not in p.stderr, p.stderr
        assert "training ..." not in p.stdout, p.stdout[-2000:]
    p = train(["--train-samples", "2", "--load", ckpt, "--override-opt_param-scheduler"], rc=2)
    assert "already past --train-samples 2 (2 iterations)" in p.stderr, p.stderr
    print("ok  a checkpoint past --train-iters / --train-samples is an error that says so")

    # As in Megatron, the end-of-run save still happens (iteration 4 is not a multiple of 3):
    # loading and saving again is how a checkpoint is re-laid out.
    resaved = os.path.join(tmp, "resaved")
    p = train(["--train-iters", "4", "--load", ckpt, "--save", resaved, "--save-interval", "3"])
    assert "not training: the checkpoint in --load %s is at iteration 4, which --train-iters 4 already reaches" % (
        ckpt) in p.stdout, p.stdout[-2000:]
    assert "training ..." not in p.stdout and " iteration        " not in p.stdout, p.stdout[-2000:]
    assert open(os.path.join(resaved, "latest_checkpointed_iteration.txt")).read() == "4"
    print("ok  a checkpoint at --train-iters: nothing to train, said plainly; the end-of-run save as Megatron's")


def test_ckpt_format(tmp):
    p = train(["--train-iters", "1", "--save", os.path.join(tmp, "dist"), "--save-interval", "1"])
    assert "--ckpt-format" not in p.stderr and "warning" not in p.stderr, p.stderr
    assert "in torch_dist format" in p.stdout, p.stdout[-2000:]
    assert open(os.path.join(tmp, "dist", "iter_0000001", "metadata.json")).read().startswith(
        '{"common_backend":"torch"'), "not Megatron's metadata.json"
    err = train(["--train-iters", "1", "--save", os.path.join(tmp, "zarr"), "--save-interval", "1", "--ckpt-format",
                 "zarr"], rc=2).stderr
    assert "--ckpt-format zarr is not written by tessera" in err, err
    print("ok  --ckpt-format torch_dist (the default) writes Megatron's format; zarr with --save is a usage error")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # reachable by the unprivileged user of the permission case
        test_unwritable_save(tmp)
        test_checkpoint_past_train_iters(tmp)
        test_ckpt_format(tmp)


if __name__ == "__main__":
    main()
