#!/usr/bin/env bash
# The whole test suite, as CI runs it: `scripts/test.sh`.
#
# Needs: a Rust toolchain, python3, and PostgreSQL at 127.0.0.1:5432 with trust auth (started with
# pg_ctlcluster if it is installed but down). Installs the Tansu Kafka broker with cargo when it
# is missing (about 13 minutes, once), starts it on a free port for the run, and stops it after.
# Installs Debian's Chromium (apt-get) and playwright-core (npm ci) for the browser tests when
# they are missing; needs Node.js 18 or later.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is needed: install Rust (rustup or your package manager)" >&2
  exit 1
fi

# PostgreSQL: the local server the end-to-end tests create their databases in.
export VIGIL_TEST_POSTGRES="${VIGIL_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
  fi
fi
for _ in $(seq 1 30); do
  pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && break
  sleep 1
done
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "PostgreSQL is needed at 127.0.0.1:5432 (trust auth); set VIGIL_TEST_POSTGRES to use another" >&2
  exit 1
fi

# A PostgreSQL cluster of the fault suite's own, which it stops and starts (the shared server
# above is never stopped). Made once with Debian's pg_createcluster.
skip_pg_fault=()
fault_cluster=vigil_fault
pg_version="$(ls /etc/postgresql 2>/dev/null | head -n 1 || true)"
if [ -n "$pg_version" ] && command -v pg_createcluster >/dev/null 2>&1; then
  if ! pg_lsclusters -h | awk '{print $2}' | grep -qx "$fault_cluster"; then
    echo "creating the PostgreSQL cluster ${fault_cluster} for the fault suite"
    pg_createcluster "$pg_version" "$fault_cluster" -p "${VIGIL_TEST_PG_CLUSTER_PORT:-54329}" -- --auth=trust >/dev/null
  fi
  fault_port="$(pg_lsclusters -h | awk -v c="$fault_cluster" '$2 == c {print $3}')"
  pg_ctlcluster --skip-systemctl-redirect "$pg_version" "$fault_cluster" start 2>/dev/null || true
  for _ in $(seq 1 30); do
    pg_isready -h 127.0.0.1 -p "$fault_port" -q 2>/dev/null && break
    sleep 1
  done
  export VIGIL_TEST_PG_CLUSTER="$pg_version $fault_cluster"
  export VIGIL_TEST_PG_CLUSTER_URL="postgres://postgres@127.0.0.1:${fault_port}/postgres"
else
  echo "WARNING: no pg_createcluster here: the PostgreSQL stop-and-start fault test is skipped" >&2
  skip_pg_fault=(--skip a_postgres_outage)
fi

# Browser tests of the web console: Debian's Chromium, driven by playwright-core from npm.
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Chromium for the browser tests (apt-get)"
  sudo_=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo_="sudo"
  $sudo_ apt-get update -q && $sudo_ apt-get install -y -q chromium chromium-driver
fi
if ! command -v node >/dev/null 2>&1; then
  echo "Node.js 18 or later is needed for the browser tests (npm, and node --test)" >&2
  exit 1
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "installing playwright-core for the browser tests (npm ci)"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
fi

# Kafka: Tansu, an Apache Kafka-compatible broker, from crates.io.
if ! command -v tansu >/dev/null 2>&1; then
  echo "installing the Tansu Kafka broker (cargo install, once)"
  cargo install tansu --locked --features dynostore,libsql,postgres
fi
kafka_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 19092)
mkdir -p target
tansu broker \
  --listener-url "tcp://127.0.0.1:${kafka_port}" \
  --advertised-listener-url "tcp://127.0.0.1:${kafka_port}" \
  --storage-engine memory://tansu/ > target/tansu.log 2>&1 &
tansu_pid=$!
trap 'kill "$tansu_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 30); do
  (exec 3<>"/dev/tcp/127.0.0.1/${kafka_port}") 2>/dev/null && break
  sleep 1
done
if ! (exec 3<>"/dev/tcp/127.0.0.1/${kafka_port}") 2>/dev/null; then
  echo "the Tansu broker did not start; its log:" >&2
  cat target/tansu.log >&2
  exit 1
fi
export VIGIL_TEST_KAFKA="127.0.0.1:${kafka_port}"
echo "Kafka (Tansu) at ${VIGIL_TEST_KAFKA}, PostgreSQL at 127.0.0.1:5432"

# Habits: formatted as rustfmt.toml says, and no clippy warning.
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo build --locked --all-targets
# The tests that need Kafka and PostgreSQL (the service tests, the fault-injection suite) are
# marked ignored for a bare `cargo test`; here they all run. The rule compiler is fuzzed for a
# minute, from a fixed seed so that a run can be repeated (a bare `cargo test` fuzzes from a
# fresh seed each time, for a few seconds, and finds new ground). `fault-tally` lines in the
# output are the numbers of RELIABILITY.md.
export VIGIL_FUZZ_SECONDS="${VIGIL_FUZZ_SECONDS:-60}"
export VIGIL_FUZZ_SEED="${VIGIL_FUZZ_SEED:-20261130}"
rm -f target/tmp/fault-tally.md
cargo test --locked --lib --bins --tests -- --include-ignored "${skip_pg_fault[@]}"
echo "fault injection (fault | injected | expected | stored | lost | duplicated | delivered | undelivered | repeated calls):"
cat target/tmp/fault-tally.md 2>/dev/null || true
# The benchmarks, once each in test mode: they build and run, they are not timed. The Flink
# comparison's scripts need Flink, and the group probe confluent-kafka, which the tests do
# not install: they are only parsed.
cargo test --locked --benches
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' benches/flink/*.py benches/kafka/*.py benches/workers.py
# The web console in a real browser, against the binary built above; screenshots are written
# to target/browser-artifacts.
VIGIL_BIN="$PWD/target/debug/vigil" node --test tests/browser/console.test.mjs
# The binary users run: the shipped rules check clean and pass their behaviour tests.
cargo run --locked --quiet -- check rules
cargo run --locked --quiet -- test rules
