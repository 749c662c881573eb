#!/usr/bin/python3
"""Data parallelism reproduces the single-process run: DP = 2 and 4 processes on loopback
(`tessera launch --nproc_per_node N tessera train ...`), with dropout on, give the losses and
gradient norms of one process within 1e-5 relative for the same global batch (dropout masks
are keyed by the global sample, so every layout draws the same ones; only the order of the
gradient sums differs). Then the two-server set-up: two hosts made with `ip netns` and a veth
pair, `--nnodes 2 --node_rank {0,1} --nproc_per_node 2`, with GLOO_SOCKET_IFNAME set and
again unset (the interface is found from the route to MASTER_ADDR). The namespace part exits
77 (CTest's skip) when namespaces cannot be made.
With --device D: DP=2 on loopback only, on device D.
usage: data_parallel_test.py TESSERA_BINARY [--device D]"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_netns_test as netns  # noqa: E402  (namespace set-up and clean-up)
import ports  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
TRAIN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "8",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--mock-data", "--lr", "1e-3",
         "--lr-warmup-iters", "1", "--train-iters", "6", "--log-interval", "1", "--eval-iters", "2",
         "--eval-interval", "3", "--weight-decay", "0.1", "--clip-grad", "0.5"]
RTOL = 1e-5  # the bar; observed differences are float32 sum-order effects (~1e-7)


def env_without_launch():
    return {k: v for k, v in os.environ.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}


def records(path):
    return [json.loads(l) for l in open(path)]


def compare(reference, other, label):
    assert [r["iteration"] for r in other] == [r["iteration"] for r in reference], label
    for a, b in zip(reference, other):
        for key in ("lm_loss", "grad_norm"):
            assert abs(a[key] - b[key]) <= RTOL * abs(a[key]), (label, a["iteration"], key, a[key], b[key])
        assert a["consumed_samples"] == b["consumed_samples"], label


def run(cmd, timeout=120, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or env_without_launch())
    assert p.returncode == 0, "rc %d\n%s\n%s" % (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p


def validation_lines(out):
    return [l.split("]: ")[-1] for l in out.splitlines() if "validation loss at" in l]


OVERLAPPED = ["--overlap-grad-reduce", "--ddp-bucket-size", "3000"]


def test_loopback(tmp, device=(), layouts=((2, []), (4, OVERLAPPED))):
    """One process on the CPU against (processes, flags) `layouts` on `device` (the flags)."""
    single = os.path.join(tmp, "single.jsonl")
    one_thread = dict(env_without_launch(), OMP_NUM_THREADS="1")  # as the launcher gives each worker
    out_single = run([TESSERA, "train"] + TRAIN + ["--log-json", single], env=one_thread).stdout
    reference = records(single)
    assert len(reference) == 6
    for n, extra in layouts:
        path = os.path.join(tmp, "dp%d.jsonl" % n)
        p = run([TESSERA, "launch", "--standalone", "--nproc_per_node", str(n), "train"] + TRAIN + list(device) +
                extra + ["--log-json", path])
        compare(reference, records(path), "DP=%d" % n)
        # Validation averages over every replica's samples: the same lines as one process.
        assert validation_lines(p.stdout) == validation_lines(out_single), (validation_lines(p.stdout),
                                                                           validation_lines(out_single))
    return reference


def test_without_tessera_launch(tmp, reference):
    """torchrun's and Slurm's environment contracts, set by hand (Debian's torch 1.13 torchrun
    does not start under this Python): rank 0 serves tessera's store on MASTER_PORT + 1."""
    master_port = {"torchrun": ports.claim(2), "slurm": ports.claim(2)}
    contracts = {
        "torchrun": lambda r: {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port["torchrun"]),
                               "TORCHELASTIC_RUN_ID": "dp-test"},
        "slurm": lambda r: {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NTASKS": "2", "SLURM_NNODES": "1",
                            "SLURM_NODEID": "0", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
                            "SLURM_TASKS_PER_NODE": "2", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(master_port["slurm"])},
    }
    for name, env_of in contracts.items():
        path = os.path.join(tmp, "%s.jsonl" % name)
        procs = []
        for r in (0, 1):
            env = env_without_launch()
            env.update(env_of(r))
            env["OMP_NUM_THREADS"] = "1"
            procs.append(subprocess.Popen([TESSERA, "train"] + TRAIN + ["--log-json", path], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (name, out[-2000:], err[-2000:])
        compare(reference, records(path), name)


def test_datasets_must_agree(tmp):
    # Rank 1 uses another seed, so its shuffles (and index digests) differ from rank 0's.
    script = 'exec "$0" train "$@" --seed $((1234 + RANK))'
    p = subprocess.run([TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "sh", "-c", script, TESSERA] +
                       TRAIN, capture_output=True, text=True, timeout=120,
                       env=env_without_launch())
    assert p.returncode != 0, p.stdout[-2000:]
    assert "the ranks would train on different samples" in p.stderr and "rank 1 on" in p.stderr, p.stderr[-3000:]


def launch_two_hosts(tmp, set_ifname, tag):
    path = os.path.join(tmp, "netns_%s.jsonl" % tag)
    def env_of(node):
        env = env_without_launch()
        if set_ifname:
            env["GLOO_SOCKET_IFNAME"] = netns.VETH[node]
        return env
    results = netns.launch_on_both(["train"] + TRAIN + ["--log-json", path], 2, env_of, join_timeout=60, timeout=120)
    for node, (rc, out, err) in results.items():
        assert rc == 0, (node, rc, out[-3000:], err[-3000:])
    return records(path)


def test_two_hosts(tmp, reference):
    netns.set_up()  # exits 77 without the rights to make namespaces
    try:
        compare(reference, launch_two_hosts(tmp, True, "ifname"), "two hosts, GLOO_SOCKET_IFNAME set")
        compare(reference, launch_two_hosts(tmp, False, "route"), "two hosts, interface from the route")
    finally:
        netns.tear_down()


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # still runs the clean-ups
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        if sys.argv[2:3] == ["--device"]:  # CI's strict-device run: DP=2 with overlapped buckets only
            test_loopback(tmp, sys.argv[2:4], [(2, OVERLAPPED)])
            print("ok  loopback DP=2 (overlapped buckets) on %s  %.1f s" % (sys.argv[3], time.monotonic() - t0))
            return
        reference = test_loopback(tmp)
        print("ok  loopback DP=2, DP=4 (overlapped buckets)  %.1f s" % (time.monotonic() - t0), flush=True)
        test_without_tessera_launch(tmp, reference)
        print("ok  torchrun and Slurm environments, DP=2", flush=True)
        test_datasets_must_agree(tmp)
        print("ok  ranks with different samples are refused", flush=True)
        t0 = time.monotonic()
        test_two_hosts(tmp, reference)
        print("ok  two hosts in network namespaces, DP=4      %.1f s" % (time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    main()
