"""tessera's TensorBoard event files read by TensorBoard's own reader (EventAccumulator).

Run by CTest as metrics.tensorboard_reader:
    tensorboard_reader_test.py --writer WRITE_TENSORBOARD_EVENTS --venv VENV --workdir DIR
TensorBoard comes from PyPI into VENV (scripts/setup.sh's test-only step); this script starts
under /usr/bin/python3 and re-runs itself with VENV's python. Without it the test fails.
"""
import argparse
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--writer", required=True)
parser.add_argument("--venv", required=True)
parser.add_argument("--workdir", required=True)
args = parser.parse_args()

venv_python = os.path.join(args.venv, "bin", "python")
if os.path.realpath(sys.prefix) != os.path.realpath(args.venv):
    if not os.access(venv_python, os.X_OK):
        sys.exit(f"FAIL: no TensorBoard test environment at {args.venv}: run scripts/setup.sh "
                 "(its test-only step installs tensorboard from PyPI there)")
    os.execv(venv_python, [venv_python] + sys.argv)

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
except ImportError as e:
    sys.exit(f"FAIL: tensorboard cannot be imported in {args.venv} ({e}): run scripts/setup.sh")

# In non-decreasing step order: EventAccumulator drops earlier events of every tag when a
# step goes backwards (its "orphaned data" purge after a restart).
CASES = [
    ("lm loss", 1, 10.25),
    ("learning-rate", 1, 6e-4),                 # not a float: rounded to float32
    ("lm loss", 2, 9.5),
    ("loss-scale", 2, 4294967296.0),
    ("grad-norm", 3, 1.0 / 3.0),
    ("lm loss validation ppl/x", 3, -2.5),      # spaces and a slash in the tag
    ("lm loss", 3_000_000_000, 7.0),            # a step past int32
]

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]

def fail(message):
    sys.exit("FAIL: " + message)

shutil.rmtree(args.workdir, ignore_errors=True)
out_dir = os.path.join(args.workdir, "run")
before = time.time()
argv = [args.writer, out_dir] + [str(x) for case in CASES for x in (case[0], case[1], repr(case[2]))]
result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
after = time.time()
if result.returncode != 0:
    fail(f"{' '.join(argv)} exited {result.returncode}: {result.stderr}")
path = result.stdout.strip()

# The file name TensorBoard looks for: events.out.tfevents.<unix seconds>.<hostname>.
files = os.listdir(out_dir)
if files != [os.path.basename(path)]:
    fail(f"expected only {path} in {out_dir}, found {files}")
name = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)", files[0])
if not name or name.group(2) != socket.gethostname():
    fail(f"file name {files[0]} is not events.out.tfevents.<secs>.{socket.gethostname()}")
if not int(before) - 1 <= int(name.group(1)) <= after + 1:
    fail(f"file name time {name.group(1)} is not between {before} and {after}")

# Every record, CRCs checked by TensorBoard's loader (a bad CRC ends the file early, quietly).
events = list(event_file_loader.EventFileLoader(path).Load())
if len(events) != 1 + len(CASES):
    fail(f"TensorBoard read {len(events)} events, expected {1 + len(CASES)}")
if events[0].file_version != "brain.Event:2":
    fail(f"first event's file_version is {events[0].file_version!r}")
for e in events:
    if not before - 1 <= e.wall_time <= after + 1:
        fail(f"wall_time {e.wall_time} not between {before} and {after}")

acc = event_accumulator.EventAccumulator(out_dir, size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
expected = {}
for tag, step, value in CASES:
    expected.setdefault(tag, []).append((step, f32(value)))
got_tags = sorted(acc.Tags()["scalars"])
if got_tags != sorted(expected):
    fail(f"scalar tags {got_tags}, expected {sorted(expected)}")
for tag, want in expected.items():
    got = [(s.step, s.value) for s in acc.Scalars(tag)]
    if got != want:  # exact: simple_value is a float32 both ways
        fail(f"{tag}: read {got}, expected {want}")

# The reader really checks CRCs: one flipped byte in the last record's data loses that record.
corrupt = os.path.join(args.workdir, "corrupt", os.path.basename(path))
os.makedirs(os.path.dirname(corrupt))
data = bytearray(open(path, "rb").read())
data[-6] ^= 0x01
open(corrupt, "wb").write(bytes(data))
if len(list(event_file_loader.EventFileLoader(corrupt).Load())) != len(CASES):
    fail("TensorBoard's loader accepted a record with a bad CRC; this test would not see one")

print(f"ok: {len(CASES)} scalars in {len(expected)} tags read back by tensorboard from {path}")
