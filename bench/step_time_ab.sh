#!/usr/bin/env bash
# Step time of two tessera binaries, run alternately in one go so both see the same
# machine: GPT-2 124M (12 layers, 768 wide, 12 heads, GPT-2's vocabulary), micro-batch 4,
# seq 64, fp32, mock data. Each run logs every iteration; the first (warm-up) is dropped.
# Two figures per run: wall ms per step (the log's elapsed time per iteration) and CPU ms
# per step (the process's user + system time between log lines, from /proc): on a shared
# machine the wall time follows the load, the CPU time much less so. At the end, the median
# of each binary and the ratios after / before.
#
#   bench/step_time_ab.sh BEFORE_BINARY AFTER_BINARY [ROUNDS=3] [ITERS=6]
set -euo pipefail
before=$1 after=$2 rounds=${3:-3} iters=${4:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(train --mock-data --tokenizer-type NullTokenizer --vocab-size 50257 --num-layers 12 --hidden-size 768
       --num-attention-heads 12 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
       --global-batch-size 4 --train-iters "$iters" --log-interval 1 --eval-iters 0 --lr 1e-4)

# "WALL_MS CPU_MS": means over iterations 2..ITERS of one run.
step_ms() {
  (cd "$work" && /usr/bin/python3 - "$@" "${flags[@]}" <<'PY'
import os, re, subprocess, sys
ticks = os.sysconf("SC_CLK_TCK")
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
def cpu_s():
    f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / ticks  # utime, stime
walls, cpus, last = [], [], None
for line in p.stdout:
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
print(f"{sum(walls) / len(walls):.1f} {sum(cpus) / len(cpus):.1f}")
PY
  )
}

declare -a wall_b wall_a cpu_b cpu_a
for ((r = 1; r <= rounds; ++r)); do
  read -r wb cb < <(step_ms "$before")
  read -r wa ca < <(step_ms "$after")
  wall_b+=("$wb"); cpu_b+=("$cb"); wall_a+=("$wa"); cpu_a+=("$ca")
  echo "round $r: before $wb ms wall, $cb ms CPU; after $wa ms wall, $ca ms CPU"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
mwb=$(median "${wall_b[@]}") mwa=$(median "${wall_a[@]}") mcb=$(median "${cpu_b[@]}") mca=$(median "${cpu_a[@]}")
echo "median wall: before $mwb ms/step, after $mwa ms/step, after/before $(ratio "$mwa" "$mwb")"
echo "median CPU:  before $mcb ms/step, after $mca ms/step, after/before $(ratio "$mca" "$mcb")"
