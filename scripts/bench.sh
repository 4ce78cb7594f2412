#!/usr/bin/env bash
# Runs the end-to-end benchmark workloads of BENCHMARKS.md, RUNS times each (5 unless set), and
# prints the median events/s of each with every run's rate. Release build; takes about two
# minutes on 2 cores. VIGIL=path/to/vigil measures another build (to compare two builds, run
# them alternately).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet
vigil=${VIGIL:-target/release/vigil}
runs=${RUNS:-5}
median() { sort -n | sed -n "$(((runs + 1) / 2))p"; }
# The host's speed swings on shared machines (runs of one build have been seen a factor two
# apart): time a fixed piece of work before and after, so that a reader can tell a machine slow
# throughout from slow code (it does not pick out single slowed runs: the host changes within
# seconds).
probe() {
  local t0 t1
  t0=$(date +%s.%N)
  head -c 300000000 /dev/zero | sha256sum >/dev/null
  t1=$(date +%s.%N)
  printf 'machine probe (%s): sha256 of 300 MB in %.2f s (lower is quieter; see BENCHMARKS.md)\n' \
    "$1" "$(awk "BEGIN { print $t1 - $t0 }")"
}
probe before
run() {
  local label=$1; shift
  local rates=()
  for _ in $(seq 1 "$runs"); do
    rates+=("$($vigil bench --json "$@" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["events_per_second"]))')")
  done
  printf '%-44s %12s events/s   (runs: %s)\n' "$label" "$(printf '%s\n' "${rates[@]}" | median)" "${rates[*]}"
}
run "(a) filter, Flink Q1"                 --workload filter
run "(b) tumbling 10 s, 1,000 keys, Q2"    --workload tumbling
run "(b) tumbling 10 s, 100,000 keys"      --workload tumbling --keys 100000 --step-us 10 --events 3000000
run "(b) sliding 1 min/10 s, 100,000 keys" --workload sliding --keys 100000 --step-us 10 --events 3000000
run "(c) sequence, ~10,000 partial matches" --workload matches
run "    sequence, Flink Q3"               --workload sequence
run "(d) outliers, 1,000 peers per window" --workload outlier --keys 10000 --step-us 100 --events 1000000
for n in 1 10 100 1000; do
  run "(e) mixed, $n rules" --workload mixed --rules-count "$n" --events 1000000
done
probe after
