#!/usr/bin/python3
"""The test port registry (ports.py): processes claiming at the same time never get the same
port, claims stay below the kernel's ephemeral range, a port something listens on is skipped,
and a dead process's claims are free again. The claims here come from a private registry and
a 40-port window, so that the window fills and any double claim shows.

usage: ports_test.py"""
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ports  # noqa: E402

WINDOW = 40
CLAIMER = """
import sys
sys.path.insert(0, %r)
import ports
ports.claimable_range = lambda: (%d, %d)
got = []
for count in %r:
    first = ports.claim(count)
    got += range(first, first + count)
print(" ".join(map(str, got)), flush=True)
sys.stdin.read()  # hold the claims until the parent has every process's
"""


def claimers(n, first, env, counts=(1, 1, 1, 1, 1)):
    """n processes, each claiming `counts` ports from the window at once."""
    code = CLAIMER % (HERE, first, first + WINDOW - 1, tuple(counts))
    return [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for _ in range(n)]


def claimed_by(procs):
    return [int(p) for proc in procs for p in proc.stdout.readline().split()]


def test_concurrent_claims_are_distinct(first, env):
    # Single ports, so that the window fills exactly whatever order the claims come in.
    procs = claimers(8, first, env)  # 8 x 5 ports: the whole window
    claimed = claimed_by(procs)
    try:
        assert len(claimed) == WINDOW, claimed
        assert sorted(claimed) == list(range(first, first + WINDOW)), sorted(claimed)
        # Full now: one more claim fails, naming the registry.
        extra = claimers(1, first, env)[0]
        _, err = extra.communicate(timeout=60)
        assert extra.returncode != 0 and "no 1 free consecutive test ports" in err, err
    finally:
        for proc in procs:
            proc.communicate(timeout=60)  # closes stdin: the claimers exit


def test_dead_claims_and_listeners(first, env):
    # The claimers above have exited: their claims are free. A listener inside the window is
    # never handed out. Pairs first, into the empty window (later, free ports may all be
    # isolated), then single ports from processes claiming at once.
    with socket.socket() as s:
        s.bind(("127.0.0.1", first))
        s.listen()
        procs = claimers(1, first, env, counts=(2, 2, 2))
        try:
            pairs = claimed_by(procs)
            assert len(pairs) == 6 and all(pairs[i] + 1 == pairs[i + 1] for i in (0, 2, 4)), pairs
            procs += claimers(6, first, env)  # 30 more: 36 of the 39 free ports
            claimed = pairs + claimed_by(procs[1:])
            assert len(claimed) == 36 and len(set(claimed)) == 36 and first not in claimed, claimed
        finally:
            for proc in procs:
                proc.communicate(timeout=60)


def test_below_the_ephemeral_range():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    with tempfile.TemporaryDirectory() as registry:
        env = dict(os.environ, TESSERA_TEST_PORTS_DIR=registry)
        code = "import sys; sys.path.insert(0, %r); import ports; print(ports.claim(2))" % HERE
        port = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                  timeout=60, check=True).stdout)
        assert 20000 <= port and port + 1 < low, (port, low)


def main():
    with tempfile.TemporaryDirectory() as registry:
        env = dict(os.environ, TESSERA_TEST_PORTS_DIR=registry)
        first = ports.claim(WINDOW)
        test_concurrent_claims_are_distinct(first, env)
        print("ok  8 processes claim a 40-port window at once: every port once, the 41st claim fails", flush=True)
        test_dead_claims_and_listeners(first, env)
        print("ok  dead processes' claims are free again; a listening port is skipped", flush=True)
    test_below_the_ephemeral_range()
    print("ok  claims lie below the ephemeral range", flush=True)


if __name__ == "__main__":
    main()
