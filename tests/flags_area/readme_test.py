#!/usr/bin/python3
"""README.md as a new user reads it: the title is the first line, the set-up commands follow
the first paragraph, the example's tokenizer files exist in the repository and its `tessera
train` command line is valid (run with --dry-run), and it links the Megatron flag table and the
guide's launch script.
usage: readme_test.py TESSERA_BINARY SOURCE_DIR"""
import os
import re
import shlex
import subprocess
import sys

TESSERA, SOURCE = os.path.abspath(sys.argv[1]), sys.argv[2]
with open(os.path.join(SOURCE, "README.md"), encoding="utf-8") as f:
    text = f.read()
lines = text.splitlines()
assert lines[0] == "# tessera", "the first line is %r, not the title" % lines[0]
blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
assert "scripts/setup.sh && scripts/build.sh && scripts/demo.sh" in blocks[0], "the first code block: %r" % blocks[0]
first_paragraph_end = text.index("\n\n", text.index("\n\n") + 2)  # after the title, then the paragraph
assert text.index("```sh") == first_paragraph_end + 2, "the set-up commands do not follow the first paragraph"
for doc in ("docs/megatron-flags.md", "examples/pretrain_gpt_distributed.sh"):
    assert doc in text and os.path.exists(os.path.join(SOURCE, doc)), doc

train = next(b for b in blocks if "tessera train" in b)
argv = shlex.split(train.replace("\\\n", " "))
assert argv[0] == "build/src/tessera/cli/tessera" and argv[1] == "train", argv[:2]
for flag in ("--vocab-file", "--merge-file"):
    path = argv[argv.index(flag) + 1]
    assert os.path.isfile(os.path.join(SOURCE, path)), "%s %s is not in the repository" % (flag, path)
p = subprocess.run([TESSERA] + argv[1:] + ["--dry-run"], cwd=SOURCE, capture_output=True, text=True, timeout=60)
assert p.returncode == 0 and re.search(r"--dry-run: flags and layout are valid\b.*; not training", p.stdout), p.stdout[-2000:] + p.stderr[-2000:]
print("ok: README's title, set-up commands, links and its train example (--dry-run)")
