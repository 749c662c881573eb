#!/usr/bin/env bash
# Training-step time of tessera builds and of the PyTorch peer, run alternately in one go so
# all see the same machine (on a shared machine only ratios from one run compare): each
# round runs every variant once, and the end prints each variant's median ms per step and
# its speed-up over the first variant (the first's ms / its ms: the median of the rounds'
# ratios, and their range), with the load averages seen before the runs.
# A variant is a train_step_bench binary with its flags after '+', comma-separated
# (build/bench/train_step_bench, build/bench/train_step_bench+--deterministic-mode), or
# `torch` / `torch+--sdpa`: bench/torch_train_step.py under the tools venv's PyTorch
# ($TORCH_PYTHON, default /opt/tessera/tools-venv/bin/python). Threads: OMP_NUM_THREADS
# (default 2) for both.
#
#   bench/step_peer_ab.sh SHAPE STEPS ROUNDS VARIANT VARIANT...
#   e.g. bench/step_peer_ab.sh gpt2-124m-t1024 3 3 build/bench/train_step_bench torch+--sdpa
set -euo pipefail
(( $# >= 4 )) || { sed -n '2,13p' "$0" >&2; exit 2; }
shape=$1 steps=$2 rounds=$3
shift 3
variants=("$@")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
torch_python=${TORCH_PYTHON:-/opt/tessera/tools-venv/bin/python}
here=$(cd "$(dirname "$0")" && pwd)
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# Prints one variant's ms per step.
run_variant() {
  local variant=$1 program extra=()
  program=${variant%%+*}
  [[ "$variant" == *+* ]] && IFS=, read -r -a extra <<< "${variant#*+}"
  if [[ "$program" == torch ]]; then
    "$torch_python" "$here/torch_train_step.py" "$shape" "$steps" "${extra[@]}"
  else
    "$program" "$shape" "$steps" "${extra[@]}" 2>/dev/null
  fi | sed -n 's/.*: \([0-9.]*\) ms\/step.*/\1/p'
}

for ((r = 1; r <= rounds; ++r)); do
  for v in "${variants[@]}"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    ms=$(run_variant "$v")
    echo "round $r  load $load  $v: $ms ms/step"
    echo "$v $ms $load" >> "$results"
  done
done

/usr/bin/python3 - "$results" "${variants[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
variants = sys.argv[2:]
ms = {v: [float(r[1]) for r in rows if r[0] == v] for v in variants}
loads = [float(r[2]) for r in rows]
print(f"\nload average {min(loads):.1f}-{max(loads):.1f}; per variant the median of the rounds:")
print("| variant | ms/step | speed-up over the first | its range |")
print("| --- | ---: | ---: | ---: |")
for v in variants:
    ratios = [a / b for a, b in zip(ms[variants[0]], ms[v])]
    print(f"| `{v}` | {statistics.median(ms[v]):.1f} | {statistics.median(ratios):.2f}x | "
          f"{min(ratios):.2f}-{max(ratios):.2f}x |")
PY
