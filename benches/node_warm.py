#!/usr/bin/env python3
"""A day of real node_exporter history in Prometheus, a warm start, then a real rate anomaly live:
judged from the first minute?

    python3 benches/node_warm.py VIGIL_BINARY [--record DIR] [--hosts 3] [--hours 24]
        [--step 150] [--raw-hours 1] [--live-minutes 40] [--fork-minute 6]
        [--prometheus prometheus] [--promtool promtool] [--cold]

DIR holds `record.jsonl.gz` (or `record.jsonl`): every scrape of Debian's node_exporter, 10 s
apart, 20 minutes healthy and then 4 under `stress-ng --fork` (`benches/node_faults.py` wrote
it), and `record.json`, when the fork started. The healthy part is laid end to end for
`--hours` (counters carried on so that they keep climbing, each host starting at another point
of the recording, as `benches/node_day.py` does), one value per `--step` seconds, ending 40
minutes ago: written as OpenMetrics with each host's `instance`, turned into TSDB blocks by
`promtool` and served by Prometheus. `vigil serve` (SQLite in a fresh folder, `rules/metrics`)
starts with `--warm-from-prometheus` over a day, at `--step` but for the last `--raw-hours`
before the handover, read raw. Then the 40 minutes after it come
live, every scrape 10 s apart, posted as Vigil's JSON events (each sample's `kind` from its
name, as a remote-write receiver sets it without metadata): the healthy hosts carry on, and
`host-0` runs the recorded fork from `--fork-minute`. With `--cold`, the same without the warm
start.

Prints the warm start's duration, the alerts on `host-0` after the fork began (caught, and
after how long) and every other alert (false).
"""
import argparse
import calendar
import collections
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet import serve  # noqa: E402
from warm import serve_history  # noqa: E402

COUNTING = ("_total", "_count", "_sum", "_bucket")
SCRAPE_MS = 10_000


def load(folder):
    """The recording's scrapes in time order, [(ts, {(name, labels json): event})], and when the
    fork started."""
    path = os.path.join(folder, "record.jsonl.gz")
    opener = gzip.open if os.path.exists(path) else open
    path = path if os.path.exists(path) else os.path.join(folder, "record.jsonl")
    scrapes = collections.OrderedDict()
    with opener(path, "rt") as f:
        for line in f:
            e = json.loads(line)
            key = (e["name"], json.dumps(e.get("labels", {}), sort_keys=True))
            scrapes.setdefault(e["ts"], {})[key] = e
    with open(os.path.join(folder, "record.json")) as f:
        fork = json.load(f)["fork_start_ms"]
    return list(scrapes.items()), fork


class Host:
    """One host's scrapes, tick by tick (10 s apart): the recording's scrape `r` at each tick,
    counters carried on. Where `r` is not the recorded successor of the last one (a pass laid
    after another, the fork spliced in), each counter gains its mean step instead of the jump."""

    def __init__(self, scrapes, step_gain):
        self.scrapes, self.step_gain = scrapes, step_gain
        self.last_r, self.values = None, {}

    def next(self, r):
        sample = self.scrapes[r][1]
        out = {}
        for key, e in sample.items():
            if key in self.step_gain and key in self.values:
                before = self.scrapes[self.last_r][1].get(key)
                if r == self.last_r + 1 and before is not None and e["value"] >= before["value"]:
                    out[key] = self.values[key] + (e["value"] - before["value"])
                else:
                    out[key] = self.values[key] + self.step_gain[key]
            else:
                out[key] = e["value"]
        self.last_r, self.values = r, out
        return out


def step_gains(healthy):
    """Each counter's mean gain per scrape over the healthy recording."""
    first, last = healthy[0][1], healthy[-1][1]
    return {key: (e["value"] - first[key]["value"]) / max(1, len(healthy) - 1)
            for key, e in last.items() if key[0].endswith(COUNTING) and key in first}


def ticks(scrapes, n_healthy, hosts, first_tick, last_tick, fork_from):
    """(tick, [values of each host]) from `first_tick` to `last_tick`: host `h` starts the healthy
    recording at its `h`-th share; host 0 runs the fork (the recording after the healthy part)
    from `fork_from`."""
    gains = step_gains(scrapes[:n_healthy])
    state = [Host(scrapes, gains) for _ in range(hosts)]
    n_fault = len(scrapes) - n_healthy
    for t in range(first_tick, last_tick + 1):
        row = []
        for h, host in enumerate(state):
            if h == 0 and fork_from <= t < fork_from + n_fault:
                r = n_healthy + t - fork_from
            else:
                r = (t - first_tick + h * n_healthy // hosts) % n_healthy
            row.append(host.next(r))
        yield t, row


def labels_text(h, labels):
    pairs = [("instance", f"host-{h}:9100"), ("job", "node")] + sorted(json.loads(labels).items())
    escape = lambda v: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)


def write_history(path, keys, rows, hosts):
    """OpenMetrics text of `rows` [(tick, [values per host])], each family's samples together."""
    by_family = collections.defaultdict(list)
    for key in keys:
        by_family[key[0]].append(key)
    with open(path, "w") as f:
        for family, members in by_family.items():
            f.write(f"# TYPE {family} unknown\n")
            for h in range(hosts):
                for key in members:
                    head = f"{family}{{{labels_text(h, key[1])}}}"
                    for t, values in rows:
                        if key in values[h]:
                            f.write(f"{head} {values[h][key]!r} {t * SCRAPE_MS / 1000:.3f}\n")
        f.write("# EOF\n")
    return len(rows) * hosts * len(keys)


def post(url, lines):
    request = urllib.request.Request(url + "/api/v1/events", data="\n".join(lines).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as r:
        answer = json.loads(r.read())
    if answer.get("rejected_total"):
        sys.exit(f"events refused: {answer}")
    return answer


def alerts(url):
    with urllib.request.urlopen(url + "/api/v1/alerts?limit=1000", timeout=30) as r:
        return json.loads(r.read())["alerts"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("vigil")
    p.add_argument("--record", default=os.path.join(os.path.dirname(__file__), "../tests/data/node"))
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--hours", type=float, default=24)
    p.add_argument("--step", type=int, default=150)
    p.add_argument("--live-minutes", type=int, default=40)
    p.add_argument("--fork-minute", type=int, default=6)
    p.add_argument("--prometheus", default="prometheus")
    p.add_argument("--promtool", default="promtool")
    p.add_argument("--rules", default="rules/metrics")
    p.add_argument("--cold", action="store_true")
    p.add_argument("--raw-hours", type=float, default=1, help="the history before the handover read raw")
    args = p.parse_args()
    scrapes, fork_ms = load(args.record)
    n_healthy = sum(1 for s in scrapes if s[0] < fork_ms)
    live_ticks = args.live_minutes * 6
    now_tick = int(time.time() * 1000) // SCRAPE_MS
    # Two hours before now: a feed whose newest event is within an hour of the clock is live, and
    # its event time moves on by the clock whenever it pauses (`service/idle.rs`); these 40
    # minutes are posted as fast as they go, not as they happened.
    end_tick = now_tick - 720
    first_tick = end_tick - int(args.hours * 360)
    fork_from = end_tick + 1 + args.fork_minute * 6
    work = tempfile.mkdtemp(prefix="vigil-node-warm-")
    started = time.time()
    every = max(1, args.step // 10)
    # Every scrape before the handover that the warm start reads raw (the rest at the step,
    # to keep the text small); `--warm-raw` counts from now, two hours after the handover.
    raw_ticks = int(args.raw_hours * 360)
    stream = ticks(scrapes, n_healthy, args.hosts, first_tick, end_tick + live_ticks, fork_from)
    history, live = [], []
    for t, values in stream:
        if t <= end_tick:
            # Prometheus keeps every scrape; an hour of them here (what the warm start reads
            # raw by default), the rest at the step it reads, to keep the text small.
            if (t - first_tick) % every == 0 or t > end_tick - raw_ticks:
                history.append((t, values))
        else:
            live.append((t, values))
    keys = sorted(scrapes[0][1])
    samples = write_history(os.path.join(work, "history.om"), keys, history, args.hosts)
    made = subprocess.run([args.promtool, "tsdb", "create-blocks-from", "openmetrics",
                           os.path.join(work, "history.om"), os.path.join(work, "tsdb")], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit(f"promtool: {made.stderr}")
    print(f"history: {samples:,} samples ({args.hosts} hosts x {len(keys)} series, {args.hours} h at "
          f"{args.step} s) in {time.time() - started:.0f} s")
    prom, prom_url = serve_history(args.prometheus, work, os.path.join(work, "tsdb"))
    extra = [] if args.cold else ["--warm-from-prometheus", prom_url, "--warm-lookback", f"{int(args.hours * 60) + 180}min",
                                  "--warm-step", f"{args.step}s", "--warm-raw", f"{int(args.raw_hours * 60) + 120}min", "--warm-match", '{job="node"}']
    folder = os.path.join(work, "vigil")
    os.makedirs(folder)
    started = time.time()
    vigil, url = serve(args.vigil, args.rules, folder, extra)
    log = open(os.path.join(folder, "vigil.log")).read()
    print(f"vigil ready in {time.time() - started:.1f} s: "
          + next((l for l in log.splitlines() if "warm start done" in l), "no warm start"))
    taken = [0, 0]
    try:
        for minute in range(args.live_minutes):
            lines = []
            for t, values in live[minute * 6:(minute + 1) * 6]:
                for h in range(args.hosts):
                    for (name, labels), value in values[h].items():
                        e = {"stream": "metric", "ts": t * SCRAPE_MS, "host": f"host-{h}", "name": name,
                             "value": value, "labels": dict(json.loads(labels), job="node")}
                        if name.endswith(COUNTING):
                            e["kind"] = "counter"
                        lines.append(json.dumps(e, separators=(",", ":")))
            answer = post(url, lines)
            if minute == 0:
                # Restarted with state (here, the history's), the service holds event time for
                # `--source-idle-after` (10 s) while the senders are heard from: a live feed goes
                # on meanwhile, these minutes wait for it to pass.
                time.sleep(11)
            taken[0] += answer.get("accepted", 0)
            taken[1] += answer.get("late", 0)
        time.sleep(5)
        print(f"live: {taken[0]:,} samples taken, {taken[1]:,} of them late")
        fork_at = fork_from * SCRAPE_MS
        caught, false = [], []
        for a in alerts(url):
            if a["status"] != "firing" and a.get("rule") is None:
                continue
            host = next((v for k, v in a["key"].items() if k.endswith("host")), "")
            name = a.get("values", {}).get("s.name", "")
            # When it fired (a roll-up's start reaches back to its host's first series alert).
            with urllib.request.urlopen(f"{url}/api/v1/alerts/{a['id']}", timeout=30) as r:
                detail = json.loads(r.read())
            fired = min(t["time"] for t in detail["transitions"] if t["status"] == "firing")
            at_ms = int(calendar.timegm(time.strptime(fired[:19], "%Y-%m-%dT%H:%M:%S")) * 1000)
            row = (a["rule"], a["severity"], host, name, (at_ms - fork_at) / 1000)
            (caught if host == "host-0" and at_ms >= fork_at else false).append(row)
        print("| alert | severity | host | series | after the fork began |")
        print("|---|---|---|---|---:|")
        for rule, severity, host, name, after in sorted(caught, key=lambda r: r[4]):
            print(f"| {rule} | {severity} | {host} | {name} | {after:.0f} s |")
        print(f"false alerts (another host, or before the fork): {len(false)}")
        for rule, severity, host, name, after in false:
            print(f"  {rule} {severity} {host} {name} at {after:+.0f} s")
    finally:
        vigil.terminate()
        prom.terminate()
        vigil.wait()
        prom.wait()


if __name__ == "__main__":
    main()
