"""Records what the collectors' clients send, for the rule tests of rules/tests/collectors.toml:

    python capture.py OUT_DIR

Two hosts report `cpu` (tag/attribute `cpu` = `cpu0`) every minute from 2026-01-01T00:00Z;
`web-2` stops after minute 10, `web-1` goes on to minute 40. InfluxData's client
(influxdb-client) writes them as line protocol and the OpenTelemetry SDK's OTLP/HTTP exporter
as protobuf, to a local HTTP server of this script that keeps each request's body:

- OUT_DIR/collectors_silent.lp: the line protocol bodies, as sent;
- OUT_DIR/collectors_silent.otlp.jsonl: each OTLP request in OTLP's JSON (protobuf's JSON
  mapping with enums as numbers, as the OTLP specification has it), one per line.
"""

import gzip
import json
import os
import sys
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otlp_export import metrics_data

START = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp())
bodies = {"influx": [], "otlp": []}


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path.startswith("/v1/metrics"):
            bodies["otlp"].append(body)
            answer = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        else:
            bodies["influx"].append(body)
            self.send_response(204)
            self.end_headers()

    def log_message(self, *args):
        pass


def samples():
    for minute in range(41):
        for host in ("web-1", "web-2"):
            if host == "web-2" and minute > 10:
                continue
            yield START + minute * 60, host, 10.0 + minute % 7


def main():
    out = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    with InfluxDBClient(url=url, token="t", org="ops") as client:
        write = client.write_api(write_options=SYNCHRONOUS)
        for ts, host, value in samples():
            # Nanoseconds, line protocol's default precision, so that the file replays as it is.
            point = Point("cpu").tag("host", host).tag("cpu", "cpu0").field("value", value)
            write.write(bucket="metrics", record=point.time(ts * 1_000_000_000, WritePrecision.NS))

    exporter = OTLPMetricExporter(endpoint=f"{url}/v1/metrics")
    by_time = {}
    for ts, host, value in samples():
        by_time.setdefault(ts, {}).setdefault(host, []).append(("cpu", value))
    for ts, hosts in by_time.items():
        exporter.export(metrics_data(hosts, ts * 1_000_000_000))
    exporter.shutdown()
    server.shutdown()

    with open(os.path.join(out, "collectors_silent.lp"), "wb") as f:
        for body in bodies["influx"]:
            f.write(body.rstrip(b"\n") + b"\n")
    with open(os.path.join(out, "collectors_silent.otlp.jsonl"), "w") as f:
        for body in bodies["otlp"]:
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            f.write(json.dumps(MessageToDict(request, use_integers_for_enums=True), separators=(",", ":")) + "\n")
    print(json.dumps({"influx": len(bodies["influx"]), "otlp": len(bodies["otlp"])}))


if __name__ == "__main__":
    main()
