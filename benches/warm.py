#!/usr/bin/env python3
"""What a warm start costs (`vigil serve --warm-from-prometheus`): hosts of node_exporter series
with a day of history in Debian's Prometheus, read at the start of `vigil serve`; then the same history read by a backtest.

    python3 benches/warm.py VIGIL_BINARY [--hosts 20] [--hours 24] [--step 150]
        [--node-exporter prometheus-node-exporter] [--prometheus prometheus] [--promtool promtool]

One scrape of a real node_exporter (Debian's) gives the series: each host has them all, with
its own `instance`. Counters climb by a rate of their own per series, 30% of the gauges move
(a daily cycle with noise) and the rest stay flat, as most of a host's do. The history, every
10 s scrape in its last `--raw-hours` and one value per `--step` seconds before, over `--hours`
ending a minute ago, is written as OpenMetrics text
and turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`; Prometheus serves
them. Then `vigil serve` (release build, SQLite in a fresh folder, `rules/metrics`) starts with
a warm start of the same lookback, step and raw part, and the script reads, until its log says the warm
start is done: its duration, samples read per second, Vigil's peak RSS, Prometheus' peak RSS,
and the latency of a query (`up`) sent to Prometheus every half second meanwhile. Then `vigil
replay --from-prometheus` of the same range, streamed and as samples: samples read per second
and Prometheus' peak RSS.

Prints one markdown table row, then a line per backtest.
"""
import argparse
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workers import free_port  # noqa: E402

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$')


def scrape(exe):
    port = free_port()
    p = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.read().decode()
            except OSError:
                time.sleep(0.1)
        sys.exit("node_exporter does not answer")
    finally:
        p.kill()
        p.wait()


def series_of(text):
    """(name, labels without braces, value) of each sample; NaN and infinities left out."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), (m.group(2) or "{}")[1:-1], m.group(3)
        try:
            v = float(value)
        except ValueError:
            continue
        if math.isfinite(v):
            out.append((name, labels, v))
    return out


def write_history(path, series, hosts, hours, step, end, raw=3600, scrape=10):
    rng = random.Random(7)
    start = end - hours * 3600
    # Every scrape in the last `raw` seconds (what the warm start reads raw), one per step before.
    raw_from = end - raw
    steps = [t for t in range(start - start % step + step, raw_from, step)] + list(range(raw_from, end + 1, scrape))
    by_name = {}
    for name, labels, v in series:
        by_name.setdefault(name, []).append((labels, v))
    count = 0
    with open(path, "w") as f:
        for name, members in by_name.items():
            counter = name.endswith("_total")
            for h in range(hosts):
                instance = f'instance="host-{h:04d}:9100",job="node"'
                for labels, v in members:
                    all_labels = instance + ("," + labels if labels else "")
                    moving = counter or rng.random() < 0.3
                    rate = rng.uniform(0.1, 100.0)
                    phase = rng.uniform(0, 2 * math.pi)
                    for t in steps:
                        if counter:
                            value = v + rate * (t - start)
                        elif moving:
                            value = v * (1 + 0.2 * math.sin(2 * math.pi * t / 86400 + phase)) + rng.gauss(0, abs(v) * 0.01 + 0.01)
                        else:
                            value = v
                        f.write(f"{name}{{{all_labels}}} {value:.6g} {t}\n")
                        count += 1
        f.write("# EOF\n")
    return count, len(series) * hosts


def serve_history(exe, work, tsdb):
    """Prometheus (`exe`) serving the blocks in `tsdb`, scraping nothing, once ready: (process,
    its URL)."""
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1h\n")
    port = free_port()
    prom = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                             "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2):
                break
        except OSError:
            time.sleep(0.2)
    return prom, url


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def backtest(a, repo, purl, prom, end):
    """`vigil replay --from-prometheus` of the same history by remote-read (raw samples): its
    duration, samples/s and Prometheus' peak RSS meanwhile."""
    start = end - a.hours * 3600
    for mode in ("streamed", "samples"):
        t = time.time()
        replay = subprocess.Popen([a.vigil, "replay", "--rules", os.path.join(repo, "rules/metrics"), "--from-prometheus", purl,
                                   "--match", '{job="node"}', "--start", str(start), "--end", str(end), "--page", "1h",
                                   "--prometheus-read", mode], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak = 0
        while replay.poll() is None:
            peak = max(peak, rss(prom.pid))
            time.sleep(0.5)
        took = time.time() - t
        summary = replay.stderr.read()
        events = int(re.search(r"replayed (\d+) events", summary).group(1)) if "replayed" in summary else 0
        print(f"backtest, {mode}: {events:,} samples in {took:.1f} s, {events / took:,.0f} samples/s, "
              f"Prometheus peak RSS {peak / 1e6:,.0f} MB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vigil")
    ap.add_argument("--hosts", type=int, default=20)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--step", type=int, default=150)
    ap.add_argument("--raw-hours", type=float, default=1, help="--warm-raw: the last history, every 10 s scrape")
    ap.add_argument("--node-exporter", default="prometheus-node-exporter")
    ap.add_argument("--prometheus", default="prometheus")
    ap.add_argument("--promtool", default="promtool")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="vigil-warm-")
    try:
        series = series_of(scrape(a.node_exporter))
        end = int(time.time()) - 60
        om = os.path.join(work, "history.om")
        t = time.time()
        samples, n_series = write_history(om, series, a.hosts, a.hours, a.step, end, int(a.raw_hours * 3600))
        print(f"history: {n_series} series, {samples} samples, written in {time.time() - t:.0f} s", file=sys.stderr)
        t = time.time()
        tsdb = os.path.join(work, "tsdb")
        subprocess.run([a.promtool, "tsdb", "create-blocks-from", "openmetrics", om, tsdb], check=True, stdout=subprocess.DEVNULL)
        os.remove(om)
        print(f"blocks made in {time.time() - t:.0f} s", file=sys.stderr)
        prom, purl = serve_history(a.prometheus, work, tsdb)
        prom_base = rss(prom.pid)
        vdir = os.path.join(work, "vigil")
        os.makedirs(vdir)
        started = time.time()
        vigil = subprocess.Popen([a.vigil, "serve", "--rules", os.path.join(repo, "rules/metrics"),
                                  "--http-addr", f"127.0.0.1:{free_port()}", "--database-url", f"sqlite://{vdir}/v.db",
                                  "--spool-dir", f"{vdir}/spool", "--ingest-log-dir", f"{vdir}/ingest",
                                  "--warm-from-prometheus", purl, "--warm-lookback", f"{a.hours}h",
                                  "--warm-step", f"{a.step}s", "--warm-raw", f"{int(a.raw_hours * 60)}min",
                                  "--warm-match", '{job="node"}'],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "VIGIL_LOG": "info"})
        done = threading.Event()
        log = []

        def read_log():
            for line in vigil.stderr:
                log.append(line)
                if "warm start done" in line or "warm start failed" in line:
                    done.set()
        threading.Thread(target=read_log, daemon=True).start()
        peak_v = peak_p = 0
        latencies = []
        while not done.wait(0.5):
            peak_v, peak_p = max(peak_v, rss(vigil.pid)), max(peak_p, rss(prom.pid))
            t = time.time()
            try:
                with urllib.request.urlopen(purl + "/api/v1/query?query=up", timeout=30):
                    latencies.append(time.time() - t)
            except OSError:
                latencies.append(float("inf"))
            if vigil.poll() is not None:
                sys.exit("vigil stopped:\n" + "".join(log))
        took = time.time() - started
        line = next(l for l in log if "warm start" in l and ("done" in l or "failed" in l))
        read = int(re.search(r"samples=(\d+)", line).group(1)) if "samples=" in line else 0
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1000 if latencies else 0
        worst = latencies[-1] * 1000 if latencies else 0
        print("| hosts | series | samples read | warm start | samples/s | Vigil peak RSS | Prometheus RSS before, peak | query latency p50, max |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(f"| {a.hosts} | {n_series:,} | {read:,} | {took:.1f} s | {read / took:,.0f} | {peak_v / 1e6:,.0f} MB "
              f"| {prom_base / 1e6:,.0f} MB, {peak_p / 1e6:,.0f} MB | {p50:.0f} ms, {worst:.0f} ms |")
        vigil.terminate()
        vigil.wait(timeout=30)
        backtest(a, repo, purl, prom, end)
        prom.terminate()
        prom.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
