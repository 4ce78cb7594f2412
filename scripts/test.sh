#!/usr/bin/env bash
# The whole test suite, as CI runs it: `scripts/test.sh`.
# Installs and starts what the tests need, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is needed: install Rust from your package manager or rustup" >&2
  exit 1
fi

cargo build --locked --all-targets
cargo test --locked --all-targets
# The rules shipped in rules/ must check clean with the binary users run.
cargo run --locked --quiet -- check rules
