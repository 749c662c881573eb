"""TCP ports for tests that must know a port before anything binds it (torchrun-style runs
where rank 0 serves the store on MASTER_PORT + 1, two launchers as two nodes on loopback,
a port nobody listens on). A test that only needs *a* port uses `tessera launch --standalone`
(or `--master_port 0`) instead: the launcher binds port 0 once and passes the port on.

    import ports
    port = ports.claim()         # one port, this process's until it exits
    port = ports.claim(count=2)  # port and port + 1

Why a claimed port cannot be taken by anything else in the test suite:
- every test claims through one registry (a folder of claim files under a lock, shared with
  tests/unit/test_ports.h), so two tests running at once never get the same port;
- claims come from below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
  so no port-0 bind (a standalone launcher, Gloo's listening sockets) and no outgoing
  connection's local port can land on one;
- a claim ends when its process does (the claim file names the pid and its start time), and a
  port is handed out only if it can be bound right now, so a server left over from an earlier
  run is skipped rather than fought with.
Ports inside a test's own network namespaces (ip netns) are private to it and need no claim.
"""
import atexit
import fcntl
import os
import random
import socket

REGISTRY = os.environ.get("TESSERA_TEST_PORTS_DIR", "/tmp/tessera-test-ports")
FIRST = 20000  # claims start here: well above the privileged and common service ports


def claimable_range():
    """[first, last] below the kernel's ephemeral range (its low end is 32768 by default)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split())
    if low - FIRST >= 1000:
        return FIRST, low - 1
    if 65535 - high >= 1000:
        return high + 1, 65535
    raise RuntimeError("the ephemeral port range %d-%d leaves no room for test ports; narrow it with "
                       "sysctl net.ipv4.ip_local_port_range=\"32768 60999\"" % (low, high))


def start_time(pid):
    """The process's start time in clock ticks (so that a reused pid is not its owner), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


OWNER = "%d %s" % (os.getpid(), start_time(os.getpid()))
MINE = []


def held(port):
    """True while the claim on `port` belongs to a running process."""
    try:
        with open(os.path.join(REGISTRY, str(port))) as f:
            pid, started = f.read().split()
    except (OSError, ValueError):
        return False
    return start_time(int(pid)) == started


def bindable(port):
    # SO_REUSEADDR as tessera's store sets it: a port in TIME_WAIT is free to it, a listener is not.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def claim(count=1):
    """The first of `count` consecutive ports no other test holds and nothing listens on."""
    os.makedirs(REGISTRY, exist_ok=True)
    first, last = claimable_range()
    with open(os.path.join(REGISTRY, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        span = last - first + 2 - count
        start = random.randrange(span)  # spread the claims: a just-freed port rests a while
        for i in range(span):
            port = first + (start + i) % span
            ports = range(port, port + count)
            if any(held(p) for p in ports) or not all(bindable(p) for p in ports):
                continue
            for p in ports:
                with open(os.path.join(REGISTRY, str(p)), "w") as f:
                    f.write(OWNER)
                MINE.append(p)
            return port
    raise RuntimeError("no %d free consecutive test ports in %d-%d (claims in %s)" % (count, first, last, REGISTRY))


@atexit.register
def release():
    for p in MINE:
        path = os.path.join(REGISTRY, str(p))
        try:
            with open(path) as f:
                mine = f.read() == OWNER
            if mine:
                os.remove(path)
        except OSError:
            pass
