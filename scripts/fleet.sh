#!/usr/bin/env bash
# The fleet benchmark of BENCHMARKS.md ("A real fleet"), by hand: simulated node_exporter hosts
# (real series of Debian's node_exporter) scraped by Debian's Prometheus every 10 s and
# remote-written to the release build of `vigil serve`; prints samples/s, CPU per sample and RSS
# per series for each fleet size. HOSTS (default 50,500) and MINUTES (default 10) set the runs.
# `scripts/fleet.sh faults` instead injects the faults too long for the test command into a live
# fleet (benches/node_faults.py, about an hour, as root), then replays a day of the recorded
# host with the rate anomaly at its end (benches/node_day.py): RELIABILITY.md, "A real fleet".
# Needs prometheus, prometheus-node-exporter and stress-ng (apt-get), installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
for pkg in prometheus prometheus-node-exporter stress-ng; do
  if ! command -v "$pkg" >/dev/null 2>&1; then
    sudo_=""; [ "$(id -u)" -ne 0 ] && sudo_="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -q "$pkg"
  fi
done
cargo build --release --locked --quiet
if [ "${1:-}" = faults ]; then
  shift
  out="$(mktemp -d -t vigil-faults-XXXXXX)"
  python3 benches/node_faults.py target/release/vigil --out "$out" "$@"
  exec python3 benches/node_day.py target/release/vigil "$out"
fi
exec python3 benches/fleet.py target/release/vigil --hosts "${HOSTS:-50,500}" --minutes "${MINUTES:-10}" "$@"
