#!/usr/bin/python3
"""README.md and docs/ against the binary's option tables, so that the next rename or removal
of a flag fails here instead of misleading a reader:
- every `--flag` named anywhere in README.md and docs/*.md is in the help of some tessera
  subcommand, or is a Megatron-LM flag (`tessera flags`), or is another program's flag listed
  in FOREIGN below (docs/megatron-flags.md is flags.doc's: it is generated from the table);
- every flag of a `tessera SUBCOMMAND ...` command line in a code block or code span is that
  subcommand's;
- docs/flags.md names every flag of `tessera train --help`;
- `tessera --help` names every action of `tessera ckpt --help` and `tessera data --help`, and
  --init-from-hf's help every Hugging Face family that `ckpt import-hf` reads.
Underscores and hyphens are the same letter here, as `tessera launch` takes both.
usage: docs_flags_test.py TESSERA_BINARY SOURCE_DIR"""
import glob
import os
import re
import subprocess
import sys

TESSERA, SOURCE = os.path.abspath(sys.argv[1]), sys.argv[2]
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][A-Za-z0-9_-]*")

# Flags of other programs that the docs name, and whose they are. An entry no doc names any
# more is an error, so the list cannot rot.
FOREIGN = {
    "--stress": "scripts/test.sh",
    "--no-peers": "scripts/gpu-check.sh",
    "--scale": "bench/preprocess_bench.py, bench/tokenizer_bench.py",
    "--repeat": "bench/preprocess_bench.py, bench/tokenizer_bench.py",
    "--corpora": "bench/preprocess_bench.py",
    "--megatron": "bench/preprocess_bench.py",
    "--sdpa": "bench/torch_train_step.py",
    "--op-profile": "bench/train_step_bench.cpp",
    "--fused-only": "bench/attention_bench.cpp",
    "--tessera": "bench/tokenizer_bench.py",
    "--rng": "tests/reference/data/gpt_dataset_reference.py",
    "--manifest": "tests/reference/data/gpt_dataset_reference.py",
    "--fmad": "nvcc",
    "--tool": "compute-sanitizer",
    "--test-dir": "ctest",
    "--ntasks-per-node": "srun",
    "--out": "an argparse-style abbreviation of preprocess's --output-prefix",
    "--multimodal": "later Megatron-LM's preprocess_data.py, named as not supported",
    "--multiple-validation-sets": "later Megatron-LM, named as not supported",
    "--full-validation": "later Megatron-LM, named as not supported",
}
# Where a subcommand's flags come from: its help (ckpt import-hf and doctor take train's too).
HELP = {
    "train": [["train", "--help"]],
    "preprocess": [["preprocess", "--help"]],
    "data": [["data", "--help"], ["preprocess", "--help"]],
    "launch": [["launch", "--help"]],
    "doctor": [["doctor", "--help"], ["train", "--help"]],
    "ckpt": [["ckpt", "--help"], ["train", "--help"]],
    "bench": [["bench", "comm", "--help"]],
    "flags": [["flags", "--help"]],
}


def run(*args):
    p = subprocess.run([TESSERA, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (args, p.returncode, p.stderr[-2000:])
    return p.stdout


def norm(flag):
    return flag.replace("_", "-")


def flags_in(text):
    return {norm(f) for f in FLAG.findall(text)}


def docs():
    paths = [os.path.join(SOURCE, "README.md")] + sorted(glob.glob(os.path.join(SOURCE, "docs", "*.md")))
    return {os.path.relpath(p, SOURCE): open(p, encoding="utf-8").read() for p in paths
            if not p.endswith("megatron-flags.md")}


def commands(text):
    """(subcommand, flags) of every `tessera SUB ...` command line in the code blocks (with
    continuation lines joined) and inline code spans; under `tessera launch`, the program's
    flags are the program's."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    for block in blocks + spans:
        for line in block.replace("\\\n", " ").splitlines():
            words = line.split("#")[0].split()
            for i, w in enumerate(words):
                if not (w == "tessera" or w.endswith("/tessera")) or i + 1 >= len(words) or words[i + 1] not in HELP:
                    continue
                sub, rest = words[i + 1], words[i + 2:]
                if sub == "launch":
                    program = next((j for j, r in enumerate(rest) if r in HELP or r.endswith("tessera")), len(rest))
                    rest = rest[:program]
                yield sub, [norm(f) for f in FLAG.findall(" ".join(rest))]
                break


def main():
    per_command = {sub: {"--help"}.union(*(flags_in(run(*args)) for args in helps)) for sub, helps in HELP.items()}
    known = set().union(*per_command.values()) | flags_in(run("flags"))
    texts = docs()
    unknown, used_foreign = [], set()
    for path, text in texts.items():
        for flag in sorted(flags_in(text)):
            if flag in known:
                continue
            if flag.endswith("-") and any(k.startswith(flag) for k in known):  # a family: `--tiktoken-*`
                continue
            if flag in FOREIGN:
                used_foreign.add(flag)
                continue
            unknown.append("%s: %s" % (path, flag))
    assert not unknown, ("flags named in the docs that no tessera subcommand, Megatron-LM or FOREIGN has (rename "
                         "them to today's flags, or add another program's flag to FOREIGN):\n  " + "\n  ".join(unknown))
    stale = sorted(set(FOREIGN) - used_foreign)
    assert not stale, "FOREIGN lists flags no doc names any more: %s" % stale
    print("ok  every flag named in README.md and docs/ exists (%d documents)" % len(texts))

    wrong = []
    for path, text in texts.items():
        for sub, flags in commands(text):
            wrong += ["%s: tessera %s %s" % (path, sub, f) for f in flags if f not in per_command[sub]]
    assert not wrong, "command lines in the docs with flags their subcommand does not take:\n  " + "\n  ".join(wrong)
    print("ok  every `tessera SUBCOMMAND` command line in code uses that subcommand's flags")

    train_flags = {norm(m) for m in re.findall(r"^  (--[A-Za-z0-9_-]+)", run("train", "--help"), re.M)}
    missing = sorted(train_flags - flags_in(texts["docs/flags.md"]))
    assert not missing, "docs/flags.md does not name these flags of `tessera train --help`: %s" % missing
    print("ok  docs/flags.md names all %d flags of `tessera train --help`" % len(train_flags))

    summary = run("--help")
    for sub in ("ckpt", "data"):
        line = next(l for l in summary.splitlines() if l.strip().startswith(sub + " "))
        actions = re.findall(r"^  ([a-z][a-z-]+) ", run(sub, "--help"), re.M)
        assert actions and all(a in line for a in actions), ("`tessera --help` for %s: %r, actions %s" %
                                                             (sub, line, actions))
    families = re.search(r"write HF_DIR's (.*?) as a tessera checkpoint", " ".join(run("ckpt", "--help").split()))
    assert families, "`tessera ckpt --help` no longer says which Hugging Face families import-hf reads"
    init = " ".join(l for l in run("train", "--help").splitlines() if "--init-from-hf" in l)
    for family in re.split(r", | or ", families.group(1)):
        assert family in init, "--init-from-hf's help does not name %s: %r" % (family, init)
    print("ok  `tessera --help` lists every ckpt and data action; --init-from-hf names every family import-hf reads")


if __name__ == "__main__":
    main()
