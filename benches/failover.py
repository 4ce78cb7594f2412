#!/usr/bin/env python3
"""Failover time of a consumer group (`--kafka-join-group`): from a member's `kill -9` until
event time moves again in the group, with dynamic and with static membership.

    python3 benches/failover.py VIGIL_BINARY [--brokers 127.0.0.1:9092]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]
        [--modes dynamic,static-restart] [--session-timeouts 45000,10000] [--runs 2]

Each run: a fresh 12-partition topic, fed at wall-clock pace by `vigil produce --speed 1x` with
one sample a second from each of 40 hosts (event times start at the run's start), and two
instances (`--workers 1`, `--lateness 0s`). Once both run keyed partitions and event time keeps
up, instance b is killed with SIGKILL; with `static-restart` both have `--kafka-instance-id`
and b is started again at once under the same id (what a supervisor does), with `dynamic` it is
not (the group must notice it gone). Measured from the kill:

- owned: every keyed partition is owned by a live instance again (`vigil_group_owned_partitions`);
- flowing: every live instance's event time is back within 2 s of its lag before the kill
  (`vigil_watermark_lag_milliseconds`): the killed member's partitions run again, and the
  others' windows, which waited for its input partitions, close again.

Needs a running Apache Kafka (`scripts/kafka.sh start`) and PostgreSQL. Prints one table row
per run; BENCHMARKS.md keeps the numbers.
"""
import argparse
import datetime
import json
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

HOSTS = 40


def scrape(port):
    """The instance's /metrics as {name{labels}: value}, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    return {m[0]: float(m[1]) for m in re.findall(r"^(\S+) (\S+)$", text, re.M)}


def owned_keyed(metrics):
    return sum(v for k, v in metrics.items()
               if k.startswith("vigil_group_owned_partitions") and "keyed" in k)


def events(path, seconds, hosts=HOSTS, series=1, interval=1):
    """From now on, for `seconds`: `series` metrics of each of `hosts` hosts, each sampled every
    `interval` seconds (the series spread over the interval, as scrapes are)."""
    start = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    names = ["cpu_utilization"] if series == 1 else [f"metric_{j}" for j in range(series)]
    with open(path, "w") as f:
        for s in range(seconds):
            ts = (start + datetime.timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ")
            lines = []
            for h in range(hosts):
                if (h + s) % interval:
                    continue
                for j, name in enumerate(names):
                    lines.append(f'{{"stream":"metric","ts":"{ts}","host":"h{h}","name":"{name}",'
                                 f'"value":{20 + (h * 7 + j + s) % 11}}}')
            if lines:
                f.write("\n".join(lines) + "\n")


def psql(admin, sql):
    subprocess.run(["psql", admin, "-q", "-c", sql], check=True, stdout=subprocess.DEVNULL)


class Instance:
    def __init__(self, args, work, name, group, topic, db, session_timeout, static):
        self.port = free_port()
        self.cmd = [args.vigil, "serve", "--rules", f"{work}/rules-{name}", "--database-url", db,
                    "--http-addr", f"127.0.0.1:{self.port}", "--kafka-brokers", args.brokers,
                    "--kafka-group", group, "--kafka-join-group", "--topic", f"metric={topic}",
                    "--workers", "1", "--lateness", "0s", "--checkpoint-interval", args.checkpoint_interval,
                    "--kafka-option", f"session.timeout.ms={session_timeout}",
                    "--spool-dir", f"{work}/spool-{name}", "--ingest-log-dir", f"{work}/ingest-{name}"]
        if static:
            self.cmd += ["--kafka-instance-id", name]
        shutil.copytree(args.rules, f"{work}/rules-{name}", dirs_exist_ok=True)
        self.log = open(f"{work}/log-{name}", "a")
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def wait_for(what, check, timeout, poll=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = check()
        if v:
            return v
        time.sleep(poll)
    raise SystemExit(f"no {what} after {timeout} s")


def run(args, mode, session_timeout):
    name = f"vigil_failover_{uuid.uuid4().hex[:8]}"
    psql(args.postgres, f"CREATE DATABASE {name}")
    db = args.postgres.rsplit("/", 1)[0] + "/" + name
    group = f"failover-{uuid.uuid4().hex[:8]}"
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    work = tempfile.mkdtemp(prefix="vigil-failover-")
    static = mode == "static-restart"
    feed = f"{work}/events.jsonl"
    events(feed, session_timeout // 1000 + 240 + args.fill, args.hosts, args.series, args.interval)
    producer = subprocess.Popen([args.vigil, "produce", "--brokers", args.brokers, "--topic", topic,
                                 "--create-topics", "--partitions", "12", "--speed", "1x", feed],
                                stdout=subprocess.DEVNULL, stderr=open(f"{work}/log-produce", "w"))
    a = b = None
    try:
        time.sleep(2)
        a = Instance(args, work, "a", group, topic, db, session_timeout, static)
        b = Instance(args, work, "b", group, topic, db, session_timeout, static)
        both = lambda: all((m := scrape(i.port)) and owned_keyed(m) > 0 for i in (a, b))  # noqa: E731
        wait_for("two members sharing the keyed partitions", both, 120)
        # Steady state: both keep up; the lag before the kill is the baseline.
        time.sleep(10 + args.fill)
        base = {}
        for i in (a, b):
            m = scrape(i.port)
            base[i.port] = m.get("vigil_watermark_lag_milliseconds", 0)
        b.log.flush()
        mark = os.path.getsize(f"{work}/log-b")
        killed = time.monotonic()
        b.kill()
        if static:
            b.start()
        live = [a, b] if static else [a]

        def all_owned():
            ms = [scrape(i.port) for i in live]
            return all(ms) and sum(owned_keyed(m) for m in ms) >= 12

        wait_for("every keyed partition owned again", all_owned, session_timeout / 1000 + 120)
        owned = time.monotonic() - killed

        def flowing():
            ms = [scrape(i.port) for i in live]
            # 0: no watermark yet (a restarted member before its partitions' first events).
            return all(ms) and all(0 < m.get("vigil_watermark_lag_milliseconds", 0) <= base[a.port] + 2000
                                   for m in ms)

        try:
            wait_for("event time moving again", flowing, session_timeout / 1000 + 120)
        except SystemExit:
            lags = [(scrape(i.port) or {}).get("vigil_watermark_lag_milliseconds") for i in live]
            print(f"lag before the kill {base}, now {lags}; logs in {work}", file=sys.stderr)
            os.environ["VIGIL_FAILOVER_KEEP"] = "1"
            raise
        flowed = time.monotonic() - killed
        if static:
            with open(f"{work}/log-b") as f:
                f.seek(mark)
                restores = re.findall(r"keyed partition taken over.*restored_bytes=(\d+).*ms=(\d+)", f.read())
            print(f"b's restart restored {len(restores)} keyed partitions: "
                  f"{sum(int(b) for b, _ in restores) / 1e6:.1f} MB in {sum(int(m) for _, m in restores)} ms", flush=True)
        return owned, flowed, base[a.port]
    finally:
        producer.kill()
        for i in (a, b):
            if i:
                i.stop()
        psql(args.postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if not os.environ.get("VIGIL_FAILOVER_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vigil")
    ap.add_argument("--rules", default="rules/metrics")
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--modes", default="dynamic,static-restart")
    ap.add_argument("--session-timeouts", default="45000,10000", help="session.timeout.ms, comma-separated")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=HOSTS)
    ap.add_argument("--series", type=int, default=1, help="metrics per host")
    ap.add_argument("--interval", type=int, default=1, help="seconds between a series' samples")
    ap.add_argument("--fill", type=int, default=0, help="seconds of input before the kill, past the 10 s steady state")
    ap.add_argument("--checkpoint-interval", default="2s")
    args = ap.parse_args()
    print("| membership | session timeout | run | partitions owned again (s) | event time moving again (s) "
          "| lag before the kill (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        for timeout in [int(t) for t in args.session_timeouts.split(",")]:
            for r in range(args.runs):
                owned, flowing, base = run(args, mode, timeout)
                print(f"| {mode} | {timeout / 1000:.0f} s | {r + 1} | {owned:.1f} | {flowing:.1f} | {base:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
