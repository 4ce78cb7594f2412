#!/usr/bin/env python3
"""A rolling upgrade of a consumer group (`--kafka-join-group`) from one build to another, and a
rollback, with both builds' binaries: the alerts stored must be those of `vigil replay` of the
same events, and every member restarted must take its keyed partitions over from their
checkpoints.

    python3 benches/upgrade.py --old OLD_VIGIL --new NEW_VIGIL [--brokers 127.0.0.1:9092]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres]

Two members, `a` and `b`, with static membership (`--kafka-instance-id`, what a supervisor
restarting them uses), over a 12-partition topic, start on OLD. The events (the CPU use of 16
machines of one cluster each minute, three busy for a spell: a keyed rule and a fleet-wide one,
run in two stages) are produced in 40 chunks. After chunk 8 `a` is stopped (SIGTERM) and started
on NEW, after 16 `b`, so that from 8 to 16 the group runs both builds at once; after 24 and 32
they go back to OLD the same way (the rollback). Needs a running Apache Kafka
(`scripts/kafka.sh start`) and PostgreSQL; RELIABILITY.md keeps the outcome.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from failover import psql, scrape, owned_keyed, wait_for  # noqa: E402
from workers import free_port  # noqa: E402

RULES = ["rules/machine_cpu_spike.saql", "rules/machine_load_outlier.saql"]
CHUNKS = 40
# After which chunk which member moves to which build.
STEPS = {8: ("a", "new"), 16: ("b", "new"), 24: ("a", "old"), 32: ("b", "old")}


def workload():
    """(minute, line) of 16 machines over 600 minutes; m7, m12 and m3 busy for a spell each."""
    spells = {7: [(100, 130), (200, 220)], 12: [(300, 330)], 3: [(450, 470)]}
    out = []
    for minute in range(600):
        ts = f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z"
        for m in range(16):
            busy = any(a <= minute < b for a, b in spells.get(m, []))
            cpu = 0.95 if busy else round(0.1 + 0.01 * m, 2)
            out.append((minute, json.dumps({"stream": "task_usage", "ts": ts, "job_id": "batch", "task_index": m,
                                            "machine_id": f"m{m}", "cluster": "c1", "cpu": cpu, "mem": 0.2})))
    return out


def chunks(timed, n):
    """About `n` chunks, cut only between minutes."""
    size = len(timed) // n + 1
    out = [[]]
    for i, (minute, line) in enumerate(timed):
        if len(out[-1]) >= size and i > 0 and timed[i - 1][0] != minute:
            out.append([])
        out[-1].append(line)
    return out


class Member:
    def __init__(self, args, work, name, group, topic, db):
        self.name, self.work = name, work
        self.port = free_port()
        rules = f"{work}/rules-{name}"
        os.makedirs(rules)
        for r in RULES:
            shutil.copy(r, rules)
        self.args = ["serve", "--rules", rules, "--database-url", db, "--http-addr", f"127.0.0.1:{self.port}",
                     "--kafka-brokers", args.brokers, "--kafka-group", group, "--kafka-join-group",
                     "--topic", f"task_usage={topic}", "--kafka-instance-id", name, "--workers", "1",
                     "--checkpoint-interval", "1s", "--kafka-option", "session.timeout.ms=10000",
                     "--spool-dir", f"{work}/spool-{name}", "--ingest-log-dir", f"{work}/ingest-{name}"]
        self.runs = []

    def start(self, build, binary):
        log = f"{self.work}/log-{self.name}-{len(self.runs)}-{build}"
        self.runs.append((build, log))
        self.proc = subprocess.Popen([binary] + self.args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        wait_for(f"{self.name} on {build} owning keyed partitions",
                 lambda: (m := scrape(self.port)) and owned_keyed(m) > 0, 120)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def summary(log):
    """What one run of a member logged: partitions taken over (with a checkpoint), checkpoints
    it could not use, warnings and errors."""
    text = open(log).read()
    taken = re.findall(r"restored_bytes=(\d+).*keyed partition taken over|keyed partition taken over.*restored_bytes=(\d+)",
                       text)
    sizes = [int(a or b) for a, b in taken]
    return {
        "taken over": len(sizes),
        "with a checkpoint": sum(1 for s in sizes if s > 0),
        "unusable": text.count("cannot be used"),
        "WARN": len(re.findall(r"\bWARN\b", text)),
        "ERROR": len(re.findall(r"\bERROR\b", text)),
        "said": {re.sub(r"^\S+\s+", "", line) for line in text.splitlines() if re.search(r"\b(WARN|ERROR)\b", line)},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    binaries = {"old": args.old, "new": args.new}
    work = tempfile.mkdtemp(prefix="vigil-upgrade-")
    timed = workload()
    with open(f"{work}/all.jsonl", "w") as f:
        f.write("\n".join(line for _, line in timed) + "\n")
    os.makedirs(f"{work}/replay-rules")
    for r in RULES:
        shutil.copy(r, f"{work}/replay-rules")
    replay = subprocess.run([args.new, "replay", "--rules", f"{work}/replay-rules", f"{work}/all.jsonl"],
                            check=True, capture_output=True, text=True).stdout
    want = {f"{a['id']}:{a['status']}" for a in map(json.loads, replay.splitlines())}
    rules = {a["rule"] for a in map(json.loads, replay.splitlines())}
    print(f"the replay raises {len(want)} transitions of {sorted(rules)}")

    name = f"vigil_upgrade_{uuid.uuid4().hex[:8]}"
    psql(args.postgres, f"CREATE DATABASE {name}")
    db = args.postgres.rsplit("/", 1)[0] + "/" + name
    group, topic = f"upgrade-{uuid.uuid4().hex[:8]}", f"upgrade-{uuid.uuid4().hex[:8]}"
    members = {}
    ok = False
    try:
        for i, chunk in enumerate(chunks(timed, CHUNKS)):
            path = f"{work}/chunk-{i}.jsonl"
            with open(path, "w") as f:
                f.write("\n".join(chunk) + "\n")
            subprocess.run([args.new, "produce", "--brokers", args.brokers, "--topic", topic, "--create-topics",
                            "--partitions", "12", path], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            if i == 0:
                for n in ("a", "b"):
                    members[n] = Member(args, work, n, group, topic, db)
                    members[n].start("old", args.old)
            time.sleep(0.5)
            if i in STEPS:
                n, build = STEPS[i]
                members[n].stop()
                members[n].start(build, binaries[build])
                print(f"after chunk {i}: {n} runs {build}", flush=True)
        deadline = time.monotonic() + 120
        while True:
            rows = subprocess.run(["psql", db, "-At", "-c", "SELECT alert_id || ':' || status FROM alert_events"],
                                  check=True, capture_output=True, text=True).stdout.split()
            if len(set(rows)) >= len(want) or time.monotonic() > deadline:
                break
            time.sleep(1)
        got = set(rows)
        print(f"stored {len(rows)} transitions ({len(got)} distinct); lost {sorted(want - got)}; "
              f"extra {sorted(got - want)}")
        print("| member | run | build | partitions taken over | with a checkpoint | unusable | WARN | ERROR |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for n, m in members.items():
            for r, (build, log) in enumerate(m.runs):
                s = summary(log)
                print(f"| {n} | {r + 1} | {build} | {s['taken over']} | {s['with a checkpoint']} | {s['unusable']} "
                      f"| {s['WARN']} | {s['ERROR']} |")
        said = set()
        for m in members.values():
            for _, log in m.runs:
                said |= summary(log)["said"]
        for line in sorted(said):
            print(f"logged: {line}")
        ok = got == want and len(rows) == len(got)
        print("exact" if ok else f"NOT exact; logs in {work}")
    finally:
        for m in members.values():
            m.stop()
        psql(args.postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if ok:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
