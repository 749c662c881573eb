#!/usr/bin/python3
"""--exit-signal-handler with two processes under `tessera launch`, as DP=2, TP=2 and PP=2:
after SIGINT or SIGTERM every rank finishes its iteration, the checkpoint of that iteration
is written and every rank returns normally.

The race this guards against: oneDNN's sgemm kernels run with the stack pointer inside a heap
buffer, so a signal handled on a computing thread pushed its frame into the heap and a rank
crashed a moment later (`corrupted size vs. prev_size`), leaving no checkpoint. Each layout is
signalled in two ways, ROUNDS times each:
- once through the launcher (a user's Ctrl-C, a scheduler's SIGTERM), which forwards it;
- a burst of signals straight to both workers while they compute, so that on a build where
  a signal can run on a computing thread the race is hit almost surely.
usage: exit_signal_test.py TESSERA_BINARY [ROUNDS]"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TESSERA = os.path.abspath(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
# Large enough that most of an iteration is spent in sgemm, small enough to start in a second.
TRAIN = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--max-position-embeddings", "64", "--micro-batch-size", "4", "--global-batch-size", "16",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--mock-data", "--lr", "1e-4",
         "--train-iters", "100000", "--log-interval", "1", "--eval-iters", "0", "--exit-signal-handler"]
LAYOUTS = {"DP=2": [], "TP=2": ["--tensor-model-parallel-size", "2"], "PP=2": ["--pipeline-model-parallel-size", "2"]}
BURST = 30             # signals to each worker
BURST_GAP_S = 0.01     # apart, so that each is delivered on its own rather than merged while pending
START_TIMEOUT_S = 120  # start-up plus two iterations, on a loaded machine
EXIT_TIMEOUT_S = 120   # the iteration in flight, the save and the exit


def env():
    return {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}


def wait_for_iterations(log, n, p):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= n:
            return
        if p.poll() is not None:
            raise AssertionError("the run ended (rc %s) before iteration %d" % (p.returncode, n))
        time.sleep(0.05)
    raise AssertionError("%s did not reach %d iterations in %d s" % (log, n, START_TIMEOUT_S))


def workers_of(launcher_pid):
    with open("/proc/%d/task/%d/children" % (launcher_pid, launcher_pid)) as f:
        return [int(pid) for pid in f.read().split()]


def burst(pids, sig):
    for _ in range(BURST):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # already saved and gone
                pass
        time.sleep(BURST_GAP_S)


def run(tmp, name, layout, sig, through_launcher):
    run_dir = tempfile.mkdtemp(dir=tmp, prefix=re.sub(r"\W", "", name) + "_")
    ckpt, log = os.path.join(run_dir, "ckpt"), os.path.join(run_dir, "log.jsonl")
    out_path, err_path = os.path.join(run_dir, "stdout"), os.path.join(run_dir, "stderr")
    cmd = [TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "train"] + TRAIN + layout + \
          ["--save", ckpt, "--save-interval", "100000", "--log-json", log]
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env(), start_new_session=True)
        try:
            wait_for_iterations(log, 2, p)  # training has started on every rank
            if through_launcher:
                p.send_signal(sig)
            else:
                burst(workers_of(p.pid), sig)
            rc = p.wait(timeout=EXIT_TIMEOUT_S)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    stdout, stderr = open(out_path).read(), open(err_path).read()
    context = "%s\n--- stdout (end) ---\n%s\n--- stderr (end) ---\n%s" % (name, stdout[-2000:], stderr[-3000:])
    # The launcher reports a signal it received as 128 + its number; workers signalled
    # directly exit 0 and so does the launcher.
    assert rc == (128 + sig if through_launcher else 0), "rc %d\n%s" % (rc, context)
    stopped = re.search(r"exiting program at iteration (\d+) \(--exit-signal-handler: signal received\)", stdout)
    assert stopped, context
    iteration = int(stopped.group(1))
    assert open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read() == str(iteration), context
    for rank in (0, 1):  # each rank's last line, printed after training returned
        assert "[Rank %d] (after %d iterations)" % (rank, iteration) in stdout, context
    assert "error" not in stderr.lower() and "corrupt" not in stderr, context
    return iteration


def main():
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for layout_name, layout in LAYOUTS.items():
            for k in range(ROUNDS):
                sig = (signal.SIGINT, signal.SIGTERM)[k % 2]
                for through_launcher in (True, False):
                    how = "to the launcher" if through_launcher else "burst to the workers"
                    name = "%s, %s %s, round %d" % (layout_name, signal.Signals(sig).name, how, k + 1)
                    t = time.monotonic()
                    iteration = run(tmp, name, layout, sig, through_launcher)
                    print("ok  %-45s saved iteration %d, %.1f s" % (name, iteration, time.monotonic() - t),
                          flush=True)
    print("all %d runs passed in %.0f s" % (len(LAYOUTS) * ROUNDS * 2, time.monotonic() - t0))


if __name__ == "__main__":
    main()
