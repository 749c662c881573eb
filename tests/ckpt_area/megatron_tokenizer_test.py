"""A Megatron-format checkpoint (--ckpt-format torch) of a run with a HuggingFaceTokenizer
converts and exports: `ckpt convert --to tessera` and `ckpt export-hf` take the tokenizer from
the Namespace's tokenizer_model; when the file records none (as a checkpoint written elsewhere
may), both refuse naming --tokenizer-model, and take it. Run with the tools venv's python
(torch, tokenizers).
usage: megatron_tokenizer_test.py TESSERA_BINARY"""
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference"))
from hf_tokenizer_fixture import train_hf_tokenizer  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2",
         "--lr", "1e-3", "--train-iters", "1", "--eval-iters", "0"]


def tessera(args, expect_rc=0):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([TESSERA] + args, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == expect_rc, (args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


def train_tokenizer(folder):
    train_hf_tokenizer(folder, ["the quick brown fox jumps over the lazy dog %d" % i for i in range(100)])


def without_tokenizer_model(src, dst):
    """src's checkpoint with tokenizer_model None in its Namespace."""
    tracker = open(os.path.join(src, "latest_checkpointed_iteration.txt")).read().strip()
    rel = os.path.join("iter_%07d" % int(tracker), "mp_rank_00")
    os.makedirs(os.path.join(dst, rel))
    sd = torch.load(os.path.join(src, rel, "model_optim_rng.pt"), weights_only=False)
    sd["args"].tokenizer_model = None
    torch.save(sd, os.path.join(dst, rel, "model_optim_rng.pt"))
    with open(os.path.join(dst, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(tracker)


def same_file(a, b):
    return open(a, "rb").read() == open(b, "rb").read()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tok, mg, bare = (os.path.join(tmp, n) for n in ("tokenizer", "mg", "bare"))
        train_tokenizer(tok)
        tessera(["train"] + MODEL + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok, "--save", mg,
                                     "--save-interval", "1", "--ckpt-format", "torch"])
        assert torch.load(os.path.join(mg, "iter_0000001", "mp_rank_00", "model_optim_rng.pt"),
                          weights_only=False)["args"].tokenizer_model == tok
        tessera(["ckpt", "convert", mg, os.path.join(tmp, "converted"), "--to", "tessera"])
        tessera(["ckpt", "export-hf", mg, os.path.join(tmp, "hf")])
        assert same_file(os.path.join(tmp, "hf", "tokenizer.json"), os.path.join(tok, "tokenizer.json"))
        print("ok  the Namespace's tokenizer_model serves convert and export-hf", flush=True)

        without_tokenizer_model(mg, bare)
        for action in (["convert", bare, os.path.join(tmp, "c2"), "--to", "tessera"],
                       ["export-hf", bare, os.path.join(tmp, "hf2")]):
            p = tessera(["ckpt"] + action, expect_rc=2)
            assert "--tokenizer-model" in p.stderr, p.stderr
            tessera(["ckpt"] + action + ["--tokenizer-model", tok])
        assert same_file(os.path.join(tmp, "hf2", "tokenizer.json"), os.path.join(tok, "tokenizer.json"))
        print("ok  without it in the file, both name --tokenizer-model and take it", flush=True)


if __name__ == "__main__":
    main()
