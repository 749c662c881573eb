"""Tiny test harness for the data area's Python tests (run by CTest with /usr/bin/python3).

  python3 X_test.py --tessera PATH/TO/tessera --workdir DIR [-k NAME]

Every function named test_* runs in order, each in a fresh sub-folder of --workdir; the
script exits 1 if any fails. Helpers run the tessera binary and compare files byte for byte.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DATA = os.path.join(SOURCE, "tests", "data")
VOCAB = os.path.join(DATA, "gpt2", "vocab.json")
MERGES = os.path.join(DATA, "gpt2", "merges.txt")
GPT2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", VOCAB, "--merge-file", MERGES]

TESSERA = None


def tessera(*args, check=True, timeout=120):
    """Runs `tessera ARGS`; returns CompletedProcess (text). check: expect exit 0."""
    p = subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"tessera {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def reference(*args, check=True):
    """Runs preprocess_ref.py (the Python oracle)."""
    cmd = [sys.executable, os.path.join(HERE, "preprocess_ref.py"), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"preprocess_ref.py exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def read(path):
    with open(path, "rb") as f:
        return f.read()


def same_dataset(prefix_a, prefix_b):
    for ext in (".bin", ".idx"):
        a, b = read(prefix_a + ext), read(prefix_b + ext)
        if a != b:
            n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            raise AssertionError(f"{prefix_a}{ext} ({len(a)} bytes) differs from {prefix_b}{ext} "
                                 f"({len(b)} bytes) at byte {n}")


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def main(tests):
    global TESSERA
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    TESSERA = os.path.abspath(args.tessera)
    failed = 0
    for name, fn in tests:
        if args.k and args.k not in name:
            continue
        d = os.path.join(os.path.abspath(args.workdir), name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cwd = os.getcwd()
        os.chdir(d)
        t = time.time()
        try:
            fn()
            print(f"PASS {name} ({time.time() - t:.2f} s)")
            shutil.rmtree(d, ignore_errors=True)
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        finally:
            os.chdir(cwd)
    sys.exit(1 if failed else 0)


def run_module(namespace):
    main([(k, v) for k, v in namespace.items() if k.startswith("test_") and callable(v)])
