#!/usr/bin/python3
"""`tessera launch` end to end, with /bin/sh workers: the environment each worker gets, output
prefixes, --log-dir files, failures (kill -9 of a worker: the whole job gone within 10 s and
the rank named), SIGTERM/SIGINT with a grace period, exit codes, --max-restarts, two launchers
over loopback as two nodes, the join timeout, c10d node ranks, and the programs a bare name
runs. Every case bounds its own time.

usage: launch_test.py TESSERA_BINARY [CASE ...]     (no CASE: all of them)"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ports  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
CASES = {}
STARTED = []  # launchers started in the background; killed if a case fails half-way


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "TESSERA_JOB_TOKEN", "RANK", "WORLD_SIZE")}
    env.update(extra)
    return env


def launch(args, timeout=60, env=None, expect_rc=None):
    t0 = time.monotonic()
    p = subprocess.run([TESSERA, "launch"] + args, capture_output=True, text=True, timeout=timeout,
                       env=env or clean_env())
    p.elapsed = time.monotonic() - t0
    if expect_rc is not None:
        assert p.returncode == expect_rc, "rc %d (want %d)\nstdout:\n%s\nstderr:\n%s" % (
            p.returncode, expect_rc, p.stdout[-4000:], p.stderr[-4000:])
    return p


def start(args, env=None):
    p = subprocess.Popen([TESSERA, "launch"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env or clean_env(), start_new_session=True)
    p.t0 = time.monotonic()
    STARTED.append(p)
    return p


def finish(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError("launcher did not exit within %s s\nstdout:\n%s\nstderr:\n%s" % (timeout, out, err))
    return p.returncode, out, err, time.monotonic() - p.t0


def wait_for_listener(port, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("nothing listens on port %d after %d s" % (port, timeout))


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_for_files(paths, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(p) and open(p).read().strip() for p in paths):
            return [int(open(p).read().split()[0]) for p in paths]
        time.sleep(0.05)
    raise AssertionError("workers did not start: missing %s" % [p for p in paths if not os.path.exists(p)])


def assert_gone(pids, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    assert not left, "processes still alive: %s" % left


ENV_NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TESSERA_LAUNCHER", "TESSERA_JOB_TOKEN",
             "OMP_NUM_THREADS"]
PRINT_ENV = "; ".join('echo "ENV %s=${%s-<unset>}"' % (n, n) for n in ENV_NAMES)


def worker_envs(stdout):
    """{rank: {name: value}} from the [rankN]: ENV lines."""
    envs = {}
    for line in stdout.splitlines():
        m = re.match(r"^\[rank(\d+)\]: ENV (\w+)=(.*)$", line)
        if m:
            envs.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    return envs


@case
def environment():
    p = launch(["--standalone", "--nproc_per_node", "2", "sh", "-c", PRINT_ENV], expect_rc=0)
    envs = worker_envs(p.stdout)
    assert sorted(envs) == [0, 1], p.stdout
    for r, e in envs.items():
        assert e["RANK"] == str(r) and e["LOCAL_RANK"] == str(r) and e["ROLE_RANK"] == str(r), e
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2" and e["ROLE_WORLD_SIZE"] == "2", e
        assert e["GROUP_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1" and e["ROLE_NAME"] == "default", e
        assert e["MASTER_ADDR"] == "127.0.0.1" and 0 < int(e["MASTER_PORT"]) < 65536, e
        assert e["TORCHELASTIC_RUN_ID"].startswith("standalone-") and e["TORCHELASTIC_RESTART_COUNT"] == "0", e
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "0" and e["TESSERA_LAUNCHER"] == "1", e
        assert e["TESSERA_JOB_TOKEN"] not in ("", "<unset>"), e
        assert e["OMP_NUM_THREADS"] == "1", e
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["TESSERA_JOB_TOKEN"] == envs[1]["TESSERA_JOB_TOKEN"]
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in p.stderr, p.stderr
    # A value the user set is kept, without the warning; the token and MASTER_* come from flags/env.
    p = launch(["--standalone", "--nproc_per_node", "2", "sh", "-c", PRINT_ENV],
               env=clean_env(OMP_NUM_THREADS="3", TESSERA_JOB_TOKEN="tok"), expect_rc=0)
    envs = worker_envs(p.stdout)
    assert all(e["OMP_NUM_THREADS"] == "3" and e["TESSERA_JOB_TOKEN"] == "tok" for e in envs.values()), envs
    assert "OMP_NUM_THREADS" not in p.stderr, p.stderr
    # One process per node: OMP_NUM_THREADS is left alone.
    p = launch(["--standalone", "--prefix", "always", "sh", "-c", PRINT_ENV], expect_rc=0)
    assert worker_envs(p.stdout)[0]["OMP_NUM_THREADS"] == "<unset>"
    # MASTER_ADDR/MASTER_PORT from the launcher's environment are the defaults.
    port = ports.claim()
    p = launch(["--prefix", "always", "sh", "-c", PRINT_ENV], env=clean_env(MASTER_ADDR="localhost",
                                                                           MASTER_PORT=str(port)), expect_rc=0)
    e = worker_envs(p.stdout)[0]
    assert e["MASTER_ADDR"] == "localhost" and e["MASTER_PORT"] == str(port) and e["TORCHELASTIC_RUN_ID"] == "none", e


@case
def output_prefix_and_filter():
    script = 'echo "out $RANK"; echo "err $RANK" >&2; printf "partial $RANK"'
    p = launch(["--standalone", "--nproc_per_node", "2", "sh", "-c", script], expect_rc=0)
    for r in (0, 1):
        assert "[rank%d]: out %d\n" % (r, r) in p.stdout, p.stdout
        assert "[rank%d]: partial %d\n" % (r, r) in p.stdout, p.stdout
        assert "[rank%d]: err %d\n" % (r, r) in p.stderr, p.stderr
    p = launch(["--standalone", "--nproc_per_node", "2", "--prefix", "never", "sh", "-c", script], expect_rc=0)
    assert sorted(l for l in p.stdout.splitlines() if l.startswith("out")) == ["out 0", "out 1"], p.stdout
    p = launch(["--standalone", "sh", "-c", script], expect_rc=0)  # one worker: no prefix by default
    assert "out 0\n" in p.stdout and "[rank" not in p.stdout, p.stdout
    p = launch(["--standalone", "--nproc_per_node", "3", "--local_ranks_filter", "1", "sh", "-c", script], expect_rc=0)
    assert "[rank1]: out 1" in p.stdout and "rank0]" not in p.stdout and "rank2]" not in p.stdout, p.stdout


@case
def log_dir():
    with tempfile.TemporaryDirectory() as tmp:
        script = 'echo "out $RANK"; echo "err $RANK" >&2'
        p = launch(["--standalone", "--nproc_per_node", "2", "--log-dir", tmp, "--redirects", "3", "sh", "-c", script],
                   expect_rc=0)
        assert "out" not in p.stdout and "err 0" not in p.stderr, (p.stdout, p.stderr)
        for r in (0, 1):
            assert open(os.path.join(tmp, "attempt_0", str(r), "stdout.log")).read() == "out %d\n" % r
            assert open(os.path.join(tmp, "attempt_0", str(r), "stderr.log")).read() == "err %d\n" % r
        p = launch(["--standalone", "--log_dir", tmp, "--tee", "3", "sh", "-c", script], expect_rc=0)
        assert "out 0" in p.stdout  # files and console


@case
def kill9_stops_everything():
    with tempfile.TemporaryDirectory() as tmp:
        # Each worker starts a child in its process group; rank 2 ignores SIGTERM, so only
        # SIGKILL after the failure grace period ends it. The pid file comes last, so once it
        # is there the worker's line is in the launcher's pipe.
        script = ('sleep 60 & echo $! > %s/child$RANK; echo "rank $RANK up"; [ $RANK = 2 ] && trap "" TERM; '
                  'echo $$ > %s/pid$RANK; while :; do sleep 0.1; done') % (tmp, tmp)
        p = start(["--standalone", "--nproc_per_node", "3", "sh", "-c", script])
        pids = wait_for_files(["%s/pid%d" % (tmp, r) for r in range(3)])
        children = wait_for_files(["%s/child%d" % (tmp, r) for r in range(3)])
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        rc, out, err, _ = finish(p, 30)
        took = time.monotonic() - killed_at
        assert took < 20, "launcher took %.1f s" % took  # 3 s of failure grace; the bound guards against a hang
        assert rc == 128 + 9, (rc, err)
        assert re.search(r"rank 1 \(local rank 1\) on node 0 \(.*\) was killed by signal SIGKILL \(9\)", err), err
        assert "error: rank 1 " in err and "rank 2 did not exit within 3 s of SIGTERM: killed with SIGKILL" in err, err
        assert "rank 1 up" in err.split("last ")[1], err  # the tail of rank 1's output is shown
        assert_gone(pids + children, within=5)


@case
def launcher_kill9_takes_workers_along():
    with tempfile.TemporaryDirectory() as tmp:
        p = start(["--standalone", "--nproc_per_node", "2", "sh", "-c", "echo $$ > %s/pid$RANK; exec sleep 60" % tmp])
        pids = wait_for_files(["%s/pid%d" % (tmp, r) for r in range(2)])
        os.kill(p.pid, signal.SIGKILL)
        finish(p, 10)
        assert_gone(pids, within=5)


@case
def sigterm_with_grace():
    with tempfile.TemporaryDirectory() as tmp:
        # Rank 0 saves within the grace (0.5 s of its 5 s, however loaded the machine), rank 1
        # ignores SIGTERM and is killed when the grace ends.
        script = ('if [ $RANK = 0 ]; then trap "echo saving; sleep 0.5; echo saved; exit 0" TERM; '
                  'else trap "" TERM; fi; echo $$ > %s/pid$RANK; while :; do sleep 0.1; done') % tmp
        p = start(["--standalone", "--nproc_per_node", "2", "--signal-grace-seconds", "5", "sh", "-c", script])
        pids = wait_for_files(["%s/pid%d" % (tmp, r) for r in range(2)])
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc, out, err, _ = finish(p, 30)
        took = time.monotonic() - t0
        assert rc == 128 + 15, (rc, err)
        assert "[rank0]: saving" in out and "[rank0]: saved" in out, out
        assert "received SIGTERM: forwarding it to the workers; SIGKILL in 5 s" in err, err
        assert "rank 1 did not exit within 5 s of SIGTERM: killed with SIGKILL" in err, err
        assert 4.8 < took < 25, took  # the 5 s grace, then SIGKILL (the upper bound guards against a hang)
        assert_gone(pids, within=5)
    with tempfile.TemporaryDirectory() as tmp:
        # SIGINT reaches the workers as SIGINT; a second signal kills at once.
        script = ('trap "echo got INT; echo 1 > %s/int$RANK" INT; trap "" TERM; echo $$ > %s/pid$RANK; '
                  'while :; do sleep 0.1; done') % (tmp, tmp)
        p = start(["--standalone", "--nproc_per_node", "2", "--signal-grace-seconds", "60", "sh", "-c", script])
        pids = wait_for_files(["%s/pid%d" % (tmp, r) for r in range(2)])
        p.send_signal(signal.SIGINT)
        wait_for_files(["%s/int%d" % (tmp, r) for r in range(2)])  # the first one reached both workers
        p.send_signal(signal.SIGINT)
        rc, out, err, took = finish(p, 30)
        assert rc == 128 + 2, (rc, err)
        assert "[rank0]: got INT" in out and "[rank1]: got INT" in out, out
        assert "did not exit within 60 s of SIGINT" in err, err
        assert_gone(pids, within=5)


@case
def exit_codes():
    p = launch(["--standalone", "--nproc_per_node", "2", "sh", "-c", '[ $RANK = 1 ] && exit 3; sleep 0.2'],
               expect_rc=3)
    assert re.search(r"error: rank 1 \(local rank 1\) on node 0 \(.*\) exited with code 3", p.stderr), p.stderr
    launch(["--standalone", "--nproc_per_node", "2", "true"], expect_rc=0)
    p = launch(["--bogus", "true"], expect_rc=2)
    assert "unknown flag --bogus" in p.stderr, p.stderr
    p = launch(["--nproc_per_node", "2"], expect_rc=2)
    assert "no program" in p.stderr, p.stderr
    p = launch(["--standalone", "no-such-program-anywhere"], expect_rc=2)
    assert "no-such-program-anywhere" in p.stderr, p.stderr


def wait_for_rank(tmp, waiter, waited):
    """Shell: rank `waiter` goes on once rank `waited` of the same attempt has got this far."""
    return ('echo up > {0}/up$RANK.$TORCHELASTIC_RESTART_COUNT; if [ $RANK = {1} ]; then '
            'while [ ! -e {0}/up{2}.$TORCHELASTIC_RESTART_COUNT ]; do sleep 0.05; done; fi; ').format(tmp, waiter,
                                                                                                   waited)


@case
def max_restarts():
    # A failing rank first waits for the other's line of this attempt, so that the line is
    # printed before the failure stops its rank, however slowly the workers start.
    with tempfile.TemporaryDirectory() as tmp:
        script = ('echo "attempt $TORCHELASTIC_RESTART_COUNT"; ' + wait_for_rank(tmp, 1, 0) +
                  '[ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT -lt 2 ] && exit 5; true')
        p = launch(["--standalone", "--nproc_per_node", "2", "--max-restarts", "2", "--log-dir", tmp, "sh", "-c",
                    script], expect_rc=0)
        for a in range(3):
            assert "[rank0]: attempt %d" % a in p.stdout, p.stdout
            assert os.path.exists(os.path.join(tmp, "attempt_%d" % a, "1", "stdout.log"))
        assert "restart 1 of 2" in p.stderr and "restart 2 of 2" in p.stderr, p.stderr
    with tempfile.TemporaryDirectory() as tmp:
        script = ('echo "attempt $TORCHELASTIC_RESTART_COUNT"; ' + wait_for_rank(tmp, 0, 1) +
                  '[ $RANK = 0 ] && exit 6; sleep 5')
        p = launch(["--standalone", "--nproc_per_node", "2", "--max-restarts", "1", "sh", "-c", script], expect_rc=6)
    assert "[rank1]: attempt 1" in p.stdout and "attempt 2" not in p.stdout, p.stdout
    assert "after 1 restart(s)" in p.stderr, p.stderr


def two_nodes(args0, args1, script, timeout=30, first=1):
    port = ports.claim()
    common = ["--nnodes", "2", "--nproc_per_node", "2", "--master_port", str(port)]
    procs = {}
    for node in (first, 1 - first):
        procs[node] = start(common + ["--node_rank", str(node)] + (args0 if node == 0 else args1) +
                            ["sh", "-c", script])
        time.sleep(0.3)
    return port, {n: finish(p, timeout) for n, p in procs.items()}


@case
def two_nodes_on_loopback():
    _, res = two_nodes([], [], PRINT_ENV)
    seen = {}
    for node, (rc, out, err, _) in res.items():
        assert rc == 0, (node, rc, err)
        for r, e in worker_envs(out).items():
            assert e["GROUP_RANK"] == str(node) and e["WORLD_SIZE"] == "4" and e["GROUP_WORLD_SIZE"] == "2", e
            assert e["LOCAL_RANK"] == str(r - 2 * node) and e["RANK"] == str(r), e
            seen[r] = e
    assert sorted(seen) == [0, 1, 2, 3], seen
    assert len({e["TESSERA_JOB_TOKEN"] for e in seen.values()}) == 1


@case
def failure_on_one_node_stops_all():
    with tempfile.TemporaryDirectory() as tmp:
        script = ('echo $$ > %s/pid$RANK; [ $RANK = 3 ] && sleep 0.5 && echo "rank 3 fails" && exit 4; '
                  'trap "" TERM; while :; do sleep 0.1; done') % tmp
        t0 = time.monotonic()
        _, res = two_nodes([], [], script, first=0)
        took = time.monotonic() - t0
        for node, (rc, out, err, _) in res.items():
            assert rc == 4, (node, rc, err)
            assert re.search(r"error: rank 3 \(local rank 1\) on node 1 \(.*\) exited with code 4", err), (node, err)
        assert "rank 3 fails" in res[0][2], res[0][2]  # node 0 shows the tail of node 1's rank
        assert took < 30, took  # 3 s of failure grace; the bound only guards against a hang
        assert_gone([int(open("%s/pid%d" % (tmp, r)).read()) for r in range(4)], within=5)


@case
def join_timeout():
    port = ports.claim()
    p = launch(["--nnodes", "2", "--node_rank", "0", "--master_port", str(port), "--rdzv_conf", "join_timeout=3",
                "true"], timeout=30, expect_rc=1)
    assert 2.5 < p.elapsed < 25, p.elapsed  # the 3 s join timeout (the upper bound guards against a hang)
    assert "rendezvous at 127.0.0.1:%d timed out after 3 s: 1 of 2 nodes joined" % port in p.stderr, p.stderr
    assert "waited for node rank(s) 1" in p.stderr and "hint:" in p.stderr and "firewall" in p.stderr, p.stderr
    p = launch(["--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                "--rdzv_conf", "join_timeout=2", "true"], timeout=30, expect_rc=1)
    assert 1.5 < p.elapsed < 25, p.elapsed
    assert "node 1 (" in p.stderr and "could not reach the rendezvous store at 127.0.0.1:%d within 2 s" % port \
        in p.stderr, p.stderr


@case
def c10d_node_ranks():
    port = ports.claim()
    common = ["--nnodes", "2", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
              "127.0.0.1:%d" % port, "--rdzv_id", "c10dtest", "sh", "-c", PRINT_ENV]
    a = start(common)
    wait_for_listener(port)  # a serves the store, so it takes node rank 0
    b = start(common)
    ranks = {}
    for name, p in (("a", a), ("b", b)):
        rc, out, err, _ = finish(p, 30)
        assert rc == 0, (name, err)
        ranks[name] = sorted(worker_envs(out))
    assert ranks == {"a": [0, 1], "b": [2, 3]}, ranks


@case
def programs():
    p = launch(["--standalone", "data", "--help"], expect_rc=0)  # a bare subcommand runs this tessera
    assert "usage: tessera data" in p.stdout, p.stdout
    p = launch(["--standalone", "tessera", "--version"], expect_rc=0)
    assert p.stdout.startswith("tessera "), p.stdout
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "show_rank.py")
        with open(script, "w") as f:
            f.write("import os\nprint('py rank', os.environ['RANK'])\n")
        p = launch(["--standalone", "--nproc_per_node", "2", script], expect_rc=0)
        assert "[rank1]: py rank 1" in p.stdout, p.stdout


def main():
    names = sys.argv[2:] or list(CASES)
    try:
        for name in names:
            t0 = time.monotonic()
            CASES[name]()
            print("ok  %-36s %.1f s" % (name, time.monotonic() - t0), flush=True)
    finally:
        # A launcher left running by a failed case: SIGKILL takes its workers along
        # (PR_SET_PDEATHSIG), as the case launcher_kill9_takes_workers_along checks.
        for p in STARTED:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


if __name__ == "__main__":
    main()
