#!/usr/bin/env bash
# Apache Kafka's own broker for the tests and benchmarks, in KRaft mode, without Docker.
#
#   scripts/kafka.sh fetch                                  the jars only
#   scripts/kafka.sh start [--port P] [--dir D] [--brokers N]
#   scripts/kafka.sh start --keep [--dir D] [--node I]      again, on the data kept in D
#   scripts/kafka.sh stop  [--dir D] [--node I] [--kill]
#
# `fetch` resolves org.apache.kafka:kafka_2.13 and what it depends on from Maven Central with
# Maven, once, into a cache outside the repo ($VIGIL_KAFKA_CACHE, default
# ~/.cache/vigil/kafka-<version>). `start` formats a fresh cluster in D (default
# target/kafka) and returns once every broker answers: one node on 127.0.0.1:P (default 9092),
# or with --brokers 3 three nodes on P, P+1, P+2, each broker and controller at once (the
# controllers listen on P+100, P+101, P+102). `stop` stops the brokers started in D (SIGTERM, as
# an operator would; `--kill`: SIGKILL), or only node I of them; `start --keep` starts them (or
# node I) again on the data they kept, so that a test can take a broker away and bring it back.
# Needs Java 17 or later and Maven.
set -euo pipefail

KAFKA_VERSION="${VIGIL_KAFKA_VERSION:-4.1.1}"
# slf4j-simple of the slf4j-api line the broker depends on (1.7).
SLF4J_VERSION=1.7.36
CACHE="${VIGIL_KAFKA_CACHE:-$HOME/.cache/vigil/kafka-${KAFKA_VERSION}}"
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"

usage() {
  sed -n '4,7p' "$0" | sed 's/^# *//' >&2
  exit 2
}

fetch() {
  if [ -f "$CACHE/classpath.txt" ]; then
    return
  fi
  command -v mvn >/dev/null 2>&1 || { echo "kafka.sh: Maven (mvn) is needed to fetch Kafka" >&2; exit 1; }
  command -v java >/dev/null 2>&1 || { echo "kafka.sh: Java 17 or later is needed to run Kafka" >&2; exit 1; }
  echo "kafka.sh: fetching Apache Kafka ${KAFKA_VERSION} from Maven Central into ${CACHE} (once)" >&2
  local work="$CACHE.partial"
  rm -rf "$work"
  mkdir -p "$work"
  # A project with the broker as its one dependency (and slf4j-simple, so that the broker's
  # log goes to stderr without a logging configuration); Maven copies every jar it needs.
  cat > "$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.vigil</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>${KAFKA_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>${SLF4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
EOF
  (cd "$work" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=libs) >&2
  ls "$work"/libs/*.jar | tr '\n' ':' > "$work/classpath.txt"
  # The cache moves into place whole, so an interrupted fetch is not taken for a finished one.
  rm -rf "$CACHE"
  mv "$work" "$CACHE"
  # The class path names the jars where they now are.
  ls "$CACHE"/libs/*.jar | tr '\n' ':' > "$CACHE/classpath.txt"
}

java_opts() {
  echo "-Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true -Dorg.slf4j.simpleLogger.defaultLogLevel=${VIGIL_KAFKA_LOG_LEVEL:-info} -Dorg.slf4j.simpleLogger.showDateTime=true"
}

answers() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start() {
  local port=9092 dir="$REPO_ROOT/target/kafka" brokers=1 keep=0 only=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --dir) dir="$2"; shift 2 ;;
      --brokers) brokers="$2"; shift 2 ;;
      --keep) keep=1; shift ;;
      --node) only="$2"; shift 2 ;;
      *) usage ;;
    esac
  done
  case "$brokers" in 1|3) ;; *) echo "kafka.sh: --brokers is 1 or 3" >&2; exit 2 ;; esac
  fetch
  local cp i
  cp="$(cat "$CACHE/classpath.txt")"
  if [ "$keep" -eq 1 ]; then
    [ -f "$dir/node1/server.properties" ] || { echo "kafka.sh: nothing to keep in $dir" >&2; exit 1; }
  else
    stop --dir "$dir" 2>/dev/null || true
    rm -rf "$dir"
    mkdir -p "$dir"
    format "$port" "$(cd "$dir" && pwd)" "$brokers" "$cp"
  fi
  dir="$(cd "$dir" && pwd)"
  local nodes=()
  for node in "$dir"/node*; do
    i="${node##*/node}"
    if [ -z "$only" ] || [ "$only" = "$i" ]; then
      nodes+=("$node")
    fi
  done
  [ "${#nodes[@]}" -gt 0 ] || { echo "kafka.sh: no node $only in $dir" >&2; exit 1; }
  for node in "${nodes[@]}"; do
    if [ -f "$node/pid" ] && kill -0 "$(cat "$node/pid")" 2>/dev/null; then
      echo "kafka.sh: $node runs already" >&2
      exit 1
    fi
    # The log of this start begins after what earlier starts wrote.
    touch "$node/broker.log"
    echo "$(( $(wc -l < "$node/broker.log") + 1 ))" > "$node/log-from"
    # shellcheck disable=SC2046
    nohup java $(java_opts) -cp "$cp" kafka.Kafka "$node/server.properties" \
      >> "$node/broker.log" 2>&1 < /dev/null &
    echo $! > "$node/pid"
  done
  local answered=()
  for node in "${nodes[@]}"; do
    local bport ok=0
    bport="$(sed -n 's/^advertised.listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\)$/\1/p' "$node/server.properties")"
    for _ in $(seq 1 120); do
      if tail -n +"$(cat "$node/log-from")" "$node/broker.log" | grep -q "Kafka Server started" && answers "$bport"; then
        ok=1
        break
      fi
      if ! kill -0 "$(cat "$node/pid")" 2>/dev/null; then
        break
      fi
      sleep 0.5
    done
    if [ "$ok" -ne 1 ]; then
      echo "kafka.sh: the broker of $node on 127.0.0.1:$bport did not start; the end of its log:" >&2
      tail -n 40 "$node/broker.log" >&2
      stop --dir "$dir" || true
      exit 1
    fi
    answered+=("127.0.0.1:$bport")
  done
  echo "kafka.sh: Apache Kafka ${KAFKA_VERSION} answers at $(IFS=,; echo "${answered[*]}") (data in $dir)" >&2
}

# Writes the configuration of each node of a new cluster and formats its storage.
format() {
  local port="$1" dir="$2" brokers="$3" cp="$4" voters="" cluster_id i
  for i in $(seq 1 "$brokers"); do
    voters="${voters:+$voters,}${i}@127.0.0.1:$((port + 99 + i))"
  done
  cluster_id="$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  local replication=$(( brokers < 3 ? 1 : 3 )) min_isr=$(( brokers < 3 ? 1 : 2 ))
  for i in $(seq 1 "$brokers"); do
    local node="$dir/node$i" bport=$((port + i - 1)) cport=$((port + 99 + i))
    mkdir -p "$node/data"
    cat > "$node/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$bport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$bport
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$node/data
num.partitions=1
offsets.topic.replication.factor=$replication
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=$replication
transaction.state.log.min.isr=$min_isr
default.replication.factor=$replication
min.insync.replicas=1
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
log.retention.hours=-1
log.segment.bytes=67108864
EOF
    java -cp "$cp" kafka.tools.StorageTool format -t "$cluster_id" -c "$node/server.properties" \
      > "$node/format.log" 2>&1 || { cat "$node/format.log" >&2; exit 1; }
  done
}

stop() {
  local dir="$REPO_ROOT/target/kafka" only="" sig=TERM
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir="$2"; shift 2 ;;
      --node) only="$2"; shift 2 ;;
      --kill) sig=KILL; shift ;;
      *) usage ;;
    esac
  done
  local pidfile pid pids=()
  for pidfile in "$dir"/node${only:-*}/pid; do
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    kill -"$sig" "$pid" 2>/dev/null || true
    pids+=("$pidfile")
  done
  for pidfile in "${pids[@]}"; do
    pid="$(cat "$pidfile")"
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  fetch) fetch ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  *) usage ;;
esac
