#!/usr/bin/env python3
"""Writes the event files the rules' behaviour cases read (rules/tests/*.toml).

Deterministic (seeded), so the files in the repository are what this script writes:
`python3 rules/tests/data/generate.py` from the repository root, then `vigil test rules`.
"""
import json
import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).parent
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def ts(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def metric(t, host, name, value, kind=None):
    event = {"stream": "metric", "ts": ts(t), "host": host, "name": name, "value": round(value, 3)}
    if kind:
        event["kind"] = kind
    return event


def daily(seed, host, name, days, step=timedelta(minutes=5), level=50.0, swing=10.0, noise=2.0):
    """A series with a daily cycle and Gaussian noise: [(time, host, name, value)]."""
    rng = random.Random(seed)
    out = []
    t = START + timedelta(minutes=1)
    end = START + timedelta(days=days)
    while t < end:
        phase = (t - START).total_seconds() / 86400.0 * 2 * math.pi
        out.append([t, host, name, level + swing * math.sin(phase) + rng.gauss(0, noise)])
        t += step
    return out


def write(name, rows):
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    with open(HERE / name, "w") as f:
        for r in rows:
            f.write(json.dumps(metric(*r)) + "\n")


def counter(seed, host, name, days, resets=(), burst=None):
    """A counter scraped every minute whose rate follows a daily cycle around 100/s: it
    restarts from 0 at each time of `resets`; within `burst` (start, end) its rate is 6 times
    as high. [(time, host, name, value, "counter")]."""
    rng = random.Random(seed)
    out = []
    total = 0.0
    t = START + timedelta(seconds=30)
    end = START + timedelta(days=days)
    while t < end:
        phase = (t - START).total_seconds() / 86400.0 * 2 * math.pi
        rate = max(0.0, 100.0 + 30.0 * math.sin(phase) + rng.gauss(0, 5))
        if burst and burst[0] <= t < burst[1]:
            rate *= 6
        total += rate * 60
        if any(t - timedelta(minutes=1) < r <= t for r in resets):
            total = rate * 30
        out.append([t, host, name, total, "counter"])
        t += timedelta(minutes=1)
    return out


def at(rows, when):
    """The row at `when` (its first sample at or after it)."""
    return next(r for r in rows if r[0] >= when)


def write_events(name, events):
    """Events of declared streams (rules/k8s, rules/hosts), in time order."""
    events.sort(key=lambda e: e["ts"])
    with open(HERE / name, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def k8s_evictions():
    """Three hours of evictions on eight nodes, one to three each an hour; node-7 evicts
    fifteen in the second hour. Pods move among the nodes."""
    rng = random.Random(10)
    events = []
    for hour in range(3):
        for node in range(8):
            n = 15 if (hour, node) == (1, 7) else rng.randint(1, 3)
            for i in range(n):
                t = START + timedelta(hours=hour, minutes=rng.randint(0, 59), seconds=i)
                pod = f"web-{rng.randint(0, 999):03d}"
                events.append({"stream": "k8s_event", "ts": ts(t), "namespace": "shop", "pod": pod,
                               "node": f"node-{node}", "reason": "Evicted",
                               "message": "The node was low on resource: memory."})
    return events


def host_activity(days, new_child_at=None, new_peer_at=None):
    """Hourly activity of two hosts' programs over `days`: nginx starts workers, which connect
    to the database and the cache; sshd starts shells, which read their own files. At
    `new_child_at`, nginx starts /bin/sh, which connects out to an address never seen; at
    `new_peer_at`, an nginx worker connects to a new address."""
    rng = random.Random(11)
    events = []
    pid = 1000
    hours = int(days * 24)
    for hour in range(hours):
        for host in ("web-1", "web-2"):
            base = START + timedelta(hours=hour, minutes=rng.randint(0, 40))
            pid += 2
            events.append({"stream": "process_event", "ts": ts(base), "host": host, "pid": 1, "exe": "/usr/sbin/nginx",
                           "op": "start", "user": "www", "child_pid": pid, "child_exe": "/usr/sbin/nginx-worker"})
            for k, peer in enumerate(("10.0.0.5", "10.0.0.6")):
                events.append({"stream": "net_event", "ts": ts(base + timedelta(seconds=5 + k)), "host": host, "pid": pid,
                               "exe": "/usr/sbin/nginx-worker", "op": "connect", "dst_ip": peer, "dst_port": 5432})
            events.append({"stream": "process_event", "ts": ts(base + timedelta(minutes=3)), "host": host, "pid": 22,
                           "exe": "/usr/sbin/sshd", "op": "start", "child_pid": pid + 1, "child_exe": "/bin/bash"})
            events.append({"stream": "file_event", "ts": ts(base + timedelta(minutes=4)), "host": host, "pid": pid + 1,
                           "exe": "/bin/bash", "op": "read", "path": "/home/ops/.bashrc"})
            events.append({"stream": "net_event", "ts": ts(base + timedelta(minutes=6)), "host": host, "pid": pid + 1,
                           "exe": "/bin/bash", "op": "connect", "dst_ip": "10.0.0.9", "dst_port": 22})
    if new_child_at is not None:
        t = START + new_child_at
        events.append({"stream": "process_event", "ts": ts(t), "host": "web-1", "pid": 1, "exe": "/usr/sbin/nginx",
                       "op": "start", "child_pid": 66666, "child_exe": "/bin/sh"})
        events.append({"stream": "file_event", "ts": ts(t + timedelta(seconds=20)), "host": "web-1", "pid": 66666,
                       "exe": "/bin/sh", "op": "read", "path": "/etc/shadow"})
        events.append({"stream": "net_event", "ts": ts(t + timedelta(minutes=2)), "host": "web-1", "pid": 66666,
                       "exe": "/bin/sh", "op": "connect", "dst_ip": "203.0.113.9", "dst_port": 443})
    if new_peer_at is not None:
        events.append({"stream": "net_event", "ts": ts(START + new_peer_at), "host": "web-2", "pid": 4242,
                       "exe": "/usr/sbin/nginx-worker", "op": "connect", "dst_ip": "10.0.0.77", "dst_port": 6379})
    return events


def main():
    # metric_deviation: three days of a noisy daily cycle.
    quiet = daily(1, "h1", "latency_ms", 3)
    write("deviation_quiet.jsonl", quiet)

    # A spike at day 2 + 6 h, and a second one two hours later (the same incident).
    spiky = daily(1, "h1", "latency_ms", 3)
    at(spiky, START + timedelta(days=2, hours=6))[3] = 150.0
    at(spiky, START + timedelta(days=2, hours=8))[3] = 150.0
    # Another host's series on a larger scale: 150 is ordinary there, so it stays quiet.
    wide = daily(2, "h2", "latency_ms", 3, level=150.0, swing=40.0, noise=8.0)
    # A series that starts at day 2 and spikes three hours later: too young to judge.
    young = [r for r in daily(7, "h3", "latency_ms", 3) if r[0] >= START + timedelta(days=2)]
    at(young, START + timedelta(days=2, hours=3))[3] = 150.0
    write("deviation_spike.jsonl", spiky + wide + young)

    # A change of regime: the same series starts swinging wildly at day 2 + 12 h and stays so.
    regime = daily(3, "h1", "queue_depth", 3)
    rng = random.Random(4)
    for r in regime:
        if r[0] >= START + timedelta(days=2, hours=12):
            r[3] = 50.0 + rng.choice([-1, 1]) * (35.0 + rng.gauss(0, 3))
    write("deviation_regime.jsonl", regime)

    # host_silent: a host that reports hourly for two days, another every 5 minutes; then the
    # hourly host stops at day 2 (its last report at day 1 + 23:00) and the other keeps going.
    rows = []
    t = START
    while t < START + timedelta(days=2):
        rows.append([t, "hourly", "disk_used", 40.0])
        t += timedelta(hours=1)
    rows += daily(5, "steady", "cpu", 2.5)
    write("silent_hourly.jsonl", rows)

    # metric_stuck: an idle machine at 0 from its first sample for a day, and a busy one whose
    # value moves for 8 hours and then freezes at 37.5 for an hour, then moves again.
    rows = [[START + timedelta(minutes=1 + 5 * i), "idle", "cpu", 0.0] for i in range(288)]
    busy = daily(6, "busy", "cpu", 1, noise=3.0)
    for r in busy:
        if START + timedelta(hours=8) <= r[0] < START + timedelta(hours=9):
            r[3] = 37.5
    write("stuck_idle_and_frozen.jsonl", rows + busy)

    # counter_rate_deviation: a request counter that restarts from 0 twice in three days.
    resets = [START + timedelta(days=1, hours=10), START + timedelta(days=2, hours=15)]
    write("counter_quiet.jsonl", counter(8, "h1", "http_requests_total", 3, resets))
    # The same with six times the traffic for ten minutes at day 2 + 6 h; beside it, a series
    # without a kind whose raw value climbs as a counter's does: not read by the rule.
    burst = (START + timedelta(days=2, hours=6), START + timedelta(days=2, hours=6, minutes=10))
    spiky = counter(8, "h1", "http_requests_total", 3, resets, burst)
    unmarked = [r[:4] for r in counter(9, "h2", "bytes_sent", 3, burst=burst)]
    write("counter_burst.jsonl", spiky + unmarked)

    # Declared streams: Kubernetes evictions, and a host's processes, files and connections.
    write_events("k8s_evictions.jsonl", k8s_evictions())
    write_events("hosts_quiet.jsonl", host_activity(2))
    intrusion = timedelta(days=1, hours=6, minutes=50)
    write_events("hosts_intrusion.jsonl", host_activity(2, new_child_at=intrusion,
                                                       new_peer_at=timedelta(days=1, hours=12, minutes=45)))


if __name__ == "__main__":
    main()
