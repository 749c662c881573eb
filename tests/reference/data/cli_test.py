#!/usr/bin/env python3
"""`tessera preprocess` and `tessera data` as a user meets them: Megatron's printed lines, bad
input (each error names the file, the line and, for JSON, the column; exit 1), bad flags (exit
2), --skip-bad-records, and atomic outputs (no final file after an error, SIGINT or SIGTERM,
and no temporary file left behind)."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import harness
from harness import GPT2, expect, read, run_module, same_dataset, tessera

NULL = ["--tokenizer-type", "NullTokenizer", "--vocab-size", 100]
FLOAT = r"\d+(\.\d+)?(e[+-]\d+)?"


def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)


def run_bad(input_path, *extra, tokenizer=NULL):
    return tessera("preprocess", "--input", input_path, "--output-prefix", "out", *tokenizer, "--workers", 2,
                   *extra, check=False)


def no_outputs():
    left = sorted(glob.glob("out*"))
    expect(not left, f"files left after a failure: {left}")


def expect_error(p, code, *needles):
    expect(p.returncode == code, f"exit {p.returncode}, expected {code}\n{p.stdout}\n{p.stderr}")
    for n in needles:
        expect(n in p.stderr, f"'{n}' not in stderr:\n{p.stderr}")


def test_megatron_lines():
    write("in.jsonl", "".join(json.dumps({"text": f"{i} {i}"}) + "\n" for i in range(5)))
    p = tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "out", *NULL, "--workers", 1,
                "--log-interval", 2)
    out = p.stdout.splitlines()
    expect(out[0] == "Opening in.jsonl", p.stdout)
    expect(re.fullmatch(r"Time to startup: " + FLOAT, out[1]), p.stdout)
    progress = [l for l in p.stderr.splitlines() if l.startswith("Processed")]
    expect(len(progress) == 2, p.stderr)
    for n, line in zip((2, 4), progress):
        expect(re.fullmatch(rf"Processed {n} documents \({FLOAT} docs/s, {FLOAT} MB/s\)\.", line), line)
    expect(os.path.exists("out_text_document.bin") and os.path.exists("out_text_document.idx"), "no output")


def test_malformed_json_names_file_line_column():
    write("in.jsonl", '{"text": "1 2"}\n{"text": "3"}\n{"text": "4", oops}\n')
    expect_error(run_bad("in.jsonl"), 1, "in.jsonl:3:15: malformed JSON", "--skip-bad-records")
    no_outputs()


def test_record_errors():
    cases = [
        ('{"text": "1"}\n\n', "in.jsonl:2: empty line"),
        ('{"txt": "1"}\n', 'in.jsonl:1: record has no key "text" (its keys: "txt")'),
        ('{"text": 5}\n', 'in.jsonl:1: the value of "text" is a number, not a string'),
        ('{"text": ["1", null]}\n', 'the value of "text" is a list that contains null'),
        ('[{"text": "1"}, 5]\n', "in.jsonl:1:17: expected a JSON object, found a number"),
        ('{"text": "1 x"}\n', 'in.jsonl:1: cannot tokenize "text": NullTokenizer: "x" is not an integer'),
        ('{"text": "1 500"}\n', "outside [0, 101)"),
        ('{"text": "a\\ud800b"}\n', "in.jsonl:1:18: malformed JSON"),  # a lone surrogate
    ]
    for text, needle in cases:
        write("in.jsonl", text)
        expect_error(run_bad("in.jsonl"), 1, needle)
        no_outputs()


def test_invalid_utf8_names_column():
    write("in.jsonl", b'{"text": "1"}\n{"text": "\xc3\xa9\xff"}\n', "wb")
    expect_error(run_bad("in.jsonl"), 1, "in.jsonl:2:12: invalid UTF-8")
    no_outputs()


def test_broken_json_array():
    write("in.json", '[\n  {"text": "1"},\n  {"text": "2"}\n  {"text": "3"}\n]\n')
    expect_error(run_bad("in.json"), 1, "in.json:4:3: expected ',' or ']'")
    write("in.json", '[\n  {"text": "1"},\n  {"text": "2\n')
    expect_error(run_bad("in.json"), 1, "in.json:3:3: the file ends inside this element")
    write("in.json", '[{"text": "1"},\n {"text": [1}\n]')
    expect_error(run_bad("in.json"), 1, "in.json:2:")
    no_outputs()


def test_skip_bad_records_counts_and_keeps_the_rest():
    good = [json.dumps({"text": f"{i} 7"}) for i in range(6)]
    lines = [good[0], "{bad", good[1], good[2], '{"text": 3}', good[3], "", good[4], good[5]]
    write("in.jsonl", "\n".join(lines) + "\n")
    p = run_bad("in.jsonl", "--skip-bad-records", "--append-eod")
    expect(p.returncode == 0, p.stderr)
    expect("skipped 3 bad record(s) of 9" in p.stderr, p.stderr)
    expect("in.jsonl:2:2: malformed JSON" in p.stderr, p.stderr)
    write("good.jsonl", "\n".join(good) + "\n")
    tessera("preprocess", "--input", "good.jsonl", "--output-prefix", "ref", *NULL, "--append-eod")
    same_dataset("out_text_document", "ref_text_document")


def test_unreadable_inputs_and_unwritable_outputs():
    expect_error(run_bad("missing.jsonl"), 1, "missing.jsonl", "No such file")
    os.mkdir("adir")
    expect_error(run_bad("adir"), 1, "adir", "Is a directory")
    expect_error(run_bad("nomatch*.jsonl"), 1, "no file matches --input nomatch*.jsonl")
    write("in.jsonl", '{"text": "1"}\n')
    p = tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "no/such/dir/out", *NULL, check=False)
    expect_error(p, 1, "no/such/dir", "does not exist")
    p = tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "in.jsonl/out", *NULL, check=False)
    expect_error(p, 1, "in.jsonl/out")


def test_bad_tokenizer_files():
    write("in.jsonl", '{"text": "hello"}\n')
    p = run_bad("in.jsonl", tokenizer=["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "nope.json",
                                       "--merge-file", harness.MERGES])
    expect_error(p, 1, "nope.json")
    write("v.json", '{"a": 1,\n "b": }')
    p = run_bad("in.jsonl", tokenizer=["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json",
                                       "--merge-file", harness.MERGES])
    expect_error(p, 1, "v.json:2:7: malformed JSON")
    write("m.txt", "#version: 0.2\nĠ t\nĠ a b\n")
    p = run_bad("in.jsonl", tokenizer=["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", harness.VOCAB,
                                       "--merge-file", "m.txt"])
    expect_error(p, 1, "m.txt:3: expected two tokens")
    no_outputs()


def test_flags():
    write("in.jsonl", '{"text": "1"}\n')
    expect_error(run_bad("in.jsonl", "--split-sentences"), 2, "--split-sentences is not supported yet")
    p = run_bad("in.jsonl", "--keep-newlines")
    expect(p.returncode == 0, p.stderr)
    expect_error(run_bad("in.jsonl", "--bogus"), 2, "unknown flag --bogus")
    expect_error(run_bad("in.jsonl", "--workers", "x"), 2, "--workers expects an integer")
    expect_error(tessera("preprocess", "--input", "in.jsonl", check=False), 2, "--output-prefix", "--tokenizer-type")
    expect_error(run_bad("in.jsonl", tokenizer=["--tokenizer-type", "TikTokenizer"]), 2, "not supported yet")
    expect_error(run_bad("in.jsonl", "--text-template", "{a:>3}"), 2, "not a plain field name")
    # argparse-style abbreviations and --flag=value.
    p = tessera("preprocess", "--inp=in.jsonl", "--output-prefix=abbrev", "--tokenizer-t", "NullTokenizer",
                "--vocab-s", 100)
    expect(os.path.exists("abbrev_text_document.idx"), p.stdout)
    expect(tessera("preprocess", "--help").stdout.startswith("usage: tessera preprocess"), "help")


def peak_rss_kb(jsonl):
    """Peak resident set of a two-worker preprocess of `jsonl`, in KB."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    p = subprocess.run([sys.executable, "-c", probe, harness.TESSERA, "preprocess", "--input", jsonl,
                        "--output-prefix", jsonl + ".out", *map(str, NULL), "--workers", "2"],
                       capture_output=True, text=True, timeout=300)
    rc, rss_kb = map(int, p.stdout.split())
    expect(rc == 0, p.stderr)
    return rss_kb


def test_memory_stays_bounded():
    # ~54 MB of input against a 1,000-line one: what the big input adds to the peak (chunks in
    # flight, buffers, tables) must stay far below its size. The difference leaves out the
    # binary and its libraries, whose resident size does not depend on the input.
    line = json.dumps({"text": " ".join(str(i % 100) for i in range(150))}) + "\n"
    with open("small.jsonl", "w") as f:
        f.write(line * 1000)
    with open("big.jsonl", "w") as f:
        for _ in range(120):
            f.write(line * 1000)
    size = os.path.getsize("big.jsonl")
    baseline_kb, big_kb = peak_rss_kb("small.jsonl"), peak_rss_kb("big.jsonl")
    growth = (big_kb - baseline_kb) * 1024
    expect(growth < size / 4, f"peak RSS grew by {growth >> 10} KB ({baseline_kb} -> {big_kb} KB) "
                              f"for a {size >> 20} MB input")


def wait_for(pred, seconds=20):
    t = time.time()
    while time.time() - t < seconds:
        if pred():
            return True
        time.sleep(0.02)
    return False


def interrupt(sig):
    """Stops a preprocess that is waiting on a FIFO input with `sig`; nothing may be left."""
    os.mkfifo("fifo.jsonl")
    proc = subprocess.Popen([harness.TESSERA, "preprocess", "--input", "fifo.jsonl", "--output-prefix", "out",
                             *map(str, NULL), "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        fifo = open("fifo.jsonl", "w")  # returns once tessera opened the FIFO: outputs exist as temporaries
        for i in range(2000):
            fifo.write(json.dumps({"text": f"{i % 100} 1 2"}) + "\n")
        fifo.flush()
        expect(wait_for(lambda: glob.glob("out*.tmp.*")), "no temporary outputs while running")
        proc.send_signal(sig)
        proc.wait(timeout=20)
        try:
            fifo.close()
        except BrokenPipeError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
    expect(proc.returncode == -sig, f"exit {proc.returncode}, expected death by signal {sig}")
    left = sorted(f for f in os.listdir(".") if f != "fifo.jsonl")
    expect(not left, f"files left after signal {sig}: {left}")


def test_sigint_leaves_nothing():
    interrupt(signal.SIGINT)


def test_sigterm_leaves_nothing():
    interrupt(signal.SIGTERM)


def test_data_merge_and_inspect_errors():
    write("in.jsonl", '{"text": "1 2"}\n')
    tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "a", *NULL)
    p = tessera("data", "inspect", "a_text_document")
    expect("dtype uint16, 1 sequences, 1 documents, 2 tokens" in p.stdout, p.stdout)
    data = read("a_text_document.idx")
    write("b_text_document.idx", data[:-3], "wb")
    write("b_text_document.bin", read("a_text_document.bin"), "wb")
    expect_error(tessera("data", "inspect", "b_text_document", check=False), 1, "b_text_document.idx", "truncated")
    p = tessera("data", "merge", "--input", "a_text_document", "b_text_document", "--output-prefix", "m", check=False)
    expect_error(p, 1, "b_text_document.idx")
    expect(not glob.glob("m.*"), "merge left files after an error")
    expect_error(tessera("data", "merge", "--input", "a_text_document", check=False), 2, "--output-prefix")


if __name__ == "__main__":
    run_module(globals())
