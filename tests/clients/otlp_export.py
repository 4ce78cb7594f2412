"""Writes metric events to Vigil with the OpenTelemetry Python SDK's OTLP/HTTP metric exporter
(opentelemetry-exporter-otlp-proto-http, protobuf, gzip), as an instrumented service would,
then two requests the receiver must refuse in part or in whole.

    python otlp_export.py URL TOKEN EVENTS.jsonl

EVENTS.jsonl holds Vigil `metric` events (`ts` RFC 3339, `host`, `name`, `value`). The samples
of each timestamp are one export, one resource per host with the attribute `host.name`; a
metric whose name sorts first among a host's is a gauge, the others cumulative non-monotonic
sums (an UpDownCounter's points), so that both reach the receiver. The token goes as a bearer
token. Prints one JSON object: the samples exported, the exports that failed, what a delta sum
was answered (200 with a partial success) and what a body that is not protobuf was answered
(400 with a google.rpc.Status).
"""

import json
import sys

import requests
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from common import samples_by_time

SCOPE = InstrumentationScope("vigil-tests")


def point(ns, value):
    return NumberDataPoint(attributes={}, start_time_unix_nano=0, time_unix_nano=ns, value=value)


def metrics_data(samples, ns):
    """samples: {host: [(name, value)]} of one timestamp."""
    resources = []
    for host, values in samples.items():
        metrics = []
        for i, (name, value) in enumerate(sorted(values)):
            if i == 0:
                data = Gauge(data_points=[point(ns, value)])
            else:
                data = Sum(data_points=[point(ns, value)],
                           aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=False)
            metrics.append(Metric(name=name, description="", unit="", data=data))
        resources.append(ResourceMetrics(resource=Resource({"host.name": host, "service.name": "fleet"}),
                                         scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")],
                                         schema_url=""))
    return MetricsData(resource_metrics=resources)


def delta_sum(ns):
    """A monotonic sum of delta temporality, which Vigil refuses with the reason."""
    return MetricsData(resource_metrics=[ResourceMetrics(
        resource=Resource({"host.name": "delta-host"}),
        scope_metrics=[ScopeMetrics(scope=SCOPE, schema_url="", metrics=[Metric(
            name="requests", description="", unit="",
            data=Sum(data_points=[point(ns, 3.0)],
                     aggregation_temporality=AggregationTemporality.DELTA, is_monotonic=True))])],
        schema_url="")])


def main():
    url, token, path = sys.argv[1:4]
    headers = {"Authorization": f"Bearer {token}"}
    exporter = OTLPMetricExporter(endpoint=f"{url}/v1/metrics", headers=headers, compression=Compression.Gzip)
    order, by_time = samples_by_time(path)
    exported = failed = 0
    for ns in order:
        result = exporter.export(metrics_data(by_time[ns], ns))
        if result == MetricExportResult.SUCCESS:
            exported += sum(len(v) for v in by_time[ns].values())
        else:
            failed += 1
    exporter.shutdown()

    protobuf = {**headers, "Content-Type": "application/x-protobuf"}
    delta = delta_sum(order[0])
    answer = requests.post(f"{url}/v1/metrics", data=encode_metrics(delta).SerializeToString(), headers=protobuf)
    response = ExportMetricsServiceResponse()
    response.ParseFromString(answer.content)
    garbage = requests.post(f"{url}/v1/metrics", data=b"\x0a\xff\xff\xff", headers=protobuf)
    status = Status()
    status.ParseFromString(garbage.content)
    print(json.dumps({
        "exported": exported,
        "failed": failed,
        "delta": {
            "status": answer.status_code,
            "rejected_data_points": response.partial_success.rejected_data_points,
            "error_message": response.partial_success.error_message,
        },
        "malformed": {"status": garbage.status_code, "code": status.code, "message": status.message},
    }))


if __name__ == "__main__":
    main()
