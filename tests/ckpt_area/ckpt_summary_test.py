#!/usr/bin/python3
"""`tessera ckpt inspect --summary` on a checkpoint saved at TP 2: the iteration, the layout, the
whole model's parameter count (a tensor split over or replicated on the TP ranks counts once,
checked against the model's shapes), sizes and one line per shard folder.
usage: ckpt_summary_test.py TESSERA_BINARY"""
import os
import subprocess
import sys
import tempfile

TESSERA = os.path.abspath(sys.argv[1])
L, H, FFN, VOCAB, SEQ = 2, 32, 128, 256, 16  # --vocab-size 100 pads to 256 at TP 2
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TESSERA_LAUNCHER")
ENV = dict({k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}, OMP_NUM_THREADS="1")

with tempfile.TemporaryDirectory() as tmp:
    ckpt = os.path.join(tmp, "ck")
    p = subprocess.run([TESSERA, "launch", "--standalone", "--nproc_per_node", "2", TESSERA, "train",
                        "--num-layers", str(L), "--hidden-size", str(H), "--num-attention-heads", "4",
                        "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2",
                        "--global-batch-size", "4", "--lr", "1e-3", "--train-iters", "2", "--mock-data",
                        "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--eval-iters", "0",
                        "--save", ckpt, "--save-interval", "2", "--tensor-model-parallel-size", "2",
                        "--ckpt-format", "tessera"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    p = subprocess.run([TESSERA, "ckpt", "inspect", "--summary", ckpt], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    layer = 2 * 2 * H + (3 * H * H + 3 * H) + (H * H + H) + (FFN * H + FFN) + (H * FFN + H)
    params = VOCAB * H + SEQ * H + L * layer + 2 * H
    for want in ("checkpoint %s/iter_0000002: iteration 2 (latest)" % ckpt,
                 "layout: tensor-parallel 2, pipeline-parallel 1, data-parallel 1; padded vocabulary 256",
                 "model: %d parameters in 28 tensors (F32); consumed samples 8" % params,
                 "in 3 folders", "checksums not verified"):
        assert want in out, (want, out)
    shard_lines = [line for line in out.splitlines() if line.lstrip().startswith("mp_rank_")]
    assert len(shard_lines) == 2 and all("2 files" in s and "28 model tensors" in s for s in shard_lines), out
    assert "files:" not in out and "tensors of" not in out, "the summary printed the full listing"
    print(out)
