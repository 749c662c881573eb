#!/usr/bin/python3
"""`tessera doctor` end to end: a clean run PASSes alone, under `tessera launch --nproc_per_node 2`
and on two network-namespace hosts (launch_netns_test's set-up, --nnodes 2, one rank each);
every FAIL path is triggered once: a missing data prefix, a truncated .idx, an .idx that is a
folder (we run as root, so chmod 000 would not stop us), a missing vocab file, a wrong
GLOO_SOCKET_IFNAME, an unreachable master, too little disk (a 1 MiB tmpfs; skipped with a
message when mount fails), a model too large for memory, and a bad flag (a FAIL row, not a
crash). Each run bounds its own time.

usage: doctor_test.py TESSERA_BINARY"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_netns_test as netns  # noqa: E402  (namespace set-up and clean-up)
import ports  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(SRC, "tests/data/gpt2/vocab.json"),
        "--merge-file", os.path.join(SRC, "tests/data/gpt2/merges.txt")]
MODEL = ["--split", "90,9,1", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
         "--train-iters", "10"]
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS",
               "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TESSERA_LAUNCHER", "SLURM_PROCID", "SLURM_NTASKS")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(extra)
    return env


def doctor(args, env=None, timeout=60, prefix=None):
    cmd = (prefix or [TESSERA]) + ["doctor"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or clean_env())
    return p.returncode, p.stdout + p.stderr


def row_status(out, check):
    """The statuses of the table rows whose check starts with `check`."""
    found = []
    for line in out.splitlines():
        line = line.split("]: ", 1)[-1] if line.startswith("[rank") else line
        if line.startswith(check):
            rest = line[len(check):].split()
            found.extend(w for w in rest[:3] if w in ("PASS", "INFO", "WARN", "FAIL"))
    return found


def expect_fail(label, args, check, text, env=None):
    rc, out = doctor(args, env=env)
    assert rc == 1, "%s: rc %d\n%s" % (label, rc, out)
    assert "FAIL" in row_status(out, check), "%s: no FAIL row %r\n%s" % (label, check, out)
    assert text in out, "%s: %r missing\n%s" % (label, text, out)
    assert "fix:" in out, "%s: no fix\n%s" % (label, out)
    print("ok  FAIL: %s" % label, flush=True)


def test_fail_paths(tmp, data):
    base = GPT2 + MODEL + ["--data-cache-path", os.path.join(tmp, "cache")]
    expect_fail("missing data prefix", base + ["--data-path", os.path.join(tmp, "nowhere")], "data: ",
                "No such file or directory")
    trunc = os.path.join(tmp, "trunc")
    shutil.copy(data + ".bin", trunc + ".bin")
    with open(data + ".idx", "rb") as f:
        idx = f.read()
    with open(trunc + ".idx", "wb") as f:
        f.write(idx[: len(idx) // 2])
    expect_fail("truncated .idx", base + ["--data-path", trunc], "data: " + trunc, "invalid")
    folder = os.path.join(tmp, "folder")
    os.makedirs(folder + ".idx")
    shutil.copy(data + ".bin", folder + ".bin")
    expect_fail("unreadable .idx (a folder)", base + ["--data-path", folder], "data: " + folder, "not a regular file")
    novocab = [a if a != GPT2[3] else os.path.join(tmp, "gpt2-vocab.json") for a in GPT2]
    expect_fail("missing vocab", novocab + MODEL + ["--data-path", data], "data: tokenizer", "gpt2-vocab.json")
    expect_fail("wrong GLOO_SOCKET_IFNAME", base + ["--data-path", data], "environment: interface", "nosuchif0",
                env=clean_env(GLOO_SOCKET_IFNAME="nosuchif0"))
    port = ports.claim(2)  # rank 1 of 2 under torchrun's variables: the store is MASTER_PORT + 1, closed
    t0 = time.monotonic()
    expect_fail("unreachable master", base + ["--data-path", data, "--doctor-timeout", "1"], "network: store",
                "unreachable", env=clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="1",
                                             WORLD_SIZE="2", LOCAL_RANK="1"))
    # --doctor-timeout 1 is honoured: well under the default 60 s, however loaded the machine.
    assert time.monotonic() - t0 < 40, "the unreachable master took %.1f s" % (time.monotonic() - t0)
    big = GPT2 + ["--num-layers", "200", "--hidden-size", "8192", "--num-attention-heads", "64", "--seq-length",
                  "2048", "--max-position-embeddings", "2048", "--micro-batch-size", "4", "--global-batch-size", "4",
                  "--lr", "1e-3", "--train-iters", "10", "--data-path", data, "--data-cache-path",
                  os.path.join(tmp, "cache")]
    expect_fail("model too large for memory", big, "config: memory", "--micro-batch-size")
    expect_fail("an empty split (175 documents, --split 949,50,1 leaves test none)",
                base + ["--data-path", data, "--split", "949,50,1"], "data: " + data, "the test split")
    expect_fail("bad flag", base + ["--data-path", data, "--num-layerz", "2"], "config: flags", "--num-layerz")


def train_takes_checkpoints():
    help_text = subprocess.run([TESSERA, "train", "--help"], capture_output=True, text=True, timeout=30).stdout
    return "--save " in help_text and "not supported" not in help_text.split("--save ", 1)[1].split("\n", 1)[0]


def test_small_disk(tmp, data):
    small = os.path.join(tmp, "small")
    os.makedirs(small)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small], capture_output=True, text=True,
                       timeout=20)
    if r.returncode != 0:
        print("SKIP too little disk: cannot mount a tmpfs (%s)" % r.stderr.strip(), flush=True)
        return
    try:
        expect_fail("too little disk (1 MiB tmpfs)",
                    GPT2 + MODEL + ["--data-path", data, "--data-cache-path", os.path.join(small, "cache")],
                    "disk: cache folder", "only")
        if train_takes_checkpoints():
            expect_fail("too little disk for --save (1 MiB tmpfs)",
                        GPT2 + MODEL + ["--data-path", data, "--data-cache-path", os.path.join(tmp, "cache"),
                                        "--save", os.path.join(small, "ckpt"), "--save-interval", "5"],
                        "disk: --save", "only")
    finally:
        subprocess.run(["umount", small], timeout=20)


def test_clean(tmp, data):
    args = GPT2 + MODEL + ["--data-path", data, "--data-cache-path", os.path.join(tmp, "cache")]
    rc, out = doctor(args)
    assert rc == 0 and "0 FAIL" in out, out
    rc, out = doctor(args + ["--json"])
    assert rc == 0, out
    doc = json.loads(out)
    assert doc["ok"] and doc["world_size"] == 1, doc
    checks = {c["check"] for c in doc["checks"]}
    for want in ("devices: cpu", "build: versions", "data: tokenizer", "disk: current folder", "config: memory",
                 "checkpoints"):
        assert want in checks, (want, checks)
    print("ok  clean run, one process (table and --json)", flush=True)
    rc, out = doctor(args + ["--save", os.path.join(tmp, "ckpt"), "--save-interval", "5", "--json"])
    doc = json.loads(out)
    rows = {c["check"]: c for c in doc["checks"]}
    if train_takes_checkpoints():
        assert rc == 0 and rows["checkpoints: --save"]["status"] == "PASS", out
        assert rows["disk: --save"]["status"] == "PASS", out
    else:
        assert rows["checkpoints"]["status"] == "WARN", out
    print("ok  --save checked (train %s checkpoints)" % ("takes" if train_takes_checkpoints() else "rejects"),
          flush=True)
    rc, out = doctor(args + ["--doctor-timeout", "20"], timeout=90,
                     prefix=[TESSERA, "launch", "--standalone", "--nproc_per_node", "2", TESSERA])
    assert rc == 0 and "0 FAIL" in out, out
    for check in ("collectives: all_reduce", "collectives: p2p", "network: links", "build: same binary"):
        assert row_status(out, check) == ["PASS"], (check, out)
    print("ok  clean run, 2 processes under tessera launch", flush=True)


def test_load(tmp, data):
    """--load: a checkpoint saved by train loads (checksums, shapes); a flipped byte FAILs."""
    if not train_takes_checkpoints():
        print("SKIP --load: this tessera train has no checkpoint support", flush=True)
        return
    args = GPT2 + MODEL + ["--data-path", data, "--data-cache-path", os.path.join(tmp, "cache")]
    ck = os.path.join(tmp, "ck")
    p = subprocess.run([TESSERA, "train"] + args + ["--train-iters", "2", "--eval-iters", "0", "--save", ck,
                                                    "--save-interval", "2", "--ckpt-format", "tessera"],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rc, out = doctor(args + ["--load", ck])
    assert rc == 0 and row_status(out, "checkpoints: --load") == ["PASS"], out
    model = os.path.join(ck, "iter_0000002", "mp_rank_00", "model.safetensors")
    with open(model, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    expect_fail("corrupt checkpoint for --load", args + ["--load", ck], "checkpoints: --load", "checksum")


def test_different_binaries(tmp, data):
    """Rank 1 runs a copy of the binary with one byte appended (still a valid ELF): a FAIL naming rank 1."""
    other = os.path.join(tmp, "tessera-other")
    shutil.copy(TESSERA, other)
    with open(other, "ab") as f:
        f.write(b"\0")
    args = GPT2 + MODEL + ["--data-path", data, "--data-cache-path", os.path.join(tmp, "cache"), "--doctor-timeout", "20"]
    script = 'if [ "$RANK" = 1 ]; then exec "$0" doctor "$@"; else exec %s doctor "$@"; fi' % TESSERA
    cmd = [TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "sh", "-c", script, other] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=clean_env())
    out = p.stdout + p.stderr
    assert p.returncode == 1, (p.returncode, out)
    assert row_status(out, "build: same binary") == ["FAIL"], out
    assert "rank 1 (" in out and "run a different binary" in out, out
    print("ok  FAIL: ranks running different binaries", flush=True)


def test_two_hosts(tmp, data):
    netns.set_up()  # exits 77 without the rights to make namespaces
    try:
        args = GPT2 + MODEL + ["--data-path", data, "--data-cache-path", os.path.join(tmp, "cache"),
                               "--doctor-timeout", "30", "--bandwidth-mb", "4"]
        results = netns.launch_on_both([TESSERA, "doctor"] + args, 1,
                                       lambda node: clean_env(GLOO_SOCKET_IFNAME=netns.VETH[node]),
                                       join_timeout=60, timeout=120)
        outs = {}
        for node, (rc, out, err) in results.items():
            assert rc == 0, (node, rc, out[-4000:], err[-4000:])
            outs[node] = out + err
        out = outs[0]
        if os.environ.get("DOCTOR_TEST_VERBOSE"):
            print(out)
        assert "0 FAIL" in out, out
        assert netns.ADDR[0] in out and "network: links" in out, out
        assert row_status(out, "collectives: all_reduce") == ["PASS"], out
    finally:
        netns.tear_down()
    print("ok  clean run, two network-namespace hosts (--nnodes 2, one rank each)", flush=True)


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # still runs the clean-ups
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([TESSERA, "preprocess", "--input", os.path.join(SRC, "tests/data/corpora/alpaca_self_instruct_seed.json"),
                        "--text-template", "{instruction}\n{output}", "--output-prefix", os.path.join(tmp, "seed"),
                        "--append-eod", "--workers", "1"] + GPT2, check=True, capture_output=True, timeout=60)
        data = os.path.join(tmp, "seed_text_document")
        test_clean(tmp, data)
        test_fail_paths(tmp, data)
        test_small_disk(tmp, data)
        test_different_binaries(tmp, data)
        test_load(tmp, data)
        test_two_hosts(tmp, data)


if __name__ == "__main__":
    main()
