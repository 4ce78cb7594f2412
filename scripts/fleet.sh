#!/usr/bin/env bash
# The fleet benchmark of BENCHMARKS.md ("A real fleet"), by hand: simulated node_exporter hosts
# (real series of Debian's node_exporter) scraped by Debian's Prometheus every 10 s and
# remote-written to the release build of `vigil serve`; prints samples/s, CPU per sample and RSS
# per series for each fleet size. HOSTS (default 50,500) and MINUTES (default 10) set the runs;
# needs prometheus and prometheus-node-exporter (apt-get), which it installs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
for pkg in prometheus prometheus-node-exporter; do
  if ! command -v "$pkg" >/dev/null 2>&1; then
    sudo_=""; [ "$(id -u)" -ne 0 ] && sudo_="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -q "$pkg"
  fi
done
cargo build --release --locked --quiet
exec python3 benches/fleet.py target/release/vigil --hosts "${HOSTS:-50,500}" --minutes "${MINUTES:-10}" "$@"
