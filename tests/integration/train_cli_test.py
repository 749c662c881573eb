#!/usr/bin/python3
"""`tessera train` end to end through its command line: Megatron's argument dump and log
line (megatron/training/arguments.py's _print_args, megatron/training/training.py's
training_log), --log-json, --init-from-hf from the PyTorch reference's
Hugging Face folder, and the exit codes and messages of bad flags.
usage: train_cli_test.py TESSERA_BINARY SOURCE_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile

TESSERA, SOURCE = sys.argv[1], sys.argv[2]
TINY = ["--ckpt-format", "tessera",
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--mock-data", "--lr", "1e-3",
        "--train-iters", "6", "--log-interval", "2"]

# One training log line, field by field (training_log in megatron/training/training.py), then
# tessera's tokens/s.
LOG_LINE = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(\d+)/ +(\d+) \|"
    r" consumed samples: +(\d+) \| elapsed time per iteration \(ms\): \d+\.\d \|"
    r" learning rate: (\d\.\d{6}E[+-]\d\d) \| global batch size: +(\d+) \|"
    r" lm loss: (\d\.\d{6}E[+-]\d\d) \| loss scale: 1\.0 \| grad norm: \d+\.\d{3} \|"
    r" number of skipped iterations: +0 \| number of nan iterations: +0 \| tokens per second: \d+\.\d \|$")


# Megatron's report_memory line (megatron/training/utils.py), values as Python prints floats,
# then tessera's peak resident memory.
MEMORY_LINE = re.compile(
    r"^\[Rank 0\] \(after 6 iterations\) memory \(MB\) \| allocated: (\d+\.\d+) \| max allocated: (\d+\.\d+) \|"
    r" reserved: (\d+\.\d+) \| max reserved: (\d+\.\d+) \| peak resident: \d+\.\d+$")


def saved_lines(iteration, folder, ckpt_format):
    """Megatron's lines around a save (save_checkpoint in megatron/training/checkpointing.py)."""
    return ["saving checkpoint at iteration %7d to %s in %s format" % (iteration, folder, ckpt_format),
            "  successfully saved checkpoint from iteration %7d to %s [ t 1/1, p 1/1 ]" % (iteration, folder)]


def run(args, expect_rc=0):
    p = subprocess.run([TESSERA, "train"] + args, capture_output=True, text=True, timeout=120)
    assert p.returncode == expect_rc, "rc %d (want %d)\nstdout:\n%s\nstderr:\n%s" % (
        p.returncode, expect_rc, p.stdout[-3000:], p.stderr[-3000:])
    return p


def test_log_format_and_json(tmp):
    log_json, ckpt = os.path.join(tmp, "log.jsonl"), os.path.join(tmp, "ckpt")
    out = run(TINY + ["--log-json", log_json, "--save", ckpt, "--save-interval", "6"]).stdout
    lines = out.splitlines()
    start = lines.index("------------------------ arguments ------------------------")
    end = lines.index("-------------------- end of arguments ---------------------")
    args = lines[start + 1:end]
    assert all(re.match(r"^  \S+ \.+ \S", a) and len(a.split(" ")[2]) + len(a.split(" ")[3]) == 48
               for a in args), args[:3]
    names = [a.split(" ")[2] for a in args]
    assert names == sorted(names, key=str.lower)
    assert "  num_layers " + "." * (48 - 10) + " 2" in args
    logged = [LOG_LINE.match(l) for l in lines if "iteration " in l and "consumed samples" in l]
    assert len(logged) == 3 and all(logged), [l for l in lines if "iteration" in l]
    assert [int(m.group(1)) for m in logged] == [2, 4, 6]
    assert [int(m.group(3)) for m in logged] == [8, 16, 24]
    assert " > padded vocab (size: 61) with 67 dummy tokens (new size: 128)" in lines
    # Megatron's mock ids (up to 4094) cannot index 128 rows: the run says it folds them.
    assert any(l.startswith(" > --mock-data: its ids 1..4094 do not fit the padded vocabulary (128), so they are "
                            "taken modulo 61") for l in lines), out[-3000:]
    records = [json.loads(l) for l in open(log_json)]
    assert [r["iteration"] for r in records] == [2, 4, 6]
    for r, m in zip(records, logged):
        assert "%.6E" % r["lm_loss"] == m.group(6) and "%.6E" % r["learning_rate"] == m.group(4)
        assert r["tokens_per_second"] > 0
    memory = [MEMORY_LINE.match(l) for l in lines if "memory (MB)" in l]
    assert len(memory) == 1 and memory[0], [l for l in lines if "memory (MB)" in l]
    allocated, peak, reserved, peak_reserved = (float(x) for x in memory[0].groups())
    assert 0 < allocated <= peak and (reserved, peak_reserved) == (allocated, peak), memory[0].group(0)
    saving, saved = saved_lines(6, ckpt, "tessera")
    assert lines.index(saving) < lines.index(next(l for l in lines if l.startswith(saved))), out[-3000:]
    out = run(TINY + ["--train-iters", "2", "--save", ckpt + "_torch", "--save-interval", "2", "--ckpt-format",
                      "torch"]).stdout
    saving, saved = saved_lines(2, ckpt + "_torch", "torch")
    assert saving in out.splitlines() and "\n" + saved + " (" in out, out[-3000:]


def test_init_from_hf(tmp):
    ref = os.path.join(tmp, "ref")
    subprocess.run(["/usr/bin/python3", os.path.join(SOURCE, "tests/reference/gpt_reference.py"), "--out", ref],
                   check=True, capture_output=True, timeout=120)
    config = json.load(open(os.path.join(ref, "train_config.json")))
    args = config["megatron_args"] + ["--mock-data", "--log-interval", "1", "--train-iters", "1"]
    out = run(args).stdout
    assert "initialised from Hugging Face GPT-2 weights" in out
    # A wrong shape is an error naming the tensor.
    bad = [a if a != "64" else "128" for a in args]  # --hidden-size 64 -> 128
    err = run(bad, expect_rc=2).stderr
    assert "error:" in err and ("wte" in err or "hidden" in err or "n_embd" in err), err


def test_skip_spikes(tmp):
    # An absurdly low threshold: once llm.c's 128-value window is full, every update whose
    # loss or grad norm is above the window's mean counts as a spike. Skipped updates leave the
    # LR schedule where it was, still count as consumed samples, and are counted in the log.
    log_json = os.path.join(tmp, "spikes.jsonl")
    flags = [a if a != "6" else "160" for a in TINY] + ["--skip-spikes", "0.001", "--log-interval", "8",
                                                         "--eval-iters", "0", "--log-json", log_json]
    out = run(flags).stdout
    records = [json.loads(l) for l in open(log_json)]
    assert all(r["skipped_iterations"] == 0 for r in records[:16]), records[:16]  # window not yet full
    assert sum(r["skipped_iterations"] for r in records[16:]) > 0, records[16:]
    skipped = 0
    for r in records:
        skipped += r["skipped_iterations"]
        assert r["consumed_samples"] == r["iteration"] * 4
        # Linear decay over 160 iterations, advanced once per update actually made.
        assert abs(r["learning_rate"] - 1e-3 * (1 - (r["iteration"] - skipped) / 160)) < 1e-12, (r, skipped)
    counts = [int(m.group(1)) for m in re.finditer(r"number of skipped iterations: +(\d+) \|", out)]
    assert counts == [r["skipped_iterations"] for r in records], counts


def test_bad_flags():
    err = run(TINY + ["--num-layer", "3"], expect_rc=2).stderr
    assert "error: unknown flag --num-layer" in err and "hint: did you mean --num-layers?" in err, err
    err = run(TINY + ["--qk-layernorm"], expect_rc=2).stderr
    assert "--qk-layernorm is a Megatron-LM flag that tessera does not support yet" in err, err
    err = run(TINY + ["--num-attention-heads", "5"], expect_rc=2).stderr
    assert "--num-attention-heads" in err, err
    err = run(TINY + ["--global-batch-size", "5"], expect_rc=2).stderr
    assert "--global-batch-size 5 is not a multiple" in err, err
    out = run(TINY + ["--dry-run"]).stdout
    assert "Theoretical memory footprints: weight and optimizer=" in out and "training ..." not in out, out[-1500:]
    out = run(["--help"]).stdout
    assert "--num-layers VALUE" in out and "--lr-decay-style {constant|linear|cosine" in out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        test_log_format_and_json(tmp)
        test_init_from_hf(tmp)
        test_skip_spikes(tmp)
        test_bad_flags()
    print("train_cli_test: all passed")
