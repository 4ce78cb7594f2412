#!/usr/bin/env python3
"""Throughput of `vigil replay` and `vigil serve` with 1 and more workers (`--workers`).

    python3 benches/workers.py VIGIL_BINARY EVENTS.jsonl [--rules rules/metrics] [--workers 1,2]

replay: wall time of `vigil replay --workers N` over the file (alerts to /dev/null).
serve:  `vigil serve --replay FILE --workers N` on a fresh SQLite store; the time from start until
        the engine has taken every event (`vigil_events_in_total` on /metrics).
Prints one table row per run; BENCHMARKS.md keeps the numbers.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request


def events_in(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(r"^vigil_events_in_total\{[^}]*\} (\S+)$", text, re.M))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def replay(vigil, rules, path, workers):
    started = time.monotonic()
    subprocess.run([vigil, "replay", "--rules", rules, "--workers", str(workers), path],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - started


def serve(vigil, rules, path, workers, total):
    work = tempfile.mkdtemp(prefix="vigil-workers-bench-")
    port = free_port()
    args = [vigil, "serve", "--rules", rules, "--replay", path, "--workers", str(workers),
            "--database-url", f"sqlite://{work}/vigil.db", "--http-addr", f"127.0.0.1:{port}",
            "--spool-dir", f"{work}/spool", "--ingest-log-dir", f"{work}/ingest",
            "--max-event-future", "0s"]
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            time.sleep(0.2)
            if proc.poll() is not None:
                raise SystemExit(f"vigil serve stopped: exit {proc.returncode}")
            try:
                if events_in(port) >= total:
                    return time.monotonic() - started
            except OSError:
                pass
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("vigil")
    p.add_argument("events")
    p.add_argument("--rules", default="rules/metrics")
    p.add_argument("--workers", default="1,2")
    a = p.parse_args()
    with open(a.events, "rb") as f:
        total = sum(1 for line in f if line.strip())
    print(f"{total} events, rules {a.rules}, {os.cpu_count()} cores")
    print("| command | workers | seconds | events/s |")
    print("|---|---:|---:|---:|")
    for name, run in (("replay", lambda w: replay(a.vigil, a.rules, a.events, w)),
                      ("serve", lambda w: serve(a.vigil, a.rules, a.events, w, total))):
        for w in [int(x) for x in a.workers.split(",")]:
            secs = run(w)
            print(f"| {name} | {w} | {secs:.1f} | {total / secs:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
