#!/usr/bin/env bash
# Prometheus' remote-write receiver compliance suite against `vigil serve`, by hand (it needs
# Go and the Go module proxy; it is not part of scripts/test.sh):
#   scripts/rw-compliance.sh [VIGIL_BINARY]
# Fetches github.com/prometheus/compliance/remotewrite/receiver at the version below, builds its
# tests, starts Vigil on SQLite in a temporary folder, runs the suite against
# /api/v1/write and prints a line per test (PASS or FAIL). Full output: $work/run.log.
set -euo pipefail
cd "$(dirname "$0")/.."
version="v0.0.0-20260806071727-67b8327a2e93"
vigil="${1:-target/debug/vigil}"
work="$(mktemp -d /tmp/vigil-rw-compliance.XXXXXX)"
dir="$(go mod download -json "github.com/prometheus/compliance/remotewrite/receiver@${version}" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
cp -r "$dir" "$work/suite"
chmod -R u+w "$work/suite"
(cd "$work/suite" && go test -c -o "$work/suite.test" .)
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$work/rules"
"$vigil" serve --rules "$work/rules" --database-url "sqlite://$work/vigil.db" --http-addr "127.0.0.1:$port" \
  --spool-dir "$work/spool" --ingest-log-dir "$work/ingest" > "$work/vigil.log" 2>&1 &
vigil_pid=$!
trap 'kill $vigil_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  curl -fs "http://127.0.0.1:$port/healthz" > /dev/null && break
  sleep 0.2
done
printf 'remote_write:\n  - name: vigil\n    url: http://127.0.0.1:%s/api/v1/write\n' "$port" > "$work/suite/config.yml"
(cd "$work/suite" && "$work/suite.test" -test.v > "$work/run.log" 2>&1) || true
grep -E '^--- (PASS|FAIL|SKIP)' "$work/run.log"
echo "full output: $work/run.log"
