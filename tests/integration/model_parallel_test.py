#!/usr/bin/python3
"""Tensor, pipeline and data parallelism and their products reproduce the single-process run:
every layout of TP in {1,2,4}, PP in {1,2,4} (plain 1F1B, uneven and interleaved), DP in
{1,2}, with and without --sequence-parallel, up to 8 processes on loopback, gives the losses
and gradient norms of one process within 1e-5 relative over 10 iterations, with dropout off
and again on (weights and dropout masks are drawn from counters keyed by full-tensor element
and global sample, so every layout draws the same ones). Pure pipeline parallelism of an
untied model gives the single process's numbers to the bit. The padded vocabulary is 64 for
every TP here (--vocab-size 60 + eod, --make-vocab-size-divisible-by 16).
With --device D: the smallest layouts only, every run on device D (test_device).
usage: model_parallel_test.py TESSERA_BINARY [two-hosts | --device D]"""
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
TRAIN = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "8",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--make-vocab-size-divisible-by", "16",
         "--mock-data", "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "10", "--log-interval", "1",
         "--eval-iters", "1", "--eval-interval", "5", "--weight-decay", "0.1", "--clip-grad", "0.5"]
NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0"]
# 4 layers, except for the interleaved schedule, which runs PP 4 and PP 2 with 2 virtual stages
# each (TP runs are latency-bound on loopback: fewer layers keep them short).
FOUR, EIGHT = ["--num-layers", "4"], ["--num-layers", "8"]
RTOL = 1e-5


def env_without_launch():
    return {k: v for k, v in os.environ.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}


def records(path):
    return [json.loads(l) for l in open(path)]


def compare(reference, other, label, exact=False):
    assert [r["iteration"] for r in other] == [r["iteration"] for r in reference], label
    for a, b in zip(reference, other):
        for key in ("lm_loss", "grad_norm"):
            ok = a[key] == b[key] if exact else abs(a[key] - b[key]) <= RTOL * abs(a[key])
            assert ok, (label, a["iteration"], key, a[key], b[key])


def validation_losses(out):
    return [float(l.split("lm loss value: ")[1].split(" ")[0]) for l in out.splitlines() if "validation loss at" in l]


def train(tmp, label, procs, flags):
    path = os.path.join(tmp, label.replace(" ", "_") + ".jsonl")
    cmd = [TESSERA, "train"] if procs == 1 else [TESSERA, "launch", "--standalone", "--nproc_per_node", str(procs),
                                                   "train"]
    env = env_without_launch()
    if procs == 1:
        env["OMP_NUM_THREADS"] = "1"  # as the launcher gives each worker: threads crawl on a loaded machine
    p = subprocess.run(cmd + TRAIN + flags + ["--log-json", path], capture_output=True, text=True, timeout=240,
                       env=env)
    assert p.returncode == 0, "%s: rc %d\n%s\n%s" % (label, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return records(path), validation_losses(p.stdout)


# (label, processes, flags)
LAYOUTS = [
    ("tp2", 2, ["--tensor-model-parallel-size", "2"]),
    ("tp4", 4, ["--tensor-model-parallel-size", "4"]),
    ("pp2", 2, ["--pipeline-model-parallel-size", "2"]),
    ("pp4", 4, ["--pipeline-model-parallel-size", "4"]),
    ("pp2 uneven 1+3", 2, ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"]),
    ("pp4 interleaved", 4, ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1"]),
    # Two ranks exchange two chunks' activations both ways (Megatron allows PP 2 with its
    # default overlapped p2p communication).
    ("pp2 interleaved", 2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"]),
    ("tp2 pp2", 4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    ("tp2 dp2", 4, ["--tensor-model-parallel-size", "2"]),
    ("pp2 dp2", 4, ["--pipeline-model-parallel-size", "2", "--overlap-grad-reduce", "--ddp-bucket-size", "3000"]),
    ("tp2 sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ("tp2 pp2 dp2", 8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    ("tp2 sp pp2 dp2", 8, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                           "--pipeline-model-parallel-size", "2"]),
    ("tp4 sp pp2", 8, ["--tensor-model-parallel-size", "4", "--sequence-parallel", "--pipeline-model-parallel-size",
                       "2"]),
    ("pp4 interleaved dp2", 8, ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage",
                                "1"]),
]
WITH_DROPOUT = ["tp2", "pp4 interleaved", "pp2 interleaved", "tp2 sp pp2 dp2", "tp4 sp pp2"]


def test_layouts(tmp, dropout):
    extra = [] if dropout else NO_DROPOUT
    tag = "dropout" if dropout else "no-dropout"
    references = {}
    for layers in (FOUR, EIGHT):
        references[layers[1]] = train(tmp, "single %s layers %s" % (layers[1], tag), 1, extra + layers)
        reference, ref_valid = references[layers[1]]
        assert len(reference) == 10 and len(ref_valid) == 4, (len(reference), ref_valid)  # iterations 5, 10, end, test
    for label, procs, flags in LAYOUTS:
        if dropout and label not in WITH_DROPOUT:
            continue
        layers = EIGHT if "interleaved" in label else FOUR
        reference, ref_valid = references[layers[1]]
        t0 = time.monotonic()
        got, valid = train(tmp, label + " " + tag, procs, flags + extra + layers)
        compare(reference, got, label + " " + tag)
        assert len(valid) == len(ref_valid) and all(abs(a - b) <= RTOL * a for a, b in zip(ref_valid, valid)), (
            label, ref_valid, valid)
        print("ok  %-22s %-10s %d processes  %.1f s" % (label, tag, procs, time.monotonic() - t0), flush=True)


def test_pipeline_bit_exact(tmp, device="cpu", sizes=(2, 4)):
    """Bit-identity across layouts is a property of each backend: pure PP of an untied model
    gives that backend's one-process bits."""
    untied = ["--untie-embeddings-and-output-weights", "--device", device] + FOUR
    reference, _ = train(tmp, "single untied " + device, 1, untied)
    for pp in sizes:
        got, _ = train(tmp, "pp%d untied %s" % (pp, device), pp, untied + ["--pipeline-model-parallel-size", str(pp)])
        compare(reference, got, "pp%d untied %s" % (pp, device), exact=True)
    print("ok  pure PP of an untied model is bit-exact on %s (PP=%s)" % (device, ", ".join(map(str, sizes))),
          flush=True)


def test_init_from_hf(tmp):
    """--init-from-hf shards a Hugging Face GPT-2 (the PyTorch reference's) over TP 2 x PP 2
    like the single process loads it whole."""
    ref = os.path.join(tmp, "hf_reference")
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["/usr/bin/python3", os.path.join(source, "reference", "gpt_reference.py"), "--out", ref],
                   check=True, capture_output=True, timeout=120)
    args = json.load(open(os.path.join(ref, "train_config.json")))["megatron_args"]
    # Padded vocabulary 128 for TP 1 and 2 (the reference's 128 x TP would give 256).
    args = args + ["--mock-data", "--log-interval", "1", "--make-vocab-size-divisible-by", "64"]
    logs = []
    for label, cmd in (("single", [TESSERA, "train"]),
                       ("tp2 pp2", [TESSERA, "launch", "--standalone", "--nproc_per_node", "4", "train", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"])):
        path = os.path.join(tmp, "hf_%s.jsonl" % label.replace(" ", "_"))
        p = subprocess.run(cmd + args + ["--log-json", path], capture_output=True, text=True, timeout=240,
                           env=env_without_launch())
        assert p.returncode == 0 and "initialised from Hugging Face GPT-2 weights" in p.stdout, (
            label, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        logs.append(records(path))
    compare(logs[0], logs[1], "--init-from-hf tp2 pp2")
    print("ok  --init-from-hf shards over TP 2 x PP 2", flush=True)


def test_layout_errors(tmp):
    cases = [
        (2, ["--tensor-model-parallel-size", "3"], "not divisible by --tensor-model-parallel-size 3 x"),
        (1, ["--pipeline-model-parallel-size", "1", "--num-layers", "6", "--decoder-first-pipeline-num-layers", "2"],
         "--pipeline-model-parallel-size > 1"),
        (1, ["--tensor-model-parallel-size", "1", "--num-layers-per-virtual-pipeline-stage", "1"],
         "--pipeline-model-parallel-size > 1"),
    ]
    for procs, flags, message in cases:
        p = subprocess.run([TESSERA, "train"] + TRAIN + EIGHT + flags + ["--dry-run"], capture_output=True, text=True,
                           timeout=60, env=env_without_launch())
        assert p.returncode == 2 and message in p.stderr, (flags, p.returncode, p.stderr[-2000:])
    # 8 layers over PP 3 do not divide: the error names both flags.
    env = env_without_launch()
    env.update({"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports.claim(2))})
    p = subprocess.run([TESSERA, "train"] + TRAIN + EIGHT + ["--pipeline-model-parallel-size", "3", "--dry-run"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "--num-layers 8 is not divisible by --pipeline-model-parallel-size 3" in p.stderr, (
        p.stderr[-2000:])
    # Megatron's interleaved rule: PP 2 only with its (default) overlapped p2p communication.
    env["WORLD_SIZE"] = "2"  # refused while parsing: nothing connects
    p = subprocess.run([TESSERA, "train"] + TRAIN + EIGHT + ["--pipeline-model-parallel-size", "2",
                                                             "--num-layers-per-virtual-pipeline-stage", "2",
                                                             "--no-overlap-p2p-communication", "--dry-run"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "with --no-overlap-p2p-communication needs --pipeline-model-parallel-size > 2" in (
        p.stderr), p.stderr[-2000:]
    print("ok  layout errors name the flags", flush=True)


def test_two_hosts(tmp):
    """The two-server guide's layout, TP=2 x PP=2 x DP=4 over 2 nodes x 8 processes, on two
    network-namespace hosts, against one process."""
    model = NO_DROPOUT + ["--global-batch-size", "16", "--num-layers", "4"]
    flags = model + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
    reference, _ = train(tmp, "single guide", 1, model)
    netns.set_up()  # exits 77 without the rights to make namespaces
    try:
        path = os.path.join(tmp, "two_hosts.jsonl")
        def env_of(node):
            return dict(env_without_launch(), GLOO_SOCKET_IFNAME=netns.VETH[node])
        results = netns.launch_on_both(["train"] + TRAIN + flags + ["--log-json", path], 8, env_of, join_timeout=120,
                                       timeout=400)
        for node, (rc, out, err) in results.items():
            assert rc == 0, (node, rc, out[-3000:], err[-3000:])
        compare(reference, records(path), "two hosts TP2 PP2 DP4")
    finally:
        netns.tear_down()
    print("ok  two hosts x 8 processes, TP=2 PP=2 DP=4", flush=True)


def test_device(tmp, device):
    """The smallest layout of each kind on `device` (CI: the strict test device, on which any
    host access outside a backend fails naming the place): one process equals the CPU's
    bit for bit (the same kernels); TP=2 x DP=2, PP=2, TP=2 with sequence parallelism,
    interleaved PP=4 and DP=2 with the distributed optimizer equal it within 1e-5; dropout
    on; and pure PP=2 of an untied model gives the device's own one-process bits."""
    on_device = ["--device", device] + FOUR
    reference, _ = train(tmp, "single reference", 1, FOUR)
    single, _ = train(tmp, "single " + device, 1, on_device)
    compare(reference, single, "single " + device, exact=device == "strict")
    distributed_optimizer = ("dp2 distributed optimizer", 2, ["--use-distributed-optimizer"])
    for label, procs, flags in LAYOUTS + [distributed_optimizer]:
        if label in ("tp2 dp2", "pp2", "tp2 sp", "pp4 interleaved", distributed_optimizer[0]):
            t0 = time.monotonic()
            got, _ = train(tmp, label + " " + device, procs, flags + on_device)
            compare(reference, got, label + " " + device)
            print("ok  %-22s %-10s %d processes  %.1f s" % (label, device, procs, time.monotonic() - t0), flush=True)
    test_pipeline_bit_exact(tmp, device, sizes=(2,))


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # still runs the clean-ups
    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[2:] == ["two-hosts"]:
            test_two_hosts(tmp)
            return
        if sys.argv[2:3] == ["--device"]:
            test_device(tmp, sys.argv[3])
            return
        test_layout_errors(tmp)
        test_init_from_hf(tmp)
        test_layouts(tmp, dropout=False)
        test_layouts(tmp, dropout=True)
        test_pipeline_bit_exact(tmp)


if __name__ == "__main__":
    main()
