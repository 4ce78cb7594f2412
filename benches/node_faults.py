#!/usr/bin/env python3
"""Real faults that take longer than a test, injected into a live fleet by hand: which alerts
fire in Vigil and in Prometheus, and how long after the fault.

    python3 benches/node_faults.py VIGIL_BINARY [--healthy-minutes 20] [--fork-minutes 4]
        [--fault-minutes 35] [--out DIR]

Four hosts of Debian's node_exporter, scraped every 10 s by Debian's Prometheus, which
evaluates the node-mixin's alerts in PromQL (`tests/data/node-mixin/alerts.yml`) every 15 s
(Vigil's windows end every 15 s) and remote-writes to `vigil serve` running the shipped
`rules/`. `host-1` to `host-3` are one exporter listed three times; `host-fs` has an exporter of
its own, the only one that sees a small tmpfs mounted for the run. Then, in turn:

1. healthy, `--healthy-minutes`: every alert is counted;
2. `stress-ng --fork 2` (niced), `--fork-minutes`: a rate anomaly no node-mixin alert sees;
3. the tmpfs filled to 98% of its bytes and of its inodes, and `stress-ng --cpu 0 --cpu-load 95`
   (niced) for 20 minutes, watched for `--fault-minutes`.

Every scrape of the healthy exporter during 1 and 2 is also written to `DIR/record.jsonl` as
Vigil metric events, with the fork fault's start in `DIR/record.json`: `benches/node_day.py`
builds a day of history from it. Prints, for each alert that fired, when it first fired in each
system, counted from the start of the phase it fired in. Needs root (mount), prometheus,
prometheus-node-exporter and stress-ng (apt-get).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet import get, serve  # noqa: E402
from workers import free_port  # noqa: E402

EXCLUDE_DEFAULT = "^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)"
UNITS = {"_bytes": "bytes", "_seconds": "seconds", "_ratio": "ratio", "_percent": "percent",
         "_celsius": "celsius", "_joules": "joules", "_hertz": "hertz", "_volts": "volts"}


def unit_of(name):
    """Prometheus' naming conventions, as Vigil's receivers read them."""
    base = name[:-len("_total")] if name.endswith("_total") else name
    return next((u for suffix, u in UNITS.items() if base.endswith(suffix)), None)


def parse_exposition(text):
    """(name, labels, value, kind) of each sample of a text exposition."""
    kinds = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            kinds[name] = kind.strip()
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        labels = {}
        if rest:
            body = rest.rstrip("}")
            while body:
                key, _, body = body.partition('="')
                val, i = [], 0
                while body[i] != '"':
                    if body[i] == "\\":
                        i += 1
                        val.append({"n": "\n"}.get(body[i], body[i]))
                    else:
                        val.append(body[i])
                    i += 1
                labels[key.lstrip(",")] = "".join(val)
                body = body[i + 1:].lstrip(",")
        yield name, labels, float(value), kinds.get(name)


class Recorder:
    """Scrapes one exporter every `every` seconds into a JSON-lines file of metric events."""

    def __init__(self, url, path, every):
        self.url, self.every, self.out = url, every, open(path, "w")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        next_at = time.time()
        while not self.stop.is_set():
            ts = int(time.time() * 1000)
            try:
                text = get(self.url)
            except OSError:
                text = ""
            for name, labels, value, kind in parse_exposition(text):
                event = {"stream": "metric", "ts": ts, "host": "recorded", "name": name, "value": value}
                if labels:
                    event["labels"] = labels
                if kind in ("counter", "gauge"):
                    event["kind"] = kind
                if unit_of(name):
                    event["unit"] = unit_of(name)
                self.out.write(json.dumps(event) + "\n")
            next_at += self.every
            self.stop.wait(max(0.0, next_at - time.time()))

    def close(self):
        self.stop.set()
        self.thread.join()
        self.out.close()


def firing(url):
    """(alertname, host) of every firing alert at a Prometheus-shaped alerts endpoint."""
    try:
        alerts = json.loads(get(url))["data"]["alerts"]
    except (OSError, ValueError, KeyError):
        return set()
    out = set()
    for a in alerts:
        if a.get("state") != "firing":
            continue
        labels = a["labels"]
        host = labels.get("instance") or next((v for k, v in labels.items() if k.endswith("host")), "")
        out.add((labels.get("alertname", "?"), host))
    return out


class Watcher:
    """Notes when each (alertname, host) first fires in Vigil and in Prometheus."""

    def __init__(self, vigil, prometheus):
        self.urls = {"vigil": f"{vigil}/prometheus/api/v1/alerts", "prometheus": f"{prometheus}/api/v1/alerts"}
        self.first = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop.wait(2):
            now = time.time()
            for system, url in self.urls.items():
                for alertname, host in firing(url):
                    self.first.setdefault((alertname, host, system), now)

    def close(self):
        self.stop.set()
        self.thread.join()


def exporter(binary, port, exclude):
    return subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}",
         f"--collector.filesystem.mount-points-exclude={exclude}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fill(mount, fraction):
    """Fills a tmpfs to `fraction` of its bytes with one file, and of its inodes with empty ones."""
    st = os.statvfs(mount)
    with open(os.path.join(mount, "big"), "wb") as f:
        f.write(b"\0" * int(st.f_blocks * st.f_frsize * fraction))
    for i in range(int(st.f_files * fraction)):
        open(os.path.join(mount, f"f{i}"), "w").close()


def config(folder, healthy, own, vigil, mixin):
    targets = "".join(
        f"      - targets: ['127.0.0.1:{healthy}']\n        labels: {{instance: 'host-{i}'}}\n" for i in (1, 2, 3))
    targets += f"      - targets: ['127.0.0.1:{own}']\n        labels: {{instance: 'host-fs'}}\n"
    path = os.path.join(folder, "prometheus.yml")
    with open(path, "w") as f:
        f.write(f"global:\n  scrape_interval: 10s\n  scrape_timeout: 9s\n  evaluation_interval: 15s\n"
                f"rule_files: ['{mixin}']\n"
                f"scrape_configs:\n  - job_name: node\n    static_configs:\n{targets}"
                f"remote_write:\n  - url: {vigil}/api/v1/write\n    metadata_config:\n      send_interval: 10s\n")
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vigil")
    p.add_argument("--healthy-minutes", type=float, default=20)
    p.add_argument("--fork-minutes", type=float, default=4)
    p.add_argument("--fault-minutes", type=float, default=35)
    p.add_argument("--out", default=None)
    p.add_argument("--rules", default="rules")
    p.add_argument("--node-exporter", default="prometheus-node-exporter")
    p.add_argument("--prometheus", default="prometheus")
    args = p.parse_args()
    folder = args.out or tempfile.mkdtemp(prefix="vigil-faults-")
    os.makedirs(folder, exist_ok=True)
    mount = f"/mnt/vigil-fault-{os.getpid()}"
    os.makedirs(mount, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=2000", "tmpfs", mount], check=True)
    procs = []
    try:
        healthy_port, own_port, prom_port = (free_port() for _ in range(3))
        procs.append(exporter(args.node_exporter, healthy_port,
                              EXCLUDE_DEFAULT.replace("storage/.+", "storage/.+|mnt/vigil-fault-.+")))
        procs.append(exporter(args.node_exporter, own_port, EXCLUDE_DEFAULT))
        vigil, base = serve(args.vigil, args.rules, folder)
        procs.append(vigil)
        mixin = os.path.abspath("tests/data/node-mixin/alerts.yml")
        procs.append(subprocess.Popen(
            [args.prometheus, f"--config.file={config(folder, healthy_port, own_port, base, mixin)}",
             f"--storage.tsdb.path={folder}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        prom = f"http://127.0.0.1:{prom_port}"
        recorder = Recorder(f"http://127.0.0.1:{healthy_port}/metrics", os.path.join(folder, "record.jsonl"), 10)
        watcher = Watcher(base, prom)
        phases = [("healthy", time.time())]
        time.sleep(args.healthy_minutes * 60)

        phases.append(("fork", time.time()))
        subprocess.run(["nice", "-n", "19", "stress-ng", "--fork", "2", "--timeout", f"{int(args.fork_minutes * 60)}s"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        recorder.close()
        with open(os.path.join(folder, "record.json"), "w") as f:
            json.dump({"fork_start_ms": int(phases[1][1] * 1000), "fork_end_ms": int(time.time() * 1000)}, f)

        phases.append(("filesystem and CPU", time.time()))
        fill(mount, 0.98)
        cpu = subprocess.Popen(["nice", "-n", "19", "stress-ng", "--cpu", "0", "--cpu-load", "95", "--timeout", "1200s"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(cpu)
        time.sleep(args.fault_minutes * 60)
        watcher.close()
        failed = sum(float(line.rsplit(" ", 1)[1]) for line in get(f"{prom}/metrics").splitlines()
                     if line.startswith("prometheus_remote_storage_samples_failed_total"))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait()
        subprocess.run(["umount", mount], check=False)
        os.rmdir(mount)

    def phase_of(at):
        return max((p for p in phases if p[1] <= at), key=lambda p: p[1])

    print(f"folder: {folder}; Prometheus' failed samples: {failed:.0f}")
    print("| phase | alert | host | Vigil, after | Prometheus, after |")
    print("|---|---|---|---:|---:|")
    keys = sorted({(a, h) for a, h, _ in watcher.first}, key=lambda k: min(
        watcher.first.get((*k, s), float("inf")) for s in ("vigil", "prometheus")))
    for alertname, host in keys:
        times = [watcher.first.get((alertname, host, s)) for s in ("vigil", "prometheus")]
        name, start = phase_of(min(t for t in times if t))
        cells = [f"{t - start:.0f} s" if t else "-" for t in times]
        print(f"| {name} | {alertname} | {host} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
