#!/usr/bin/env bash
# Step time of tessera variants, run alternately in one go so all see the same machine:
# GPT-2 124M (12 layers, 768 wide, 12 heads, GPT-2's vocabulary), micro-batch 4, seq 64,
# mock data. A variant is a binary, optionally with extra flags after '+', comma-separated
# (build/tessera+--bf16, build/tessera+--fp16,--loss-scale,1024). Each run logs every
# iteration; the first (warm-up) is dropped.
# Per run: wall ms per step (the log's elapsed time per iteration), CPU ms per step (the
# process's user + system time between log lines, from /proc: on a shared machine the wall
# time follows the load, the CPU time much less so) and the memory the run reports (the
# theoretical activation memory and the measured max allocated, MB). At the end, each
# variant's medians and its ratios to the first variant.
#
#   bench/step_time_ab.sh BEFORE AFTER [ROUNDS=3] [ITERS=6]
#   bench/step_time_ab.sh VARIANT VARIANT VARIANT... [ROUNDS=3] [ITERS=6]
#   SEQ=256 bench/step_time_ab.sh ...   (another sequence length)
set -euo pipefail
variants=() numbers=()
for a in "$@"; do
  if [[ "$a" =~ ^[0-9]+$ ]]; then numbers+=("$a"); else variants+=("$a"); fi
done
rounds=${numbers[0]:-3} iters=${numbers[1]:-6} seq=${SEQ:-64}
(( ${#variants[@]} >= 2 )) || { echo "usage: $0 VARIANT VARIANT... [ROUNDS] [ITERS]" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(train --mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --num-layers 12 --hidden-size 768
       --num-attention-heads 12 --seq-length "$seq" --max-position-embeddings "$seq" --micro-batch-size 4
       --global-batch-size 4 --train-iters "$iters" --log-interval 1 --eval-iters 0 --lr 1e-4)

# "WALL_MS CPU_MS ACTIVATION_MB MAX_ALLOCATED_MB": means over iterations 2..ITERS of one run.
step_ms() {
  local variant=$1 binary extra=()
  binary=$(realpath "${variant%%+*}")
  [[ "$variant" == *+* ]] && IFS=, read -r -a extra <<< "${variant#*+}"
  (cd "$work" && /usr/bin/python3 - "$binary" "${flags[@]}" "${extra[@]}" <<'PY'
import os, re, subprocess, sys
ticks = os.sysconf("SC_CLK_TCK")
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
def cpu_s():
    f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / ticks  # utime, stime
walls, cpus, last, activation, peak = [], [], None, "-", "-"
for line in p.stdout:
    if m := re.search(r"Theoretical memory footprints: .* activation=([0-9.]+) MB", line):
        activation = m.group(1)
    if m := re.search(r"max allocated: ([0-9.]+)", line):
        peak = m.group(1)
    m = re.search(r"iteration +(\d+)/.*elapsed time per iteration \(ms\): ([0-9.]+)", line)
    if not m:
        continue
    now = cpu_s()
    if int(m.group(1)) > 1:
        walls.append(float(m.group(2)))
        cpus.append((now - last) * 1000)
    last = now
p.wait()
if not walls:
    sys.exit("no iteration lines")
print(f"{sum(walls) / len(walls):.1f} {sum(cpus) / len(cpus):.1f} {activation} {peak}")
PY
  )
}

n=${#variants[@]}
declare -A wall cpu mem
for ((r = 1; r <= rounds; ++r)); do
  line="round $r:"
  for ((v = 0; v < n; ++v)); do
    read -r w c act peak < <(step_ms "${variants[v]}")
    wall[$v]+="$w " cpu[$v]+="$c " mem[$v]="activation $act MB, max allocated $peak MB"
    line+=" [${variants[v]}] $w ms wall, $c ms CPU;"
  done
  echo "$line"
done
median() { printf '%s\n' $@ | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
w0=$(median ${wall[0]}) c0=$(median ${cpu[0]})
for ((v = 0; v < n; ++v)); do
  w=$(median ${wall[$v]}) c=$(median ${cpu[$v]})
  echo "median [${variants[v]}]: $w ms/step wall ($(ratio "$w" "$w0")x the first), $c ms/step CPU" \
       "($(ratio "$c" "$c0")x); ${mem[$v]}"
done
