#!/usr/bin/python3
"""Sharded checkpoints (TP/PP/DP) and resharding, through `tessera launch ... train` on
loopback, with dropout on (tessera's randomness is keyed by (seed, iteration, sample), so there
is no RNG state to save and every layout draws the same masks):

- bit-exact resume of a 3D layout: TP=2 PP=2 DP=2 (8 processes), 20 iterations straight vs
  10 + save + resume + 10: the same lm loss, grad norm, learning rate and consumed samples at
  every iteration (the --log-json records compared exactly) and the same validation lines;
- resharding: the TP=2 PP=2 DP=2 checkpoint of iteration 10 resumed into one process, into
  TP=4 PP=1 DP=2, into TP=1 PP=4 DP=1 and into PP=4 interleaved (2 virtual stages) DP=2
  continues with the losses and gradient norms of the original layout's own iterations
  11..20 within 1e-5 relative; the interleaved run's own checkpoint resumes bit-exact; a
  one-process checkpoint resumed into TP=2 PP=2 continues as the one-process run does;
- the same for Megatron's torch_dist format saved with the distributed optimizer (every DP rank
  writing its ranges) at TP=2 PP=2 DP=2, resumed into TP=4 PP=1 DP=2 with the distributed
  optimizer and into TP=1 PP=4 DP=1 without it;
- the layout on disk (mp_rank_{tp:02d}_{pp:03d}, DP rank 0 writes, no tied-embedding copy,
  optimizer state by parameter name, placement metadata), `ckpt inspect` of it, `ckpt
  export-hf` of it equal to the export of the same weights saved by one process, and an
  import-hf checkpoint (TP=1, PP=1) fine-tuned in TP=2 PP=2 as in one process;
- the checkpoint's padded vocabulary is kept when the flags would pad differently (Megatron
  takes it from the checkpoint's arguments); a missing shard folder is a clear error naming
  the file, on every rank, without waiting for a timeout.
The model is model_parallel_test.py's: 8 layers, hidden 32, 4 heads, seq 16, vocabulary 60 +
eod padded to 64 (--make-vocab-size-divisible-by 16) for TP 1, 2 and 4.
With --device D: a TP=2 save resumed into PP=2 only, on device D.
usage: checkpoint_reshard_test.py TESSERA_BINARY [--device D]"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

TESSERA = os.path.abspath(sys.argv[1])
MODEL = ["--ckpt-format", "tessera",
         "--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer", "--vocab-size", "60",
         "--make-vocab-size-divisible-by", "16"]
TRAIN = MODEL + ["--micro-batch-size", "1", "--global-batch-size", "8", "--mock-data", "--lr", "1e-3",
                 "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--train-iters", "20", "--log-interval",
                 "1", "--eval-iters", "1", "--eval-interval", "5", "--weight-decay", "0.1", "--clip-grad", "0.5"]
RTOL = 1e-5


def env_without_launch():
    return {k: v for k, v in os.environ.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}


def layout(tp, pp):
    return ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]


def run(procs, flags, expect_rc=0, timeout=180):
    cmd = [TESSERA, "train"] if procs == 1 else [TESSERA, "launch", "--standalone", "--nproc_per_node", str(procs),
                                                   "train"]
    env = env_without_launch()
    if procs == 1:
        env["OMP_NUM_THREADS"] = "1"  # as the launcher gives each worker: no oversubscription
    p = subprocess.run(cmd + TRAIN + flags, capture_output=True, text=True, timeout=timeout, env=env)
    ok = p.returncode == expect_rc if expect_rc is not None else p.returncode != 0
    assert ok, "rc %d (want %s): %s\n%s\n%s" % (p.returncode, expect_rc, " ".join(flags), p.stdout[-3000:],
                                                p.stderr[-3000:])
    return p


def records(path):
    return [json.loads(l) for l in open(path)]


def validation(out):
    return [l.split("]: ")[-1].strip() for l in out.splitlines() if "validation loss at" in l]


def compare(reference, got, label, exact=False):
    assert [r["iteration"] for r in got] == [r["iteration"] for r in reference], (
        label, [r["iteration"] for r in got])
    for a, b in zip(reference, got):
        assert a["consumed_samples"] == b["consumed_samples"], (label, a, b)
        for key in ("lm_loss", "grad_norm", "learning_rate"):
            ok = a[key] == b[key] if exact else abs(a[key] - b[key]) <= RTOL * abs(a[key])
            assert ok, (label, a["iteration"], key, a[key], b[key])


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def safetensors_tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


class Timer:
    def __init__(self, label):
        self.label = label

    def __enter__(self):
        self.t0 = time.monotonic()

    def __exit__(self, *exc):
        if not exc[0]:
            print("ok  %-58s %5.1f s" % (self.label, time.monotonic() - self.t0), flush=True)


def test_device(tmp, device):
    """CI's strict-device run: a checkpoint saved by TP=2 (both halves of every split tensor)
    resumes into PP=2 and continues as one uninterrupted process on the CPU does."""
    on_device = ["--device", device]
    with Timer("one process on the CPU, 20 iterations"):
        run(1, ["--log-json", f"{tmp}/straight.jsonl"])
        straight = records(f"{tmp}/straight.jsonl")
    with Timer("TP=2 on %s: 10 + save, resumed into PP=2" % device):
        run(2, on_device + layout(2, 1) + ["--save", f"{tmp}/ckpt", "--save-interval", "10", "--exit-interval", "10",
                                           "--log-json", f"{tmp}/resharded.jsonl"])
        out = run(2, on_device + layout(1, 2) + ["--load", f"{tmp}/ckpt", "--log-json", f"{tmp}/resharded.jsonl"])
        assert "resharded: saved with TP=2 PP=1 DP=1" in out.stdout, out.stdout[-2000:]
        compare(straight, records(f"{tmp}/resharded.jsonl"), "TP=2 saved, PP=2 resumed on " + device)


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[2:3] == ["--device"]:
            test_device(tmp, sys.argv[3])
            return
        ckpt = f"{tmp}/ckpt3d"
        with Timer("3D straight, 20 iterations (TP=2 PP=2 DP=2)"):
            straight_out = run(8, layout(2, 2) + ["--log-json", f"{tmp}/straight.jsonl"]).stdout
            straight = records(f"{tmp}/straight.jsonl")
            assert [r["iteration"] for r in straight] == list(range(1, 21))

        with Timer("3D bit-exact: 10 + save + resume + 10"):
            first = run(8, layout(2, 2) + ["--save", ckpt, "--save-interval", "10", "--exit-interval", "10",
                                           "--log-json", f"{tmp}/resumed.jsonl"]).stdout
            second = run(8, layout(2, 2) + ["--load", ckpt, "--log-json", f"{tmp}/resumed.jsonl"]).stdout
            assert "loading checkpoint from %s at iteration 10" % ckpt in second, second[-2000:]
            compare(straight, records(f"{tmp}/resumed.jsonl"), "3D resume", exact=True)
            assert validation(straight_out) == validation(first) + validation(second), (
                validation(straight_out), validation(first), validation(second))
            assert open(f"{ckpt}/latest_checkpointed_iteration.txt").read() == "10"

        with Timer("layout on disk, metadata, ckpt inspect"):
            it = f"{ckpt}/iter_0000010"
            shards = sorted(d for d in os.listdir(it) if os.path.isdir(f"{it}/{d}"))
            assert shards == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"], shards
            assert not [d for d in os.listdir(ckpt) if ".tmp-" in d], os.listdir(ckpt)
            meta = json.load(open(f"{it}/metadata.json"))
            assert (meta["tensor_model_parallel_size"], meta["pipeline_model_parallel_size"],
                    meta["data_parallel_size"], meta["virtual_pipeline_model_parallel_size"],
                    meta["padded_vocab_size"], meta["format_version"]) == (2, 2, 2, 1, 64, 2), meta
            assert sorted(meta["files"]) == sorted(f"{s}/{f}" for s in shards
                                                   for f in ("model.safetensors", "optimizer.safetensors"))
            assert meta["consumed_train_samples"] == 80 and meta["iteration"] == 10
            first_stage = safetensors_header(f"{it}/mp_rank_01_000/model.safetensors")
            last_stage = safetensors_header(f"{it}/mp_rank_01_001/model.safetensors")
            emb = first_stage["embedding.word_embeddings.weight"]
            assert emb["shape"] == [32, 32], emb
            assert first_stage["__metadata__"]["embedding.word_embeddings.weight"] == \
                "global_shape=[64, 32];split_dim=0;offset=[32, 0]", first_stage["__metadata__"]
            # Global layer names; the tied embedding's last-stage copy is not saved.
            assert "decoder.layers.7.mlp.linear_fc2.weight" in last_stage and \
                "decoder.layers.3.mlp.linear_fc2.weight" in first_stage
            assert last_stage["decoder.layers.7.mlp.linear_fc2.weight"]["shape"] == [32, 64]
            assert "embedding.word_embeddings.weight" not in last_stage and "output_layer.weight" not in last_stage
            assert last_stage["__metadata__"]["decoder.layers.7.mlp.linear_fc2.weight"] == \
                "global_shape=[32, 128];split_dim=1;offset=[0, 64]"
            opt = safetensors_header(f"{it}/mp_rank_01_000/optimizer.safetensors")
            assert opt["exp_avg.embedding.word_embeddings.weight"]["shape"] == [32, 32]
            assert opt["__metadata__"]["exp_avg_sq.decoder.layers.0.self_attention.linear_qkv.weight"] == \
                "global_shape=[96, 32];split_dim=0;offset=[48, 0]"
            p = subprocess.run([TESSERA, "ckpt", "inspect", ckpt], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
            assert "tensor-parallel 2, pipeline-parallel 2, data-parallel 2" in p.stdout, p.stdout[:2000]
            assert "padded vocabulary 64" in p.stdout and "checksums: all 8 files OK" in p.stdout
            assert "of [64, 32], dim 0 from 32" in p.stdout

        # Resharding: each continues as the 3D run's own iterations 11..20.
        for label, procs, flags in (("one process", 1, []),
                                    ("TP=4 PP=1 DP=2", 8, layout(4, 1)),
                                    ("TP=1 PP=4 DP=1", 4, layout(1, 4))):
            with Timer("reshard TP=2 PP=2 DP=2 -> " + label):
                log = f"{tmp}/reshard_{procs}_{len(flags)}_{label[:4]}.jsonl"
                out = run(procs, flags + ["--load", ckpt, "--log-json", log]).stdout
                assert "resharded: saved with TP=2 PP=2 DP=2" in out, out[-2000:]
                compare(straight[10:], records(log), "reshard to " + label)

        with Timer("torch_dist, distributed optimizer: TP=2 PP=2 DP=2 saved, resharded"):
            # Megatron's default format, the distributed optimizer's ranges in Megatron's layout for
            # it (every DP rank writes its own), resumed into another TP, PP and DP, with and
            # without the distributed optimizer: each continues as the 3D run's iterations 11..20.
            dist = f"{tmp}/ckpt_torch_dist"
            dist_flags = ["--ckpt-format", "torch_dist", "--use-distributed-optimizer"]
            run(8, layout(2, 2) + dist_flags + ["--save", dist, "--save-interval", "10", "--exit-interval", "10"])
            assert sorted(f for f in os.listdir(f"{dist}/iter_0000010") if f.endswith(".distcp")) == \
                ["__%d_0.distcp" % r for r in range(8)], os.listdir(f"{dist}/iter_0000010")
            for label, procs, flags in (("TP=4 PP=1 DP=2, distributed optimizer", 8, layout(4, 1) + dist_flags),
                                        ("TP=1 PP=4 DP=1", 4, layout(1, 4))):
                log = f"{tmp}/torch_dist_{procs}.jsonl"
                out = run(procs, flags + ["--load", dist, "--log-json", log]).stdout
                assert "resharded: saved with TP=2 PP=2 DP=2" in out, out[-2000:]
                compare(straight[10:], records(log), "torch_dist reshard to " + label)

        with Timer("reshard -> PP=4 interleaved DP=2; its own save resumes bit-exact"):
            # Virtual stages: a rank's folder holds the layers of both its chunks, and the tied
            # embedding's copy sits in chunk 1 of the last rank.
            inter, log = f"{tmp}/ckpt_interleaved", f"{tmp}/interleaved.jsonl"
            flags = layout(1, 4) + ["--num-layers-per-virtual-pipeline-stage", "1"]
            run(8, flags + ["--load", ckpt, "--save", inter, "--save-interval", "5", "--log-json", log])
            continued = records(log)
            compare(straight[10:], continued, "reshard to PP=4 interleaved")
            meta = json.load(open(f"{inter}/iter_0000015/metadata.json"))
            assert (meta["pipeline_model_parallel_size"], meta["virtual_pipeline_model_parallel_size"],
                    meta["data_parallel_size"]) == (4, 2, 2), meta
            last = safetensors_header(f"{inter}/iter_0000015/mp_rank_00_003/model.safetensors")
            assert {"decoder.layers.3.mlp.linear_fc1.weight", "decoder.layers.7.mlp.linear_fc1.weight",
                    "decoder.final_layernorm.weight"} <= last.keys() and \
                "embedding.word_embeddings.weight" not in last, sorted(last)
            with open(f"{inter}/latest_checkpointed_iteration.txt", "w") as f:
                f.write("15")  # an earlier iteration, as the docs say
            run(8, flags + ["--load", inter, "--log-json", f"{tmp}/interleaved_again.jsonl"])
            compare(continued[5:], records(f"{tmp}/interleaved_again.jsonl"), "interleaved resume", exact=True)

        with Timer("one-process checkpoint -> TP=2 PP=2 (single straight + save)"):
            single = f"{tmp}/ckpt1"
            run(1, ["--log-json", f"{tmp}/single.jsonl"])
            run(1, ["--save", single, "--save-interval", "10", "--exit-interval", "10"])
            assert os.path.isdir(f"{single}/iter_0000010/mp_rank_00")
            run(4, layout(2, 2) + ["--load", single, "--log-json", f"{tmp}/single_to_3d.jsonl"])
            compare(records(f"{tmp}/single.jsonl")[10:], records(f"{tmp}/single_to_3d.jsonl"), "1 -> TP2 PP2")

        with Timer("export-hf of the 3D checkpoint = of its one-process resave"):
            resaved = f"{tmp}/resaved"
            # Loads the 3D checkpoint in one process and saves it again at iteration 10 (the end
            # of training, not a multiple of --save-interval): the same weights, whole.
            run(1, ["--load", ckpt, "--save", resaved, "--save-interval", "7", "--train-iters", "10",
                "--override-opt_param-scheduler"])
            for src, out in ((ckpt, f"{tmp}/hf3d"), (resaved, f"{tmp}/hf1")):
                p = subprocess.run([TESSERA, "ckpt", "export-hf", src, out], capture_output=True, text=True,
                                   timeout=60)
                assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
            a = safetensors_tensors(f"{tmp}/hf3d/model.safetensors")
            b = safetensors_tensors(f"{tmp}/hf1/model.safetensors")
            assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "export-hf differs by layout"
            assert open(f"{tmp}/hf3d/config.json").read() == open(f"{tmp}/hf1/config.json").read()

        with Timer("import-hf (TP=1 PP=1) fine-tuned in TP=2 PP=2 as in one process"):
            imported = f"{tmp}/imported"
            p = subprocess.run([TESSERA, "ckpt", "import-hf", f"{tmp}/hf3d", imported] + MODEL,
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
            tune = ["--load", imported, "--finetune", "--train-iters", "3", "--eval-iters", "0"]
            run(1, tune + ["--log-json", f"{tmp}/tune1.jsonl"])
            run(4, layout(2, 2) + tune + ["--log-json", f"{tmp}/tune4.jsonl"])
            compare(records(f"{tmp}/tune1.jsonl"), records(f"{tmp}/tune4.jsonl"), "import-hf fine-tune")

        with Timer("errors: padded vocabulary, missing shard folder"):
            # Megatron keeps the checkpoint's padded vocabulary (flags that alone give 128 or 256
            # resume with the saved 64, which the new TP divides).
            out = run(1, ["--load", ckpt, "--make-vocab-size-divisible-by", "128"]).stdout
            assert "keeping the checkpoint's padded vocabulary 64 (the flags alone give 128)" in out, out[-2000:]
            out = run(2, layout(2, 1) + ["--load", ckpt, "--make-vocab-size-divisible-by", "128"]).stdout
            assert "keeping the checkpoint's padded vocabulary 64 (the flags alone give 256)" in out, out[-2000:]
            broken = f"{tmp}/broken"
            shutil.copytree(ckpt, broken)
            shutil.rmtree(f"{broken}/iter_0000010/mp_rank_01_001")
            t0 = time.monotonic()
            err = run(4, layout(2, 2) + ["--load", broken], expect_rc=None, timeout=120).stderr
            assert f"{broken}/iter_0000010/mp_rank_01_001/model.safetensors is missing" in err, err[-3000:]
            assert "mp_rank_01_001 is missing or incomplete" in err, err[-3000:]
            assert time.monotonic() - t0 < 60
            err = run(1, ["--load", broken], expect_rc=1).stderr  # one process reads every shard
            assert "mp_rank_01_001/model.safetensors is missing" in err, err[-2000:]


if __name__ == "__main__":
    main()
