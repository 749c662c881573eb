#!/usr/bin/python3
"""Two hosts built with `ip netns` and a veth pair, each with its own address (node 0:
10.213.0.1, node 1: 10.213.0.2); `tessera launch --nnodes 2 --node_rank {0,1} --nproc_per_node 2`
in each, MASTER_ADDR node 0's address, node 1 started first. Shell workers print their
environment: a world of 4 with the right ranks; then a worker failing on node 1 stops both
nodes with its exit code. Traffic stays inside the namespaces. Needs root (CAP_SYS_ADMIN and
CAP_NET_ADMIN); exits 77 (CTest's skip) when a namespace cannot be made. Names carry the pid;
everything is removed at the end.

usage: launch_netns_test.py TESSERA_BINARY"""
import os
import re
import signal
import subprocess
import sys
import time

TESSERA = os.path.abspath(sys.argv[1])
PID = os.getpid()
NS = ["tsl%da" % PID, "tsl%db" % PID]
VETH = ["tv%da" % (PID % 10**9), "tv%db" % (PID % 10**9)]  # at most 15 characters
ADDR = ["10.213.0.1", "10.213.0.2"]
SKIP = 77
PROCS = []  # launchers, killed at the end if still running


def ip(*args):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=20)


def must(*args):
    r = ip(*args)
    if r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))


def remove_stale():
    """Namespaces of earlier runs killed before their clean-up (a CTest timeout)."""
    r = ip("netns", "list")
    for m in re.finditer(r"^tsl(\d+)[ab]\b", r.stdout, re.M):
        if not os.path.exists("/proc/%s" % m.group(1)):
            ip("netns", "del", m.group(0))


def set_up():
    remove_stale()
    r = ip("netns", "add", NS[0])
    if r.returncode != 0:
        print("SKIP: cannot create a network namespace (%s); this test needs root" % r.stderr.strip())
        sys.exit(SKIP)
    must("netns", "add", NS[1])
    must("link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
    for i in (0, 1):
        must("link", "set", VETH[i], "netns", NS[i])
        must("-n", NS[i], "addr", "add", ADDR[i] + "/24", "dev", VETH[i])
        must("-n", NS[i], "link", "set", "lo", "up")
        must("-n", NS[i], "link", "set", VETH[i], "up")


def tear_down():
    for p in PROCS:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its workers follow (PR_SET_PDEATHSIG)
            p.wait()
    for ns in NS:
        ip("netns", "del", ns)  # takes its end of the veth pair with it
    ip("link", "del", VETH[0])  # only if it never moved


PRINT_ENV = ('for n in RANK LOCAL_RANK WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT GLOO_SOCKET_IFNAME; do '
             'eval "echo ENV $n=\\${$n}"; done; echo "ADDR $(ip -4 -o addr show dev $GLOO_SOCKET_IFNAME | '
             'awk \'{print $4}\')"')


def launch_on_both(argv, nproc_per_node, env_of, join_timeout=30, timeout=60):
    """`tessera launch ... ARGV` on both hosts, node 1 first (it waits for node 0's store), with
    ENV_OF(node) as each launcher's environment. Returns {node: (returncode, stdout, stderr)}; a
    launcher still running after TIMEOUT seconds is killed and fails the test. Shared by the tests
    that run on these two hosts (data_parallel_test, model_parallel_test, doctor_test)."""
    procs = []
    for node in (1, 0):
        cmd = ["ip", "netns", "exec", NS[node], TESSERA, "launch", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", str(nproc_per_node), "--master_addr", ADDR[0], "--master_port", "29500",
               "--rdzv_conf", "join_timeout=%d" % join_timeout] + list(argv)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_of(node),
                             start_new_session=True)
        PROCS.append(p)
        procs.append((node, p))
        time.sleep(0.5)
    results = {}
    for node, p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError("node %d's launcher did not exit within %d s\n%s\n%s" %
                                 (node, timeout, out[-3000:], err[-3000:]))
        results[node] = (p.returncode, out, err)
    return results


def launch_both(script, join_timeout=30, timeout=60):
    def env_of(node):
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")}
        env["GLOO_SOCKET_IFNAME"] = VETH[node]
        return env
    return launch_on_both(["sh", "-c", script], 2, env_of, join_timeout, timeout)


def check_environment():
    res = launch_both(PRINT_ENV)
    seen = {}
    for node, (rc, out, err) in res.items():
        assert rc == 0, (node, rc, out, err)
        for line in out.splitlines():
            m = re.match(r"^\[rank(\d+)\]: ENV (\w+)=(.*)$", line)
            if m:
                seen.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
            m = re.match(r"^\[rank(\d+)\]: ADDR (.*)$", line)
            if m:
                seen.setdefault(int(m.group(1)), {})["ADDR"] = m.group(2)
        assert "store %s:29500%s" % (ADDR[0], " (served here)" if node == 0 else "") in err, (node, err)
    assert sorted(seen) == [0, 1, 2, 3], seen
    for r, e in seen.items():
        node = r // 2
        assert e["RANK"] == str(r) and e["LOCAL_RANK"] == str(r % 2) and e["WORLD_SIZE"] == "4", e
        assert e["GROUP_RANK"] == str(node) and e["MASTER_ADDR"] == ADDR[0] and e["MASTER_PORT"] == "29500", e
        assert e["GLOO_SOCKET_IFNAME"] == VETH[node] and e["ADDR"] == ADDR[node] + "/24", e


def check_failure_crosses_hosts():
    script = '[ $RANK = 2 ] && sleep 0.5 && echo "rank 2 gives up" && exit 9; trap "" TERM; while :; do sleep 0.1; done'
    t0 = time.monotonic()
    res = launch_both(script)
    took = time.monotonic() - t0
    for node, (rc, out, err) in res.items():
        assert rc == 9, (node, rc, err)
        assert re.search(r"error: rank 2 \(local rank 0\) on node 1 \(.*\) exited with code 9", err), (node, err)
    assert "rank 2 gives up" in res[0][2], res[0][2]
    assert took < 15, took


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # still runs the clean-up
    set_up()
    try:
        for check in (check_environment, check_failure_crosses_hosts):
            t0 = time.monotonic()
            check()
            print("ok  %-30s %.1f s" % (check.__name__, time.monotonic() - t0), flush=True)
    finally:
        tear_down()


if __name__ == "__main__":
    main()
