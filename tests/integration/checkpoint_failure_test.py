#!/usr/bin/python3
"""Saves that fail and saves that were never finished, through `tessera train`:
- a save that cannot write its files (a file-size limit, RLIMIT_FSIZE, stands in for a full
  disk) fails with an error naming the file, removes its iter_N.tmp-PID folder and leaves the
  previous checkpoint the latest, with one process and with DP=2 under `tessera launch` (the
  rank that does not write fails too, naming the reason, instead of waiting);
- temporary folders found at start-up are reported; those provably abandoned (made on this
  machine, in this boot and PID namespace, by a process that no longer runs) are removed,
  the others left in place; a folder whose maker still runs is not touched;
- SIGINT during a save without --exit-signal-handler removes the save's temporary folder
  before the process dies of it, with one process and with DP=2.
usage: checkpoint_failure_test.py TESSERA_BINARY"""
import glob
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

TESSERA = os.path.abspath(sys.argv[1])
TRAIN = ["--ckpt-format", "tessera",
         "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--mock-data", "--lr", "1e-3",
         "--eval-iters", "0", "--save-interval", "2"]
# model.safetensors of this model is ~450 kB: a limit of 200 kB fails its write half-way.
FILE_SIZE_LIMIT = 200_000


def env():
    return {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}


def limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def train(args, expect_rc=0, launch=False, limited=False):
    cmd = [TESSERA] + (["launch", "--standalone", "--nproc_per_node", "2"] if launch else []) + ["train"] + TRAIN + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(),
                       preexec_fn=limit_file_size if limited else None)
    assert p.returncode == expect_rc, "rc %d (want %d)\n%s\n%s" % (p.returncode, expect_rc, p.stdout[-2000:],
                                                                 p.stderr[-3000:])
    return p


def test_failed_save(tmp, launch):
    ckpt = os.path.join(tmp, "failed_%s" % ("dp2" if launch else "one"))
    train(["--save", ckpt, "--train-iters", "2"], launch=launch)
    err = train(["--save", ckpt, "--load", ckpt, "--train-iters", "4", "--override-opt_param-scheduler"], expect_rc=1,
                launch=launch,
                limited=True).stderr
    assert "iter_0000004.tmp-" in err and "model.safetensors failed: File too large" in err, err[-3000:]
    if launch:  # DP rank 1 writes nothing: it stops with rank 0's reason (either may be the one shown)
        assert "[rank1]: error: rank 0 could not write its part of the checkpoint of iteration 4" in err or \
            "[rank0]: error: writing" in err, err[-3000:]
    assert glob.glob(os.path.join(ckpt, "*.tmp-*")) == [], os.listdir(ckpt)
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read() == "2"
    assert sorted(os.listdir(ckpt)) == ["iter_0000002", "latest_checkpointed_iteration.txt"], os.listdir(ckpt)


# A checkpoint of ~90 MB (model and Adam state of 7M parameters): writing and hashing it takes
# long enough that a signal sent on the "saving checkpoint" line arrives while files are written.
LARGE = ["--hidden-size", "384", "--num-layers", "4", "--train-iters", "1000", "--save-interval", "1"]


def test_interrupted_save(tmp, launch):
    """SIGINT during a save, without --exit-signal-handler: the process still dies of it, but
    its iter_N.tmp-PID folder goes first (with DP=2 the launcher forwards the signal to both
    ranks, which write into the same folder)."""
    ckpt = os.path.join(tmp, "interrupted_%s" % ("dp2" if launch else "one"))
    cmd = [TESSERA] + (["launch", "--standalone", "--nproc_per_node", "2"] if launch else []) + ["train"] + \
        TRAIN + LARGE + ["--save", ckpt]
    with open(os.path.join(tmp, "interrupted.err"), "w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env())
        watchdog = threading.Timer(120, p.kill)  # bounds the whole run, however it goes wrong
        watchdog.start()
        try:
            out = []
            for line in p.stdout:  # the event: the save has started
                out.append(line)
                if "saving checkpoint at iteration" in line:  # under launch: "[rank0]: saving ..."
                    p.send_signal(signal.SIGINT)
                    break
            out += p.stdout.readlines()
            rc = p.wait()
        finally:
            watchdog.cancel()
        err.seek(0)
        context = "".join(out)[-2000:] + "\n--- stderr ---\n" + err.read()[-3000:]
    assert rc == (128 + signal.SIGINT if launch else -signal.SIGINT), "rc %d\n%s" % (rc, context)
    assert glob.glob(os.path.join(ckpt, "*.tmp-*")) == [], "%s\n%s" % (os.listdir(ckpt), context)
    # It came mid-save (the folder existed when the line was printed), and nothing was committed.
    assert "SIGINT during the save of iteration 1: stopped it, leaving no temporary folder" in context, context
    assert os.listdir(ckpt) == [], os.listdir(ckpt)


def owner_record(pid, start_time, boot_id=None, pid_namespace=None):
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    return {"pid": pid, "start_time": start_time, "host": os.uname().nodename,
            "boot_id": boot if boot_id is None else boot_id,
            "pid_namespace": os.readlink("/proc/self/ns/pid") if pid_namespace is None else pid_namespace}


def start_time(pid):
    return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[19]


def make_temp(ckpt, name, owner):
    path = os.path.join(ckpt, name)
    os.makedirs(os.path.join(path, "mp_rank_00"))
    open(os.path.join(path, "mp_rank_00", "model.safetensors"), "wb").write(b"partial")
    if owner is not None:
        json.dump(owner, open(os.path.join(path, "owner.json"), "w"))
    return path


def test_stale_folders(tmp):
    ckpt = os.path.join(tmp, "stale")
    os.makedirs(ckpt)
    # A process that has exited: its id is free (or reused by a process that started later).
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = make_temp(ckpt, "iter_0000002.tmp-%d" % gone.pid, owner_record(gone.pid, "1"))
    reused = make_temp(ckpt, "iter_0000003.tmp-%d" % os.getpid(), owner_record(os.getpid(), "1"))
    running = make_temp(ckpt, "iter_0000004.tmp-%d" % os.getpid(), owner_record(os.getpid(), start_time(os.getpid())))
    other_node = make_temp(ckpt, "iter_0000005.tmp-77", owner_record(77, "1", boot_id="another-machine"))
    other_container = make_temp(ckpt, "iter_0000006.tmp-78", owner_record(78, "1", pid_namespace="pid:[1]"))
    no_record = make_temp(ckpt, "iter_0000007.tmp-79", None)
    err = train(["--save", ckpt, "--train-iters", "2"]).stderr
    for removed in (dead, reused):
        assert "removed %s, a checkpoint save that never finished" % removed in err, err
        assert not os.path.exists(removed)
    for kept, why in ((other_node, "another machine"), (other_container, "another PID namespace"),
                      (no_record, "no readable owner record")):
        assert "%s is a checkpoint save that never finished or is still being written" % kept in err, err
        assert why in err and os.path.isdir(kept), err
    assert running not in err and os.path.isdir(running), err
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read() == "2"
    # A committed checkpoint keeps no owner record.
    assert not os.path.exists(os.path.join(ckpt, "iter_0000002", "owner.json"))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("failed save, 1 process", lambda: test_failed_save(tmp, False)),
                         ("failed save, DP=2", lambda: test_failed_save(tmp, True)),
                         ("stale temporary folders", lambda: test_stale_folders(tmp)),
                         ("SIGINT during a save, 1 process", lambda: test_interrupted_save(tmp, False)),
                         ("SIGINT during a save, DP=2", lambda: test_interrupted_save(tmp, True))):
            t0 = time.monotonic()
            fn()
            print("ok  %-30s %.1f s" % (name, time.monotonic() - t0), flush=True)
