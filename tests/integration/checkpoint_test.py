#!/usr/bin/python3
"""Checkpoints through `tessera train`: 20 iterations straight equal 10 + save + resume + 10
bit for bit (losses, grad norms, validation lines; dropout on), for one process, for DP=2 and
with --fp16's dynamic loss scaler (its state resumes), and with --ckpt-format torch_dist
(--deterministic-mode) at DP=2, at TP=2 PP=2 and with --bf16 and the distributed optimizer;
kill -9 at random moments of a run that saves every iteration always leaves a loadable latest
checkpoint; corrupt, truncated or missing files and a different model are errors naming the
file or tensor; --no-save-optim / --no-load-optim / --finetune and the schedule check behave
as Megatron's.
With --device D: the 1-process bit-exact resumes only (both formats), on device D.
usage: checkpoint_test.py TESSERA_BINARY [--device D]"""
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

TESSERA = os.path.abspath(sys.argv[1])
BASE = ["--ckpt-format", "tessera",
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--mock-data", "--lr", "1e-3",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "3", "--train-iters", "20", "--log-interval", "1",
        "--eval-iters", "2", "--eval-interval", "5", "--weight-decay", "0.1"]


def env():
    # One OpenMP thread per process, as the launcher gives each worker: this tiny model gains
    # nothing from threads, and threads that wait for each other at every barrier crawl on a
    # loaded machine (ctest -j3 on two cores).
    e = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    e["OMP_NUM_THREADS"] = "1"
    return e


def train(args, expect_rc=0, launch=None):
    cmd = [TESSERA] + (["launch", "--standalone", "--nproc_per_node", str(launch)] if launch else []) + \
          ["train"] + BASE + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
    assert p.returncode == expect_rc, "rc %d (want %d)\n%s\n%s" % (p.returncode, expect_rc, p.stdout[-2500:],
                                                                 p.stderr[-2500:])
    return p


def records(path):
    return [json.loads(l) for l in open(path)]


def validation(out):
    return [l.split("]: ")[-1] for l in out.splitlines() if "validation loss at" in l]


def test_bit_exact_resume(tmp, launch=None, extra=(), tag=None):
    tag = tag or "dp%d" % (launch or 1)
    extra = list(extra)
    straight = train(extra + ["--log-json", f"{tmp}/{tag}_straight.jsonl"], launch=launch)
    first = train(extra + ["--save", f"{tmp}/{tag}_ckpt", "--save-interval", "7", "--exit-interval", "10",
                           "--log-json", f"{tmp}/{tag}_resumed.jsonl"], launch=launch)
    second = train(extra + ["--load", f"{tmp}/{tag}_ckpt", "--log-json", f"{tmp}/{tag}_resumed.jsonl"],
                   launch=launch)
    a, b = records(f"{tmp}/{tag}_straight.jsonl"), records(f"{tmp}/{tag}_resumed.jsonl")
    assert [r["iteration"] for r in b] == list(range(1, 21)), [r["iteration"] for r in b]
    keys = ("lm_loss", "grad_norm", "learning_rate", "consumed_samples", "loss_scale", "skipped_iterations")
    for x, y in zip(a, b):  # the same bits: compared exactly (NaN grad norms of skipped steps as text)
        assert [repr(x.get(k)) for k in keys] == [repr(y.get(k)) for k in keys], (tag, x, y)
    assert validation(straight.stdout) == validation(first.stdout) + validation(second.stdout), tag
    assert open(f"{tmp}/{tag}_ckpt/latest_checkpointed_iteration.txt").read() == "10"


TORCH_DIST = ["--ckpt-format", "torch_dist", "--deterministic-mode"]


def test_kill_during_saves(tmp):
    ckpt = f"{tmp}/killed"
    model = ["--num-layers", "4", "--hidden-size", "256", "--eval-iters", "0"]  # saves of ~10 MB take a while
    big = model + ["--save", ckpt, "--save-interval", "1", "--train-iters", "100000"]
    rng = random.Random(1234)
    for attempt in range(4):
        p = subprocess.Popen([TESSERA, "train"] + BASE + big, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env())
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{ckpt}/latest_checkpointed_iteration.txt") and time.monotonic() < deadline:
            time.sleep(0.05)  # at least one checkpoint, then kill at a random moment
        time.sleep(rng.random() * 1.5)
        p.send_signal(signal.SIGKILL)
        p.wait()
        latest = int(open(f"{ckpt}/latest_checkpointed_iteration.txt").read())
        # The latest checkpoint loads and training continues from it.
        out = train(model + ["--load", ckpt, "--train-iters", str(latest + 1), "--lr-warmup-iters", "0",
                             "--override-opt_param-scheduler"])
        assert "loading checkpoint from %s at iteration %d" % (ckpt, latest) in out.stdout, out.stdout[-2000:]
    leftovers = glob.glob(f"{ckpt}/*.tmp-*")
    # Unfinished temporary folders may remain after kill -9; they are never the tracker's.
    assert all(".tmp-" in l for l in leftovers)


def test_bad_checkpoints(tmp):
    ckpt = f"{tmp}/bad"
    train(["--save", ckpt, "--save-interval", "5", "--train-iters", "5", "--eval-iters", "0"])
    model = f"{ckpt}/iter_0000005/mp_rank_00/model.safetensors"
    data = bytearray(open(model, "rb").read())
    # A different model: the tensor and both shapes are named.
    err = train(["--load", ckpt, "--hidden-size", "64", "--eval-iters", "0"], expect_rc=1).stderr
    assert "embedding.word_embeddings.weight" in err and "[128, 32]" in err and "[128, 64]" in err, err
    # A flipped byte, a truncated file, a missing file.
    data[len(data) // 2] ^= 0xFF
    open(model, "wb").write(data)
    err = train(["--load", ckpt, "--eval-iters", "0"], expect_rc=1).stderr
    assert model in err and "checksum" in err, err
    open(model, "wb").write(data[:100])
    assert "checksum" in train(["--load", ckpt, "--eval-iters", "0"], expect_rc=1).stderr
    os.remove(model)
    err = train(["--load", ckpt, "--eval-iters", "0"], expect_rc=1).stderr
    assert "missing" in err and model in err, err
    # A malformed tracker.
    open(f"{ckpt}/latest_checkpointed_iteration.txt", "w").write("five")
    assert "does not hold an iteration number" in train(["--load", ckpt], expect_rc=1).stderr


def test_flags(tmp):
    ckpt = f"{tmp}/noopt"
    train(["--save", ckpt, "--save-interval", "5", "--train-iters", "5", "--eval-iters", "0", "--no-save-optim"])
    more = ["--train-iters", "6", "--eval-iters", "0", "--override-opt_param-scheduler"]
    err = train(["--load", ckpt] + more, expect_rc=1).stderr
    assert "no optimizer state" in err and "--no-load-optim" in err, err
    out = train(["--load", ckpt, "--no-load-optim"] + more).stdout
    assert "iteration        6/       6" in out
    out = train(["--load", ckpt, "--train-iters", "4", "--eval-iters", "0", "--finetune"]).stdout
    assert "iteration        1/       4" in out  # --finetune starts at iteration 0
    err = train(["--load", ckpt, "--train-iters", "30", "--eval-iters", "0", "--no-load-optim"], expect_rc=2).stderr
    assert "--override-opt_param-scheduler" in err, err
    train(["--load", ckpt, "--train-iters", "30", "--eval-iters", "0", "--no-load-optim",
           "--use-checkpoint-opt_param-scheduler"])
    err = train(["--load", f"{tmp}/empty", "--train-iters", "1", "--eval-iters", "0", "--lr-warmup-iters", "0"]).stderr
    assert "could not find a checkpoint" in err, err
    assert "--save needs --save-interval" in train(["--save", ckpt], expect_rc=2).stderr


def test_non_finite_stops_cleanly(tmp):
    ckpt = f"{tmp}/nan"
    diverge = ["--lr", "1e30", "--clip-grad", "0", "--eval-iters", "0", "--lr-warmup-iters", "0"]
    err = train(diverge + ["--save", ckpt, "--save-interval", "1"], expect_rc=1).stderr
    assert "non-finite" in err and "at iteration 2 on rank 0" in err and "embedding.word_embeddings.weight" in err, err
    assert "no checkpoint was written" in err, err
    assert open(f"{ckpt}/latest_checkpointed_iteration.txt").read() == "1"  # the last good state
    out = train(["--load", ckpt, "--train-iters", "1", "--eval-iters", "0", "--lr-warmup-iters", "0",
                 "--override-opt_param-scheduler"]).stdout  # loads, verified; nothing left to train
    assert "loading checkpoint from %s at iteration 1" % ckpt in out
    # Megatron's switch turns the check off: the run goes on, and `lm loss` leaves the log line.
    out = train(diverge + ["--train-iters", "3", "--no-check-for-nan-in-loss-and-grad"]).stdout
    last = [l for l in out.splitlines() if "iteration        3/" in l][0]
    assert "lm loss" not in last, last


def launch_train(args, log):
    cmd = [TESSERA, "launch", "--standalone", "--nproc_per_node", "2"] + args[0] + ["train"] + BASE + \
          ["--hidden-size", "128", "--eval-iters", "0", "--train-iters", "300", "--lr-decay-style", "constant",
           "--log-json", log] + args[1]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            start_new_session=True)


def wait_for_lines(path, n, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("%s did not reach %d lines" % (path, n))


def last_per_iteration(path):
    out = {}
    for r in records(path):
        out[r["iteration"]] = r  # a restarted run logs its iterations again: the last one counts
    return [out[k] for k in sorted(out)]


def same_run(a, b, label):
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b], label
    for x, y in zip(a, b):
        assert (x["lm_loss"], x["grad_norm"], x["consumed_samples"]) == \
               (y["lm_loss"], y["grad_norm"], y["consumed_samples"]), (label, x, y)


def test_exit_duration(tmp):
    # --exit-duration-in-mins (here 0.02 min = 1.2 s; Megatron takes whole minutes, tessera
    # fractions too): the run stops early, after saving the iteration it stopped at.
    ckpt = f"{tmp}/duration_ckpt"
    out = train(["--train-iters", "100000", "--save", ckpt, "--save-interval", "100000",
                 "--exit-duration-in-mins", "0.02"]).stdout
    stopped = int(open(f"{ckpt}/latest_checkpointed_iteration.txt").read())
    assert "exiting program at iteration %d (--exit-duration-in-mins)" % stopped in out, out[-2000:]
    assert 0 < stopped < 100000, stopped


def test_exits_that_keep_work(tmp):
    straight = f"{tmp}/exit_straight.jsonl"
    p = launch_train(([], []), straight)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    reference = records(straight)

    # SIGTERM to the launcher reaches the workers, which save and leave; --load resumes.
    ckpt, log = f"{tmp}/exit_ckpt", f"{tmp}/exit_signal.jsonl"
    keep = ["--save", ckpt, "--save-interval", "1000", "--load", ckpt]
    p = launch_train(([], keep + ["--exit-signal-handler"]), log)
    wait_for_lines(log, 20)
    os.killpg(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    stopped = int(open(f"{ckpt}/latest_checkpointed_iteration.txt").read())
    assert "exiting program at iteration %d (--exit-signal-handler" % stopped in out, out[-2000:]
    assert 20 <= stopped < 300, stopped
    p = launch_train(([], keep), log)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    same_run(reference, last_per_iteration(log), "SIGTERM, save, resume")

    # kill -9 of a worker mid-run: --max-restarts restarts every worker from the latest
    # checkpoint; every iteration's result (last logged) equals the uninterrupted run, so no
    # sample was trained twice or skipped.
    ckpt, log = f"{tmp}/restart_ckpt", f"{tmp}/restart.jsonl"
    p = launch_train((["--max_restarts", "1"], ["--save", ckpt, "--save-interval", "7", "--load", ckpt]), log)
    wait_for_lines(log, 30)
    workers = subprocess.run(["pgrep", "-f", "restart.jsonl"], capture_output=True, text=True).stdout.split()
    victim = max(int(w) for w in workers if int(w) != p.pid)
    os.kill(victim, signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    assert "restart" in err.lower(), err[-2000:]
    # The restarted workers resumed from a checkpoint, not from iteration 0.
    assert "loading checkpoint from %s at iteration" % ckpt in out, out[-2000:]
    same_run(reference, last_per_iteration(log), "kill -9, restart")


def device_cases(tmp, device):
    """CI's strict-device run: bit-exact resume in tessera's format and in Megatron's, 1 process."""
    on_device = ["--device", device]
    return (("bit-exact resume on " + device, lambda: test_bit_exact_resume(tmp, extra=on_device, tag=device)),
            ("bit-exact resume on %s, --ckpt-format torch" % device,
             lambda: test_bit_exact_resume(tmp, extra=on_device + ["--ckpt-format", "torch"], tag=device + "_torch")))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        cases = device_cases(tmp, sys.argv[3]) if sys.argv[2:3] == ["--device"] else (
            ("bit-exact resume, 1 process", lambda: test_bit_exact_resume(tmp)),
            ("bit-exact resume, DP=2", lambda: test_bit_exact_resume(tmp, launch=2)),
            # The loss scaler's state (scale, growth and hysteresis trackers) resumes:
            # a window of 4 grows the scale across the save.
            ("bit-exact resume, --fp16", lambda: test_bit_exact_resume(
                tmp, extra=["--fp16", "--loss-scale-window", "4", "--initial-loss-scale", "65536"],
                tag="fp16")),
            # Megatron's torch_dist format (tessera's writer and reader) resumes bit for bit too.
            ("bit-exact resume, torch_dist, DP=2", lambda: test_bit_exact_resume(
                tmp, launch=2, extra=TORCH_DIST, tag="dist_dp2")),
            ("bit-exact resume, torch_dist, TP=2 PP=2", lambda: test_bit_exact_resume(
                tmp, launch=4, extra=TORCH_DIST + ["--tensor-model-parallel-size", "2",
                                                   "--pipeline-model-parallel-size", "2"], tag="dist_tp2pp2")),
            ("bit-exact resume, torch_dist, --bf16 distributed optimizer", lambda: test_bit_exact_resume(
                tmp, launch=2, extra=TORCH_DIST + ["--bf16", "--use-distributed-optimizer"], tag="dist_bf16")),
            ("kill -9 during saves", lambda: test_kill_during_saves(tmp)),
            ("bad checkpoints", lambda: test_bad_checkpoints(tmp)),
            ("flags", lambda: test_flags(tmp)),
            ("non-finite loss stops cleanly", lambda: test_non_finite_stops_cleanly(tmp)),
            ("--exit-duration-in-mins", lambda: test_exit_duration(tmp)),
            ("exits that keep work", lambda: test_exits_that_keep_work(tmp)))
        for name, fn in cases:
            t0 = time.monotonic()
            fn()
            print("ok  %-30s %.1f s" % (name, time.monotonic() - t0), flush=True)
