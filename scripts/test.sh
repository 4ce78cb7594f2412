#!/usr/bin/env bash
# The whole test suite, as CI runs it: `scripts/test.sh`.
#
# Needs: a Rust toolchain, python3 (with venv and pip), Java 17 or later with Maven, Node.js 18 or later, and
# Debian's apt-get (run as root, or with sudo) for what is missing. Installs and starts what the
# tests need: PostgreSQL (Debian's `postgresql`, a cluster with trust auth on 127.0.0.1:5432,
# and a second cluster for the fault test that stops its database), Apache Kafka's own broker
# (scripts/kafka.sh: fetched from Maven Central once, run in KRaft mode on free ports for the
# run and stopped after), Debian's Chromium and playwright-core (npm ci) for the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is needed: install Rust (rustup or your package manager)" >&2
  exit 1
fi
sudo_=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo_="sudo"
apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    $sudo_ apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -q "$@"
}

# A clean test build's target directory takes about 2.3 GB, and the tests' brokers, databases
# and logs more; a linker that runs out of disk dies of a bus error that names nothing, so the
# shortfall is said here, before the build.
need_gb=4
free_gb="$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')"
if [ "${free_gb:-0}" -lt "$need_gb" ]; then
  echo "only ${free_gb} GB free on $(df -P . | awk 'NR == 2 {print $6}'); the test build needs about ${need_gb} GB" >&2
  exit 1
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# PostgreSQL: the local server the end-to-end tests create their databases in. Debian's package
# makes a cluster on 5432 when it installs; the tests connect over TCP without a password, so
# that cluster gets trust auth for loopback (lines of our own at the top of its pg_hba.conf).
export VIGIL_TEST_POSTGRES="${VIGIL_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/postgres}"
# The server's own binary decides, not its configuration: a purged or half-removed package can
# leave /etc/postgresql and pg_createcluster behind without a server to run.
pg_server_version() {
  ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sed 's#/usr/lib/postgresql/\([^/]*\)/.*#\1#' | sort -n | tail -n 1
}
if ! command -v pg_createcluster >/dev/null 2>&1 || [ -z "$(pg_server_version)" ]; then
  echo "installing PostgreSQL (apt-get)"
  apt_install postgresql
fi
pg_version="$(pg_server_version)"
if ! pg_lsclusters -h | awk '{print $3}' | grep -qx 5432; then
  echo "creating the PostgreSQL cluster main on 127.0.0.1:5432"
  $sudo_ pg_createcluster "$pg_version" main -p 5432 -- --auth=trust >/dev/null
fi
main_cluster="$(pg_lsclusters -h | awk '$3 == 5432 {print $1" "$2; exit}')"
hba="/etc/postgresql/${main_cluster// //}/pg_hba.conf"
if ! grep -q '^# vigil tests' "$hba"; then
  echo "PostgreSQL ${main_cluster}: trust auth for loopback TCP (${hba})"
  { printf '# vigil tests: loopback without a password\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n'; cat "$hba"; } > "$hba.new"
  $sudo_ cp "$hba.new" "$hba"
  rm -f "$hba.new"
  pg_ctlcluster --skip-systemctl-redirect $main_cluster reload 2>/dev/null || true
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "starting PostgreSQL ${main_cluster}"
  $sudo_ pg_ctlcluster --skip-systemctl-redirect $main_cluster start || true
fi
for _ in $(seq 1 30); do
  pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && break
  sleep 1
done
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "PostgreSQL did not start at 127.0.0.1:5432; set VIGIL_TEST_POSTGRES to use another" >&2
  exit 1
fi

# A PostgreSQL cluster of the fault suite's own, which it stops and starts (the shared server
# above is never stopped). Made once with Debian's pg_createcluster.
skip_pg_fault=()
fault_cluster=vigil_fault
if command -v pg_createcluster >/dev/null 2>&1; then
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

# The TLS tests make their certificates with the openssl command.
if ! command -v openssl >/dev/null 2>&1; then
  echo "installing OpenSSL's command for the TLS tests (apt-get)"
  apt_install openssl
fi

# Alertmanager, the real one, for tests/alertmanager.rs: Debian's package (its service is not
# started; each test runs its own on a free port).
# debian_binary VAR COMMAND PACKAGE: exports VAR as the path of COMMAND, installing Debian's
# PACKAGE when it is missing; a VAR already set names another binary and is kept.
debian_binary() {
  local var=$1 cmd=$2 pkg=$3
  if [ -n "${!var:-}" ]; then
    return
  fi
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "installing ${cmd} (apt-get ${pkg})"
    apt_install "$pkg"
  fi
  export "$var=$(command -v "$cmd")"
}
debian_binary VIGIL_TEST_ALERTMANAGER prometheus-alertmanager prometheus-alertmanager

# promtool, for the alerting rules on Vigil's own metrics (monitoring/, tests/monitoring.rs) and
# the node-mixin's beside rules/node (tests/node_mixin.rs): Debian's prometheus package (its
# service is not started).
debian_binary VIGIL_TEST_PROMTOOL promtool prometheus

# A real fleet for tests/fleet.rs: Debian's node_exporter, scraped as several hosts by Debian's
# Prometheus, remote-writing to Vigil. Neither service is started.
debian_binary VIGIL_TEST_NODE_EXPORTER prometheus-node-exporter prometheus-node-exporter
debian_binary VIGIL_TEST_PROMETHEUS prometheus prometheus

# Browser tests of the web console: Debian's Chromium, driven by playwright-core from npm.
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Chromium for the browser tests (apt-get)"
  apt_install chromium chromium-driver
fi
if ! command -v node >/dev/null 2>&1; then
  echo "Node.js 18 or later is needed for the browser tests (npm, and node --test)" >&2
  exit 1
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "installing playwright-core for the browser tests (npm ci)"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
fi

# Clients written by others for the collector receivers' tests (tests/collectors.rs): Python
# packages from PyPI, pinned in tests/clients/requirements.txt, in a virtual environment.
py_clients="$PWD/target/py-clients"
if ! cmp -s tests/clients/requirements.txt "$py_clients/requirements.txt" 2>/dev/null; then
  echo "installing the collector clients' Python packages (pip, into ${py_clients})"
  rm -rf "$py_clients"
  python3 -m venv "$py_clients"
  "$py_clients/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
  cp tests/clients/requirements.txt "$py_clients/requirements.txt"
fi
export VIGIL_TEST_PYTHON="$py_clients/bin/python"

# Kafka: Apache Kafka's own broker in KRaft mode (scripts/kafka.sh), on a free port for the run.
# The group tests that kill a broker start their own three-node cluster with the same script.
kafka_port="$(free_port)"
mkdir -p target
kafka_dir="$PWD/target/kafka-test"
scripts/kafka.sh start --port "$kafka_port" --dir "$kafka_dir"
trap 'scripts/kafka.sh stop --dir "$kafka_dir" || true' EXIT
export VIGIL_TEST_KAFKA="127.0.0.1:${kafka_port}"
export VIGIL_KAFKA_SCRIPT="$PWD/scripts/kafka.sh"
echo "Kafka (Apache Kafka) at ${VIGIL_TEST_KAFKA}, PostgreSQL at 127.0.0.1:5432"

# Habits: formatted as rustfmt.toml says, and no clippy warning.
cargo fmt --all --check
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo build --locked --workspace --all-targets
# The layers: the language crate builds without the service's network and database stack.
lang_tree="$(cargo tree --locked -p vigil-lang -e normal --prefix none)"
for heavy in rdkafka sqlx axum tokio; do
  if grep -q "^${heavy} v" <<<"$lang_tree"; then
    echo "vigil-lang depends on ${heavy} (cargo tree -p vigil-lang); it must not" >&2
    exit 1
  fi
done
echo "vigil-lang links none of rdkafka, sqlx, axum, tokio"
# The tests that need Kafka and PostgreSQL (the service tests, the fault-injection suite) are
# marked ignored for a bare `cargo test`; here they all run. The rule compiler is fuzzed for a
# minute, from a fixed seed so that a run can be repeated (a bare `cargo test` fuzzes from a
# fresh seed each time, for a few seconds, and finds new ground). `fault-tally` lines in the
# output are the numbers of RELIABILITY.md.
export VIGIL_FUZZ_SECONDS="${VIGIL_FUZZ_SECONDS:-60}"
export VIGIL_FUZZ_SEED="${VIGIL_FUZZ_SEED:-20261130}"
rm -f target/tmp/fault-tally.md target/tmp/fleet-tally.md
cargo test --locked --workspace --lib --bins -- --include-ignored
# The integration tests are one binary; each of its files runs as a suite of its own, as the
# group and fault suites stop and start brokers and databases and are timed against them.
for suite in $(sed -n 's/^mod \([a-z_]*\);$/\1/p' tests/main.rs | grep -vx support); do
  echo "integration suite ${suite}"
  cargo test --locked --test suite -- --include-ignored "${skip_pg_fault[@]}" "${suite}::"
done
echo "fault injection (fault | injected | expected | stored | lost | duplicated | delivered | undelivered | repeated calls):"
cat target/tmp/fault-tally.md 2>/dev/null || true
echo "a real fleet (tests/fleet.rs; RELIABILITY.md, \"A real fleet\"):"
cat target/tmp/fleet-tally.md 2>/dev/null || true
# The benchmarks, once each in test mode: they build and run, they are not timed. The Kafka
# ones run small against the test broker with the debug build (BENCHMARKS.md has the numbers
# of the release build): the end-to-end latency, Kafka to engine with one and two group
# members (with the broker's CPU), and a failover with static membership. The Flink
# comparison's scripts need Flink, which the tests do not install: they are only parsed.
cargo test --locked --workspace --benches
e2e_db="vigil_e2e_smoke"
psql "$VIGIL_TEST_POSTGRES" -q -c "DROP DATABASE IF EXISTS ${e2e_db} WITH (FORCE)" -c "CREATE DATABASE ${e2e_db}"
VIGIL_BIN=target/debug/vigil cargo run --locked --quiet --example e2e_latency -- \
  "$VIGIL_TEST_KAFKA" "${VIGIL_TEST_POSTGRES%/*}/${e2e_db}" 2000 3
psql "$VIGIL_TEST_POSTGRES" -q -c "DROP DATABASE IF EXISTS ${e2e_db} WITH (FORCE)"
python3 benches/group.py target/debug/vigil samples/datacenter.jsonl --rules rules --events 5993 --runs 1 \
  --instances 1,2 --brokers "$VIGIL_TEST_KAFKA" --postgres "$VIGIL_TEST_POSTGRES" --broker-pid-file "$kafka_dir/node1/pid"
python3 benches/failover.py target/debug/vigil --brokers "$VIGIL_TEST_KAFKA" --postgres "$VIGIL_TEST_POSTGRES" \
  --modes static-restart --session-timeouts 6000 --runs 1
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' benches/flink/*.py benches/workers.py benches/restore.py benches/azure_events.py benches/fleet.py \
  benches/upgrade.py
# The web console in a real browser, against the binary built above; screenshots are written
# to target/browser-artifacts.
VIGIL_BIN="$PWD/target/debug/vigil" node --test tests/browser/console.test.mjs
# The binary users run: the shipped rules check clean and pass their behaviour tests.
cargo run --locked --quiet -- check rules
cargo run --locked --quiet -- test rules
# The same cases through four workers splitting the keys: the engine settings reach rule tests.
cargo run --locked --quiet -- test rules --workers 4
