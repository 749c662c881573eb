#!/usr/bin/env bash
# Regenerates docs/megatron-flags.md from the option table of a built tessera
# (`tessera flags --markdown`), so the status of every Megatron-LM flag cannot drift.
#   scripts/gen-megatron-flags-doc.sh [TESSERA_BINARY]          rewrite the file
#   scripts/gen-megatron-flags-doc.sh --check [TESSERA_BINARY]  exit 1 when it differs (ctest flags.doc)
# TESSERA_BINARY defaults to build/src/tessera/cli/tessera.
set -euo pipefail
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
tessera=$(realpath "${1:-build/src/tessera/cli/tessera}")
cd "$(dirname "$0")/.."
doc=docs/megatron-flags.md
new=$(mktemp)
trap 'rm -f "$new"' EXIT
"$tessera" flags --markdown > "$new"
if [ $check = 1 ]; then
  if ! diff -u "$doc" "$new"; then
    echo "error: $doc differs from what $tessera prints (diff above: - the file, + the option table)" >&2
    echo "hint: regenerate it with: scripts/gen-megatron-flags-doc.sh $tessera" >&2
    exit 1
  fi
  echo "$doc matches the option table of $tessera"
else
  cp "$new" "$doc"
  echo "wrote $doc"
fi
