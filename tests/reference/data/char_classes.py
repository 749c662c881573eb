#!/usr/bin/env python3
"""Writes the GPT-2 pre-tokenizer's character classes as Python's `regex` module sees them.

One line per run of code points: "FIRST LAST CLASS" (hex), CLASS one of S (\\s, i.e. Unicode
White_Space), L (\\p{L}), N (\\p{N}), O (anything else; surrogates count as O).
tests/unit/data/data_tokenizer_test.cpp compares tessera's ICU-built table with this file.

  char_classes.py OUT            write the table
  char_classes.py --check FILE   exit 1 if this python3-regex disagrees with FILE
"""
import sys

import regex

SPACE, LETTER, NUMBER = regex.compile(r"\s"), regex.compile(r"\p{L}"), regex.compile(r"\p{N}")


def classify(c):
    if 0xD800 <= c <= 0xDFFF:
        return "O"
    ch = chr(c)
    if SPACE.match(ch):
        return "S"
    if LETTER.match(ch):
        return "L"
    if NUMBER.match(ch):
        return "N"
    return "O"


def table():
    runs, prev, start = [], None, 0
    for c in range(0x110000):
        k = classify(c)
        if k != prev:
            if prev is not None:
                runs.append(f"{start:X} {c - 1:X} {prev}\n")
            prev, start = k, c
    runs.append(f"{start:X} {0x10FFFF:X} {prev}\n")
    return "".join(runs)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        with open(sys.argv[2]) as f:
            want = f.read()
        if table() != want:
            print(f"python3-regex {regex.__version__} classifies code points differently from {sys.argv[2]}")
            return 1
        print(f"python3-regex {regex.__version__} agrees with {sys.argv[2]}")
        return 0
    with open(sys.argv[1], "w") as f:
        f.write(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
