#!/usr/bin/env python3
"""Kafka to engine with instances sharing a consumer group (`--kafka-join-group`), and the cost
of the repartition stage.

    python3 benches/group.py VIGIL_BINARY EVENTS.jsonl [--rules rules/metrics] [--events 200000]
        [--brokers 127.0.0.1:9092] [--postgres postgres://postgres@127.0.0.1:5432/postgres]
        [--instances 1,2] [--workers 1] [--runs 2]

The first EVENTS lines are produced once (`vigil produce`, no keys) into a fresh 12-partition
topic. Then, for each configuration, fresh instances read the whole topic into a fresh
PostgreSQL database, and the time is taken from their start until they have taken every event:

- `single`: one `vigil serve` without a group (it assigns itself every partition and runs the
  rules on one worker): no repartition stage;
- `group xN`: N instances with `--kafka-join-group`, one worker each (`--workers 1,2`: each
  count of worker threads in turn, which run a member's keyed partitions): every event crosses the
  broker a second time, through the keyed topic, once per keyed partition of its keys. Done
  when every event is forwarded (`vigil_events_in_total`) and every forwarded record taken
  (`vigil_group_taken_total` equals `vigil_group_forwarded_total`, summed over the instances).

The difference between `single` and `group x1` is the repartition stage's cost. Needs a running
Apache Kafka broker (`scripts/kafka.sh start`) and PostgreSQL. With `--broker-pid-file` (the
`pid` file of a node that scripts/kafka.sh started), the broker's own CPU time over each run is
read from /proc and printed beside it. Prints one table row per run.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workers import free_port  # noqa: E402


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def psql(admin, sql):
    subprocess.run(["psql", admin, "-q", "-c", sql], check=True, stdout=subprocess.DEVNULL)


def stop(procs):
    """Stops the instances: SIGTERM, then SIGKILL for any still running after 15 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def cpu_seconds(pid):
    """User and system CPU time of a process so far, from /proc (None without a pid)."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(args, config, instances, workers, topic, total):
    name = f"vigil_group_bench_{uuid.uuid4().hex[:8]}"
    psql(args.postgres, f"CREATE DATABASE {name}")
    db = args.postgres.rsplit("/", 1)[0] + "/" + name
    group = f"bench-{uuid.uuid4().hex[:8]}"
    work = tempfile.mkdtemp(prefix="vigil-group-bench-")
    # A copy: a group member writes its group's rules into its folder.
    rules = shutil.copytree(args.rules, f"{work}/rules")
    procs, ports = [], []
    started = time.monotonic()
    broker_cpu = cpu_seconds(args.broker_pid)
    try:
        for i in range(instances):
            port = free_port()
            cmd = [args.vigil, "serve", "--rules", rules, "--database-url", db,
                   "--http-addr", f"127.0.0.1:{port}", "--kafka-brokers", args.brokers,
                   "--kafka-group", group, "--topic", f"metric={topic}", "--workers", str(workers),
                   "--spool-dir", f"{work}/spool{i}", "--ingest-log-dir", f"{work}/ingest{i}",
                   "--max-event-future", "0s"]
            if config == "group":
                cmd.append("--kafka-join-group")
                for option in args.kafka_option:
                    cmd += ["--kafka-option", option]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{work}/log{i}", "w")))
            ports.append(port)
        while True:
            time.sleep(0.2)
            for p in procs:
                if p.poll() is not None:
                    raise SystemExit(f"vigil serve stopped: exit {p.returncode}; logs in {work}")
            try:
                taken = sum(metric(p, "vigil_events_in_total") for p in ports)
                if config == "group":
                    forwarded = sum(metric(p, "vigil_group_forwarded_total") for p in ports)
                    arrived = sum(metric(p, "vigil_group_taken_total") + metric(p, "vigil_group_duplicates_total")
                                  for p in ports)
                    done = taken >= total and arrived >= forwarded
                else:
                    done = taken >= total
            except OSError:
                continue
            if done:
                secs = time.monotonic() - started
                broker = cpu_seconds(args.broker_pid)
                broker = None if broker is None else broker - broker_cpu
                shutil.rmtree(work, ignore_errors=True)
                return secs, broker
            if time.monotonic() - started > args.timeout:
                raise SystemExit(f"no end after {args.timeout} s; logs in {work}")
    finally:
        stop(procs)
        psql(args.postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vigil")
    ap.add_argument("events")
    ap.add_argument("--rules", default="rules/metrics")
    ap.add_argument("--events", dest="count", type=int, default=200_000)
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--instances", default="1,2")
    ap.add_argument("--workers", default="1", help="worker threads of each group member, comma-separated")
    ap.add_argument("--no-single", action="store_true", help="skip the run without a group")
    ap.add_argument("--kafka-option", action="append", default=[], help="for the group members, KEY=VALUE")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600, help="seconds a run may take")
    ap.add_argument("--broker-pid-file", help="the broker's pid file, to measure its CPU time")
    args = ap.parse_args()
    args.broker_pid = None
    if args.broker_pid_file:
        with open(args.broker_pid_file) as f:
            args.broker_pid = int(f.read().strip())
    sample = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    with open(args.events) as f:
        for i, line in enumerate(f):
            if i >= args.count:
                break
            sample.write(line)
    sample.close()
    topic = f"bench-metrics-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    subprocess.run([args.vigil, "produce", "--brokers", args.brokers, "--topic", topic, "--create-topics",
                    "--partitions", "12", sample.name], check=True)
    print(f"produced {args.count} events into {topic} (12 partitions) in {time.monotonic() - t0:.1f} s", flush=True)
    os.unlink(sample.name)
    configs = [("group", int(n), int(w)) for n in args.instances.split(",") for w in args.workers.split(",")]
    if not args.no_single:
        configs.insert(0, ("single", 1, 1))
    print("| configuration | run | seconds | events/s | broker CPU seconds |")
    print("|---|---|---|---|---|")
    for config, n, workers in configs:
        for r in range(args.runs):
            secs, broker = run(args, config, n, workers, topic, args.count)
            label = "single (no group)" if config == "single" else f"group x{n}, {workers} worker(s)"
            broker = "-" if broker is None else f"{broker:.1f}"
            print(f"| {label} | {r + 1} | {secs:.2f} | {args.count / secs:,.0f} | {broker} |", flush=True)


if __name__ == "__main__":
    main()
