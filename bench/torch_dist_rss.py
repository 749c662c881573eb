#!/usr/bin/env python3
"""Peak resident memory of reading a large torch_dist checkpoint (docs/checkpoints.md).

Writes a GPT checkpoint in Megatron's torch_dist layout as megatron-core 0.10.0's writer lays it
out (one chunk per layer, torch.save payloads in a .distcp file, the Metadata classes of
torch.distributed.checkpoint pickled as .metadata, a common.pt with Megatron's Namespace), one
chunk in memory at a time, then runs `tessera ckpt inspect` (every chunk read, parsed and
checked: the reader alone, no model) under /usr/bin/time and prints its peak RSS against the
largest tensor.
Run in the tdist venv (torch 2.5.1, megatron-core 0.10.0):

    python bench/torch_dist_rss.py TESSERA_BINARY SCRATCH_DIR [--layers 2 --hidden 4096 --vocab 32000]
"""
import argparse
import io
import os
import pickle
import shutil
import subprocess
import sys

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import megatron_core_models as mcm  # noqa: E402


def tensors(layers, hidden, vocab):
    """(key, global size, chunk offsets, chunk sizes) of a TP=1 PP=1 GPT, layers stacked."""
    ffn = 4 * hidden
    out = [("embedding.word_embeddings.weight", (vocab, hidden), None),
           ("embedding.position_embeddings.weight", (64, hidden), None)]
    per_layer = [("self_attention.linear_qkv.layer_norm_weight", (hidden,)),
                 ("self_attention.linear_qkv.layer_norm_bias", (hidden,)),
                 ("self_attention.linear_qkv.weight", (3 * hidden, hidden)),
                 ("self_attention.linear_qkv.bias", (3 * hidden,)),
                 ("self_attention.linear_proj.weight", (hidden, hidden)), ("self_attention.linear_proj.bias", (hidden,)),
                 ("mlp.linear_fc1.layer_norm_weight", (hidden,)), ("mlp.linear_fc1.layer_norm_bias", (hidden,)),
                 ("mlp.linear_fc1.weight", (ffn, hidden)), ("mlp.linear_fc1.bias", (ffn,)),
                 ("mlp.linear_fc2.weight", (hidden, ffn)), ("mlp.linear_fc2.bias", (hidden,))]
    for name, shape in per_layer:
        out.append(("decoder.layers." + name, (layers,) + shape, "stacked"))
    out += [("decoder.final_layernorm.weight", (hidden,), None), ("decoder.final_layernorm.bias", (hidden,), None)]
    return out


def write(folder, layers, hidden, vocab):
    os.makedirs(folder, exist_ok=True)
    state, storage, planner = {}, {}, {}
    props = TensorProperties(dtype=torch.float32)
    largest = 0
    with open(os.path.join(folder, "__0_0.distcp"), "wb") as f:
        for key, size, kind in tensors(layers, hidden, vocab):
            chunks = []
            for layer in range(size[0] if kind else 1):
                offsets = (layer,) + (0,) * (len(size) - 1) if kind else (0,) * len(size)
                sizes = (1,) + size[1:] if kind else size
                t = torch.randn(sizes) * 0.02
                largest = max(largest, t.numel() * 4)
                start = f.tell()
                torch.save(t, f)
                storage[MetadataIndex(key, torch.Size(offsets), len(chunks))] = _StorageInfo(
                    "__0_0.distcp", start, f.tell() - start)
                chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
                del t
            state[key] = TensorStorageMetadata(props, torch.Size(size), chunks)
            planner[key] = (key,)
        total = f.tell()
    meta = Metadata(state_dict_metadata=state, planner_data=planner, storage_data=storage)
    meta.mcore_data = {k: {} for k in state}
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    run = dict(mcm.GPT, num_layers=layers, hidden_size=hidden, num_attention_heads=32, seq_length=64,
               max_position_embeddings=64, vocab_size=vocab - 64, padded_vocab_size=vocab, ckpt_format="torch_dist")
    args = mcm.saved_namespace(run)
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": 7,
                "num_floating_point_operations_so_far": 0.0}, os.path.join(folder, "common.pt"))
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        f.write('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", '
                '"common_backend_version": 1}')
    with open(os.path.join(os.path.dirname(folder), "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("7")
    return total, largest


def peak_rss_mb(cmd):
    p = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return int(p.stderr.strip().splitlines()[-1]) / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tessera")
    p.add_argument("scratch")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    a = p.parse_args()
    ckpt = os.path.join(a.scratch, "big")
    shutil.rmtree(a.scratch, ignore_errors=True)
    total, largest = write(os.path.join(ckpt, "iter_0000007"), a.layers, a.hidden, a.vocab)
    print("checkpoint: %.0f MB of chunks, largest tensor %.0f MB" % (total / 2**20, largest / 2**20))
    rss = peak_rss_mb([a.tessera, "ckpt", "inspect", ckpt, "--summary"])
    print("tessera ckpt inspect (every chunk read and checked): peak RSS %.0f MB = %.2f x the largest tensor"
          % (rss, rss * 2**20 / largest))
    shutil.rmtree(a.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
