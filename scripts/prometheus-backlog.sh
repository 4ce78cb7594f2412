#!/usr/bin/env bash
# A real Prometheus resending its backlog to `vigil serve`, by hand (it needs Debian's
# `prometheus` package; it is not part of scripts/test.sh):
#   scripts/prometheus-backlog.sh [DOWN_SECONDS] [VIGIL_SERVE_FLAGS...]
# Prometheus scrapes itself and Vigil every second and remote-writes to Vigil over four shards.
# After 90 s Vigil is stopped (it checkpoints on the way down) for DOWN_SECONDS (default 120),
# while Prometheus keeps the samples in its write-ahead log and retries; then Vigil is started
# again on the same folder. Two minutes later the script prints Vigil's counters since the
# restart (samples taken, and late samples by rule: none printed means none late) and
# Prometheus' own remote-write counters. VIGIL sets the binary (default target/release/vigil).
set -euo pipefail
cd "$(dirname "$0")/.."
down="${1:-120}"
shift || true
vigil="$(realpath "${VIGIL:-target/release/vigil}")"
rules="$(realpath rules/metrics)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
vport="$(free_port)"
pport="$(free_port)"
work="$(mktemp -d /tmp/vigil-prometheus-backlog.XXXXXX)"
cat > "$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ['127.0.0.1:$pport']}]
  - job_name: vigil
    static_configs: [{targets: ['127.0.0.1:$vport']}]
remote_write:
  - url: http://127.0.0.1:$vport/api/v1/write
    queue_config: {min_shards: 4, max_shards: 4, max_samples_per_send: 200, batch_send_deadline: 1s}
YML
start_vigil() {
  (cd "$work" && exec "$vigil" serve --rules "$rules" --database-url "sqlite://$work/vigil.db" \
    --http-addr "127.0.0.1:$vport" "$@" >> "$work/vigil.log" 2>&1) &
  vigil_pid=$!
}
counters() {
  curl -s "127.0.0.1:$vport/metrics" | grep -E '^(vigil_samples_in_total|vigil_events_late_total)' || true
}
start_vigil "$@"
sleep 2
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom" \
  --web.listen-address="127.0.0.1:$pport" --storage.remote.flush-deadline=5s > "$work/prometheus.log" 2>&1 &
prom_pid=$!
# Prometheus first, while Vigil still takes what it flushes on the way down.
trap 'kill $prom_pid 2>/dev/null; wait $prom_pid 2>/dev/null; kill $vigil_pid 2>/dev/null || true' EXIT
sleep 90
echo "before the stop:"
counters
kill "$vigil_pid"
wait "$vigil_pid" || true
sleep "$down"
start_vigil "$@"
sleep 120
echo "since the restart:"
counters
curl -s "127.0.0.1:$pport/metrics" \
  | grep -E '^prometheus_remote_storage_(samples_total|samples_failed_total|samples_retried_total|samples_pending)'
echo "logs in $work"
