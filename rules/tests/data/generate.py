#!/usr/bin/env python3
"""Writes the event files the metric rules' behaviour cases read (rules/tests/*.toml).

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


if __name__ == "__main__":
    main()
