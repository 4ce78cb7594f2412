#!/usr/bin/env python3
"""What a hand-over costs: a group member's keyed state checkpointed on shutdown and restored by
the next owner, for a state of a given size.

    python3 benches/restore.py VIGIL_BINARY [--hosts 1000] [--points 300] [--rules rules/metrics]
        [--brokers 127.0.0.1:9092] [--postgres postgres://postgres@127.0.0.1:5432/postgres]

HOSTS metric series (`cpu_utilization`, one sample every 5 minutes, POINTS each) are produced
into a fresh 12-partition topic. Instance A (`--kafka-join-group`, PostgreSQL) reads them all and
is stopped with SIGTERM: closing its consumers checkpoints each of the 12 keyed partitions into
the store. Instance B then joins the group, claims the 12 partitions and restores them. Printed:
A's state (`vigil_state_bytes`), the checkpoint bytes B restored (`vigil_group_restore_bytes_total`)
and the time its claims took (`vigil_group_restore_seconds`: raising the epoch, reading the
checkpoint and decoding it into engines), in total, per keyed partition and per MB.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from group import metric, psql, stop  # noqa: E402
from workers import free_port  # noqa: E402

KEYED = 12


def events(path, hosts, points):
    rng = random.Random(7)
    start = 1_767_225_600_000
    with open(path, "w") as f:
        for t in range(points):
            for h in range(hosts):
                value = 40 + 10 * ((t + h) % 12) / 12 + rng.gauss(0, 2)
                f.write(json.dumps({"stream": "metric", "ts": start + t * 300_000, "host": f"h{h}",
                                    "name": "cpu_utilization", "value": round(value, 3)}) + "\n")


def wait(what, test, timeout, procs):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"vigil serve stopped while waiting for {what}: exit {p.returncode}")
        try:
            if test():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no {what} after {timeout} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vigil")
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--points", type=int, default=300)
    ap.add_argument("--rules", default="rules/metrics")
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vigil-restore-bench-")
    total = args.hosts * args.points
    events(f"{work}/events.jsonl", args.hosts, args.points)
    topic = f"bench-restore-{uuid.uuid4().hex[:8]}"
    subprocess.run([args.vigil, "produce", "--brokers", args.brokers, "--topic", topic, "--create-topics",
                    "--partitions", "12", f"{work}/events.jsonl"], check=True)
    name = f"vigil_restore_bench_{uuid.uuid4().hex[:8]}"
    psql(args.postgres, f"CREATE DATABASE {name}")
    db = args.postgres.rsplit("/", 1)[0] + "/" + name
    group = f"restore-{uuid.uuid4().hex[:8]}"
    rules = shutil.copytree(args.rules, f"{work}/rules")

    def start(tag):
        port = free_port()
        cmd = [args.vigil, "serve", "--rules", rules, "--database-url", db, "--http-addr", f"127.0.0.1:{port}",
               "--kafka-brokers", args.brokers, "--kafka-group", group, "--topic", f"metric={topic}",
               "--kafka-join-group", "--kafka-keyed-partitions", str(KEYED), "--spool-dir", f"{work}/spool{tag}",
               "--ingest-log-dir", f"{work}/ingest{tag}", "--max-event-future", "0s"]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{work}/log{tag}", "w")), port

    procs = []
    try:
        a, pa = start("a")
        procs.append(a)

        def a_done():
            forwarded = metric(pa, "vigil_group_forwarded_total")
            arrived = metric(pa, "vigil_group_taken_total") + metric(pa, "vigil_group_duplicates_total")
            return metric(pa, "vigil_events_in_total") >= total and arrived >= forwarded

        t0 = time.monotonic()
        wait("instance A taking every event", a_done, args.timeout, procs)
        read_secs = time.monotonic() - t0
        # The state gauge is read every 5 s.
        wait("instance A's state gauge", lambda: metric(pa, "vigil_state_bytes") > 0, 30, procs)
        state = metric(pa, "vigil_state_bytes")
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=120)
        procs.remove(a)
        b, pb = start("b")
        procs.append(b)
        wait("instance B restoring the keyed partitions",
             lambda: metric(pb, "vigil_group_restore_seconds_count") >= KEYED, args.timeout, procs)
        secs = metric(pb, "vigil_group_restore_seconds_sum")
        restored = metric(pb, "vigil_group_restore_bytes_total")
        mb = restored / 1e6
        print(f"{args.hosts} series x {args.points} points ({total} events), read by A in {read_secs:.1f} s")
        print("| series | A's state (MB) | checkpoints restored (MB) | restore, 12 partitions (s) "
              "| per partition (ms) | per MB (ms) |")
        print("|---|---|---|---|---|---|")
        per_mb = secs * 1000 / mb if mb > 0 else float("nan")
        print(f"| {args.hosts} | {state / 1e6:.1f} | {mb:.1f} | {secs:.3f} | {secs * 1000 / KEYED:.1f} "
              f"| {per_mb:.1f} |", flush=True)
        if restored <= 0:
            raise SystemExit("instance B restored nothing: instance A stored no checkpoint on SIGTERM")
    finally:
        stop(procs)
        psql(args.postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
