#!/usr/bin/env bash
# Fails when the repository cites a document its users never get: a folder outside the
# repository, a fact sheet or map that only the team had, or its section numbers (the
# pattern below lists them). Code, tests and docs
# cite Megatron-LM's own source paths (megatron/core/..., megatron/training/..., tools/...)
# or docs/ of this repository. Run by CTest as suite.citations.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='\.\./shared|shared/reference|megatron\.md|ARCHITECTURE\.md|two-server-guide\.md|§ ?[0-9]'
hits=$(grep -rnIE "$pattern" src tests docs scripts examples bench fuzz cmake CMakeLists.txt README.md \
         | grep -v '^scripts/check-citations\.sh:\|^tests/data/' || true)
if [[ -n "$hits" ]]; then
  echo "$hits"
  echo "error: $(wc -l <<<"$hits") reference(s) to documents outside the repository" >&2
  echo "hint: cite the Megatron-LM source file the fact comes from (e.g. megatron/core/datasets/gpt_dataset.py)," \
       "or write the fact into docs/ in your own words and cite that" >&2
  exit 1
fi
echo "ok: no references to documents outside the repository"
