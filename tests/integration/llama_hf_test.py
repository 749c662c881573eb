#!/usr/bin/python3
"""Llama through the `tessera` binary against the float64 transformers reference
(tests/reference/llama_reference.py: LlamaForCausalLM with GQA 4/2, untied, no bias, trained
10 iterations with Megatron's optimizer on the samples of --mock-data):
  - `tessera train --init-from-hf` from its folder matches every iteration's loss within 2e-4
    and grad norm within 1e-3 (relative; float32 against float64), as one process and as
    TP=2 x PP=2 x DP=2 in 8 processes through `tessera launch`; the sharded copy of the
    folder (model.safetensors.index.json) gives the one-process run's numbers bit for bit;
  - `tessera ckpt import-hf` then `ckpt export-hf` gives back every tensor of the folder bit
    for bit, and transformers loads the export (tests/reference/llama_hf_check.py);
  - a run with a HuggingFaceTokenizer (a byte-level BPE trained here with `tokenizers`)
    exports its tokenizer files beside the model, and transformers loads both;
  - flags that contradict config.json are errors naming the field and the flag.
usage: llama_hf_test.py TESSERA_BINARY"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import safetensors_io  # noqa: E402
from llama_hf_check import load_model  # noqa: E402
from hf_tokenizer_fixture import train_hf_tokenizer  # noqa: E402
from llama_reference import import_transformers  # noqa: E402
from model_parallel_test import env_without_launch, records  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
REFERENCE = os.path.join(os.path.dirname(HERE), "reference")
# float32 against float64 over 10 iterations, relative: the bounds.
LOSS_RTOL, GRAD_NORM_RTOL = 2e-4, 1e-3


def python(script, *args, timeout=180):
    p = subprocess.run(["/usr/bin/python3", os.path.join(REFERENCE, script)] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, "%s: rc %d\n%s\n%s" % (script, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout


def tessera(args, procs=1, expect_rc=0, timeout=300):
    cmd = [TESSERA] if procs == 1 else [TESSERA, "launch", "--standalone", "--nproc_per_node", str(procs)]
    env = env_without_launch()
    if procs == 1:
        env["OMP_NUM_THREADS"] = "1"  # as the launcher gives each worker
    p = subprocess.run(cmd + args, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == expect_rc, "%s: rc %d\n%s\n%s" % (args[:3], p.returncode, p.stdout[-3000:],
                                                               p.stderr[-3000:])
    return p


def train(tmp, label, args, procs=1, extra=()):
    path = os.path.join(tmp, label.replace(" ", "_") + ".jsonl")
    p = tessera(["train"] + args + list(extra) + ["--log-interval", "1", "--eval-iters", "0", "--log-json", path],
                procs)
    assert "initialised from Hugging Face Llama weights" in p.stdout, p.stdout[-2000:]
    return records(path)


def compare_to_reference(expected, got, label, loss_rtol=LOSS_RTOL, grad_norm_rtol=GRAD_NORM_RTOL):
    lm_loss, grad_norm = safetensors_io.array(expected["lm_loss"]), safetensors_io.array(expected["grad_norm"])
    assert [r["iteration"] for r in got] == list(range(1, len(lm_loss) + 1)), (label, [r["iteration"] for r in got])
    worst = [0.0, 0.0]
    for r, loss, norm in zip(got, lm_loss, grad_norm):
        errors = (abs(r["lm_loss"] - loss) / loss, abs(r["grad_norm"] - norm) / norm)
        assert errors[0] <= loss_rtol and errors[1] <= grad_norm_rtol, (label, r["iteration"], r["lm_loss"], loss,
                                                                         r["grad_norm"], norm)
        worst = [max(w, e) for w, e in zip(worst, errors)]
    return worst


def test_training_matches_the_reference(tmp, ref, args):
    expected, _, _ = safetensors_io.read(os.path.join(ref, "expected_train.safetensors"))
    t0 = time.monotonic()
    single = train(tmp, "single", args)
    worst = compare_to_reference(expected, single, "single")
    print("ok  one process: loss within %.2g, grad norm within %.2g of the reference (%.1f s)" % (
        worst[0], worst[1], time.monotonic() - t0), flush=True)

    sharded = [a if a != os.path.join(ref, "hf") else os.path.join(ref, "hf_sharded") for a in args]
    assert sharded != args
    got = train(tmp, "sharded", sharded)
    assert [(r["lm_loss"], r["grad_norm"]) for r in got] == [(r["lm_loss"], r["grad_norm"]) for r in single]
    print("ok  the sharded folder gives the same bits", flush=True)

    t0 = time.monotonic()
    layout = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
    got = train(tmp, "tp2 pp2 dp2", args, procs=8, extra=layout)
    worst = compare_to_reference(expected, got, "tp2 pp2 dp2")
    print("ok  TP=2 x PP=2 x DP=2: loss within %.2g, grad norm within %.2g of the reference (%.1f s)" % (
        worst[0], worst[1], time.monotonic() - t0), flush=True)


def test_import_export_round_trip(tmp, ref):
    ckpt, out = os.path.join(tmp, "imported"), os.path.join(tmp, "exported")
    p = tessera(["ckpt", "import-hf", os.path.join(ref, "hf"), ckpt])
    assert "--swiglu" in p.stdout and "--num-query-groups 2" in p.stdout, p.stdout
    p = tessera(["ckpt", "export-hf", ckpt, out])
    print(python("llama_hf_check.py", "same", out, os.path.join(ref, "hf")).strip(), flush=True)
    print("ok  import-hf then export-hf gives back the folder", flush=True)


def without(args, flag, values):
    """args without `flag` and the `values` arguments that follow it."""
    i = args.index(flag)
    return args[:i] + args[i + 1 + values:]


def train_tokenizer(folder):
    """A byte-level BPE with an end-of-text token, saved as a HuggingFaceTokenizer folder."""
    import_transformers()  # puts the test venv, which has `tokenizers`, on the path
    return train_hf_tokenizer(folder, ["the quick brown fox jumps over the lazy dog %d times" % i for i in range(200)])


def test_export_with_hf_tokenizer(tmp, args):
    folder, ckpt, out = (os.path.join(tmp, n) for n in ("tokenizer", "ckpt_hf_tokenizer", "exported_hf_tokenizer"))
    vocab, eos = train_tokenizer(folder)
    flags = without(without(without(args, "--init-from-hf", 1), "--tokenizer-type", 1), "--vocab-size", 1)
    tessera(["train"] + flags + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", folder,
                                 "--train-iters", "2", "--eval-iters", "0", "--save", ckpt, "--save-interval", "2"])
    tessera(["ckpt", "export-hf", ckpt, out])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert open(os.path.join(out, name), "rb").read() == open(os.path.join(folder, name), "rb").read(), name
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["vocab_size"] == vocab and config["eos_token_id"] == eos, (config, vocab, eos)
    load_model(out)
    tokenizer = import_transformers().AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == vocab and tokenizer.eos_token_id == eos, (len(tokenizer), tokenizer.eos_token_id)
    print("ok  a HuggingFaceTokenizer run exports its tokenizer; transformers loads model and tokenizer", flush=True)


def test_flag_errors(args):
    def flag_error(flag, value, needles):
        i = args.index(flag)
        p = tessera(["train"] + args[:i + 1] + [value] + args[i + 2:] + ["--train-iters", "1"], expect_rc=2)
        assert all(n in p.stderr for n in needles), (flag, p.stderr[-2000:])

    flag_error("--num-query-groups", "4", ["num_key_value_heads is 2 but the flags give each of the 4 heads its own",
                                           "--group-query-attention --num-query-groups 2"])
    flag_error("--rotary-base", "500000", ["rope_theta is 10000 but --rotary-base is 500000"])
    flag_error("--ffn-hidden-size", "192", ["intermediate_size is 128 but --ffn-hidden-size is 192"])
    print("ok  mismatching flags name the config.json field and the flag", flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ref = os.path.join(tmp, "ref")
        print(python("llama_reference.py", "--out", ref).strip(), flush=True)
        args = json.load(open(os.path.join(ref, "train_config.json")))["megatron_args"]
        test_flag_errors(args)
        test_import_export_round_trip(tmp, ref)
        test_export_with_hf_tokenizer(tmp, args)
        test_training_matches_the_reference(tmp, ref, args)


if __name__ == "__main__":
    main()
