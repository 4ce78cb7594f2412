#!/usr/bin/env python3
"""A fleet of simulated node_exporter hosts through Prometheus into `vigil serve`: what the service
path costs per sample and per series.

    python3 benches/fleet.py VIGIL_BINARY [--hosts 50,500] [--minutes 10] [--scrape 10]
        [--rules rules] [--node-exporter prometheus-node-exporter] [--prometheus prometheus]
        [--serve-arg=--checkpoint-interval=1h ...]
        [--sender target/release/examples/fleet_send [--fill-hours H] [--fill-step S]]

One real node_exporter (Debian's) is scraped once every scrape interval by a small caching
proxy, which serves that text to every target: N targets of one address, each with its own
`instance` label, are N hosts to Prometheus (Debian's), whose series are real node_exporter
series with the same values on every host (one node_exporter answering N scrapes every 10 s
would itself take the machine's two cores). Prometheus remote-writes to `vigil serve` on its
defaults (SQLite in a fresh folder) with the shipped rules. For each N, after the first two
minutes (series created, checkpoints begun), over the rest of the run:

- samples/s taken by Vigil (`vigil_samples_in_total`);
- Vigil's CPU per sample (user + system time from /proc, over the same span);
- Vigil's RSS, and RSS growth per series (series = hosts x the exporter's series);
- `vigil_state_bytes` per series; Prometheus' failed samples (must be 0);
- the last checkpoint's size, and the mean time of a checkpoint's snapshot and store steps.

With `--sender`, `examples/fleet_send.rs` takes the place of the proxy and Prometheus: it
scrapes the same node_exporter once per interval and remote-writes it as N hosts itself, each at
its own offset in the interval with its own counter offsets (Prometheus and a Python proxy cannot
scrape 1,000 targets every 10 s beside Vigil on two cores). `--fill-hours` has it first send that
many hours of history, one scrape per `--fill-step` seconds per host, as fast as Vigil takes it;
the measured span begins when the live scrapes do. "Prometheus failed" is then the sender's
requests refused for good.

Prints one table row per N (markdown), the numbers of BENCHMARKS.md ("A real fleet").
"""
import argparse
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workers import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def metric(text, name):
    """The sum of a metric's samples in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def step_means(before, after, name="vigil_checkpoint_seconds", steps=("snapshot", "store")):
    """Mean of a histogram's observations by `step` label between two expositions."""
    def sums(text):
        out = {}
        for line in text.splitlines():
            for step in steps:
                for part in ("sum", "count"):
                    if line.startswith(f'{name}_{part}{{step="{step}"}}'):
                        out[(step, part)] = float(line.rsplit(" ", 1)[1])
        return out
    a, b = sums(before), sums(after)
    means = {}
    for step in steps:
        n = b.get((step, "count"), 0) - a.get((step, "count"), 0)
        means[step] = (b.get((step, "sum"), 0) - a.get((step, "sum"), 0)) / n if n else float("nan")
    return means


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Proxy:
    """Serves the latest scrape of one real node_exporter to every request."""

    def __init__(self, upstream, every):
        self.upstream, self.every, self.body = upstream, every, b""
        self.stop = threading.Event()
        body_of = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = body_of.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.port = free_port()
        self.server = Server(("127.0.0.1", self.port), Handler)
        self.refresh()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self.loop, daemon=True).start()

    def refresh(self):
        self.body = get(self.upstream).encode()

    def loop(self):
        while not self.stop.wait(self.every):
            try:
                self.refresh()
            except OSError:
                pass

    def series(self):
        return sum(1 for line in self.body.decode().splitlines() if line and not line.startswith("#"))

    def close(self):
        self.stop.set()
        self.server.shutdown()


def wait_listening(proc, log_path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log_path) as f:
            for line in f:
                if line.startswith("vigil: listening on "):
                    return line.split("listening on ", 1)[1].strip()
        if proc.poll() is not None:
            sys.exit(f"vigil exited: see {log_path}")
        time.sleep(0.2)
    sys.exit("vigil did not start")


def serve(binary, rules, folder, extra=()):
    """`vigil serve` on its defaults (SQLite) with everything in `folder`, and `extra` flags:
    (process, its URL)."""
    log_path = os.path.join(folder, "vigil.log")
    vigil = subprocess.Popen(
        [binary, "serve", "--rules", rules, "--http-addr", f"127.0.0.1:{free_port()}",
         "--database-url", f"sqlite://{folder}/vigil.db", "--spool-dir", f"{folder}/spool",
         "--ingest-log-dir", f"{folder}/ingest", *extra],
        stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
    return vigil, wait_listening(vigil, log_path)


def prometheus(args, hosts, proxy, folder, base):
    """Prometheus scraping `hosts` targets of the proxy and remote-writing to `base`: (process, a
    function giving its failed samples)."""
    prom_port = free_port()
    targets = "".join(
        f"      - targets: ['127.0.0.1:{proxy.port}']\n        labels: {{instance: 'host-{i:04d}'}}\n"
        for i in range(hosts))
    config = os.path.join(folder, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"global:\n  scrape_interval: {args.scrape}s\n  scrape_timeout: {max(1, args.scrape - 1)}s\n"
                f"scrape_configs:\n  - job_name: node\n    static_configs:\n{targets}"
                f"remote_write:\n  - url: {base}/api/v1/write\n")
    prom = subprocess.Popen(
        [args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={folder}/tsdb",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    failed = lambda: metric(get(f"http://127.0.0.1:{prom_port}/metrics"),  # noqa: E731
                            "prometheus_remote_storage_samples_failed_total")
    return prom, failed


def sender(args, hosts, upstream, folder, base):
    """`fleet_send` sending `hosts` hosts to `base` once its history (if any) is sent: (process,
    a function giving its requests refused for good)."""
    log_path = os.path.join(folder, "sender.log")
    command = [args.sender, "--url", f"{base}/api/v1/write", "--source", upstream, "--hosts", str(hosts),
               "--scrape", str(args.scrape), "--seconds", str(int(args.minutes * 60)),
               "--fill-hours", str(args.fill_hours), "--fill-step", str(args.fill_step)]
    report = os.path.join(folder, "sender.json")
    proc = subprocess.Popen(command, stdout=open(report, "w"), stderr=open(log_path, "w"))
    while "fleet_send: live" not in open(log_path).read():
        if proc.poll() is not None:
            sys.exit(f"fleet_send exited: see {log_path}")
        time.sleep(1)
    print(open(log_path).read().strip(), file=sys.stderr)

    def failed():
        proc.wait()
        return json.load(open(report))["failed_requests"]
    return proc, failed


def run(args, hosts, proxy, work):
    folder = tempfile.mkdtemp(prefix=f"fleet-{hosts}-", dir=work)
    vigil, base = serve(args.vigil, args.rules, folder, args.serve_arg)
    rss_start = rss_bytes(vigil.pid)
    if args.sender:
        prom, failed_of = sender(args, hosts, proxy.upstream, folder, base)
    else:
        prom, failed_of = prometheus(args, hosts, proxy, folder, base)
    try:
        time.sleep(120)
        first = get(f"{base}/metrics")
        start = (time.time(), metric(first, "vigil_samples_in_total"), cpu_seconds(vigil.pid))
        time.sleep(args.minutes * 60 - 120)
        text = get(f"{base}/metrics")
        end = (time.time(), metric(text, "vigil_samples_in_total"), cpu_seconds(vigil.pid))
        state = metric(text, "vigil_state_bytes")
        checkpoint = (metric(text, "vigil_checkpoint_bytes"), step_means(first, text))
        rss = rss_bytes(vigil.pid)
        failed = failed_of()
    finally:
        prom.terminate()
        vigil.terminate()
        prom.wait()
        vigil.wait()
    series = hosts * proxy.series()
    samples = end[1] - start[1]
    seconds = end[0] - start[0]
    return {
        "hosts": hosts,
        "series": series,
        "samples_per_s": samples / seconds,
        "cpu_us_per_sample": (end[2] - start[2]) / samples * 1e6 if samples else float("nan"),
        "cpu_share": (end[2] - start[2]) / seconds,
        "rss_mb": rss / 2**20,
        "rss_per_series": (rss - rss_start) / series,
        "state_per_series": state / series,
        "failed": failed,
        "checkpoint_mb": checkpoint[0] / 2**20,
        "snapshot_ms": checkpoint[1]["snapshot"] * 1e3,
        "store_ms": checkpoint[1]["store"] * 1e3,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vigil")
    p.add_argument("--hosts", default="50,500")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--scrape", type=int, default=10)
    p.add_argument("--rules", default="rules")
    p.add_argument("--node-exporter", default="prometheus-node-exporter")
    p.add_argument("--prometheus", default="prometheus")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="a flag for `vigil serve` (repeat it), e.g. --serve-arg=--checkpoint-interval=1h")
    p.add_argument("--sender", help="examples/fleet_send's binary: send the hosts without Prometheus")
    p.add_argument("--fill-hours", type=float, default=0, help="with --sender: hours of history sent first")
    p.add_argument("--fill-step", type=int, default=60, help="with --sender: seconds between the history's scrapes")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="vigil-fleet-")
    exporter_port = free_port()
    exporter = subprocess.Popen([args.node_exporter, f"--web.listen-address=127.0.0.1:{exporter_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        proxy = Proxy(f"http://127.0.0.1:{exporter_port}/metrics", args.scrape)
        print(f"one node_exporter of {proxy.series()} series, scraped every {args.scrape} s; "
              f"{args.minutes} min a run, measured after the first 2")
        print("| hosts | series | samples/s | CPU per sample | CPU (share of a core) | RSS | RSS growth per series "
              "| state estimate per series | Prometheus failed | checkpoint | snapshot | store |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for hosts in [int(h) for h in args.hosts.split(",")]:
            r = run(args, hosts, proxy, work)
            print(f"| {r['hosts']} | {r['series']:,} | {r['samples_per_s']:,.0f} | {r['cpu_us_per_sample']:.1f} us "
                  f"| {r['cpu_share']:.2f} | {r['rss_mb']:,.0f} MB | {r['rss_per_series']:,.0f} B "
                  f"| {r['state_per_series']:,.0f} B | {r['failed']:.0f} | {r['checkpoint_mb']:,.1f} MB "
                  f"| {r['snapshot_ms']:,.0f} ms | {r['store_ms']:,.0f} ms |", flush=True)
        proxy.close()
    finally:
        exporter.terminate()
        exporter.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
