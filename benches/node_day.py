#!/usr/bin/env python3
"""A day of node_exporter history, then a real rate anomaly: does `rules/metrics` catch it?

    python3 benches/node_day.py VIGIL_BINARY DIR [--hours 24] [--hosts 4] [--rules rules/metrics]

DIR is the folder of a `benches/node_faults.py` run: `record.jsonl` holds every scrape of a real
node_exporter (10 s apart), healthy and then under `stress-ng --fork`, and `record.json` when the
fork started and ended. A day of real history cannot be recorded within a session, so the healthy
part is laid end to end until it covers `--hours` before the fork (counters carried on, so they
keep climbing), for `--hosts` hosts, each starting at another point of the recording. The
recorded fork follows on `host-0`, the others carry on healthy. Everything is replayed through
`vigil replay` in time order, and the script prints the alerts: on `host-0` after the fork
started (caught, and how long after), and any other (false).

The history repeats every length of the recording (20 minutes by default): it has the noise of
a real host at that scale, not a day's rhythm.
"""
import argparse
import collections
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading


def load(path):
    """Scrapes of the recording, in time order: [(ts, {series key: event})]."""
    scrapes = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            key = (e["name"], json.dumps(e.get("labels", {}), sort_keys=True))
            scrapes.setdefault(e["ts"], {})[key] = e
    return list(scrapes.items())


def counter_offsets(healthy):
    """What each counter gains over one pass of the healthy recording, plus one scrape's step, so
    that a pass laid after another carries the counter on."""
    first, last = healthy[0][1], healthy[-1][1]
    gain = {}
    for key, e in last.items():
        if e.get("kind") == "counter" and key in first:
            span = e["value"] - first[key]["value"]
            gain[key] = span + span / max(1, len(healthy) - 1)
    return gain


def events(healthy, fault, hosts, hours, step_ms):
    """The replayed events, in time order."""
    gain = counter_offsets(healthy)
    n = len(healthy)
    passes = -(-int(hours * 3600 * 1000 / step_ms) // n)
    history = passes * n
    start = fault[0][0] - history * step_ms
    total = history + len(fault)
    for i in range(total):
        ts = start + i * step_ms
        for h in range(hosts):
            if h == 0 and i >= history:
                # The recorded fork, carried on from where host-0's last pass ended.
                sample, laps = fault[i - history][1], passes - 1
            else:
                j = i + h * n // hosts
                sample, laps = healthy[j % n][1], j // n
            for key, e in sample.items():
                value = e["value"] + gain.get(key, 0.0) * laps
                if e["name"] == "node_time_seconds":
                    value = ts / 1000  # the host's clock, which the passes would turn back
                out = dict(e, ts=ts, host=f"host-{h}", value=value)
                yield out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vigil")
    p.add_argument("dir")
    p.add_argument("--hours", type=float, default=24)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rules", default="rules/metrics")
    args = p.parse_args()
    with open(os.path.join(args.dir, "record.json")) as f:
        marks = json.load(f)
    scrapes = load(os.path.join(args.dir, "record.jsonl"))
    healthy = [s for s in scrapes if s[0] < marks["fork_start_ms"]]
    fault = [s for s in scrapes if s[0] >= marks["fork_start_ms"]]
    step_ms = round((healthy[-1][0] - healthy[0][0]) / (len(healthy) - 1) / 1000) * 1000
    fork_at = fault[0][0]
    work = tempfile.mkdtemp(prefix="vigil-day-")
    fifo = os.path.join(work, "day.jsonl")
    os.mkfifo(fifo)
    alerts_path = os.path.join(work, "alerts.jsonl")
    replay = subprocess.Popen([args.vigil, "replay", "--rules", args.rules, "--out", alerts_path, fifo],
                              stderr=subprocess.PIPE, text=True)
    count = [0]

    def write():
        with open(fifo, "w") as f:
            for e in events(healthy, fault, args.hosts, args.hours, step_ms):
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
                count[0] += 1

    writer = threading.Thread(target=write)
    writer.start()
    summary = replay.stderr.read()
    writer.join()
    if replay.wait() != 0:
        sys.exit(f"vigil replay failed: {summary}")
    print(f"{count[0]:,} events: {len(healthy)} healthy scrapes laid end to end over {args.hours} h for "
          f"{args.hosts} hosts, then {len(fault)} scrapes of the fork on host-0")
    caught, false = [], []
    with open(alerts_path) as f:
        for line in f:
            a = json.loads(line)
            at = datetime.datetime.fromisoformat(a["time"].replace("Z", "+00:00")).timestamp() * 1000
            host = next((v for k, v in a["key"].items() if k.endswith("host")), "")
            name = a["values"].get("s.name", a["values"].get("name", ""))
            row = (a["rule"], a["severity"], host, name, (at - fork_at) / 1000)
            (caught if host == "host-0" and at >= fork_at else false).append(row)
    print("| alert | severity | host | series | after the fork started |")
    print("|---|---|---|---|---:|")
    for rule, severity, host, name, after in caught:
        print(f"| {rule} | {severity} | {host} | {name} | {after:.0f} s |")
    print(f"false alerts (any other host, or before the fork): {len(false)}")
    for rule, severity, host, name, after in false:
        print(f"  {rule} {severity} {host} {name} at {after / 3600:+.2f} h")


if __name__ == "__main__":
    main()
