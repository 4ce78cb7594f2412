"""Writes metric events to Vigil with InfluxData's own Python client (influxdb-client), as an
application that writes to InfluxDB 2 would, then a malformed line.

    python influx_write.py URL TOKEN EVENTS.jsonl

EVENTS.jsonl holds Vigil `metric` events (`ts` RFC 3339, `host`, `name`, `value`): each is
written as a point of measurement `name`, tag `host` and field `value`, in millisecond
precision, in order, in batches of whole timestamps as a collector flushes whole intervals
(a timestamp split over two requests a second apart would find its first part released by
the service's idle clock, and the rest late). Prints one JSON object: how many points were written, and the
status and message the malformed line got.
"""

import json
import sys
from datetime import datetime

from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

BATCH = 5000


def points(path):
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            ts = datetime.fromisoformat(e["ts"].replace("Z", "+00:00"))
            ms = int(ts.timestamp() * 1000)
            yield ms, Point(e["name"]).tag("host", e["host"]).field("value", float(e["value"])).time(ms, WritePrecision.MS)


def main():
    url, token, path = sys.argv[1:4]
    written = 0
    with InfluxDBClient(url=url, token=token, org="ops") as client:
        write = client.write_api(write_options=SYNCHRONOUS)
        batch, last = [], None
        for ms, p in points(path):
            if len(batch) >= BATCH and ms != last:
                write.write(bucket="metrics", record=batch, write_precision=WritePrecision.MS)
                written += len(batch)
                batch = []
            batch.append(p)
            last = ms
        if batch:
            write.write(bucket="metrics", record=batch, write_precision=WritePrecision.MS)
            written += len(batch)
        try:
            write.write(bucket="metrics", record="cpu,host=eu value=abc 1396310400000", write_precision=WritePrecision.MS)
            malformed = {"status": 204, "message": ""}
        except ApiException as e:
            malformed = {"status": e.status, "message": json.loads(e.body).get("message", "")}
    print(json.dumps({"written": written, "malformed": malformed}))


if __name__ == "__main__":
    main()
