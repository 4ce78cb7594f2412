#!/usr/bin/env python3
"""Azure V1's 100-VM CPU trace as Vigil metric events (JSON lines, in time order), for
`vigil bench --input`: two series per VM (`avg_cpu`, `max_cpu`), one sample each 5 minutes,
1.6 million events in all.

    python3 benches/azure_events.py ../shared/data/azure_v1/azure_v1_100vms_cpu_long.csv.gz azure.jsonl
"""
import csv
import gzip
import json
import sys
from datetime import datetime, timezone


def main(src, dst):
    rows = []
    with gzip.open(src, "rt") as f:
        for r in csv.DictReader(f):
            rows.append((int(r["t_offset_s"]), r["vm_id"], r["avg_cpu"], r["max_cpu"]))
    rows.sort(key=lambda r: (r[0], r[1]))
    with open(dst, "w") as out:
        for t, vm, avg, peak in rows:
            ts = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            for name, value in (("avg_cpu", avg), ("max_cpu", peak)):
                out.write(json.dumps({"stream": "metric", "ts": ts, "host": vm, "name": name, "value": float(value)}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
