"""Writes metric events to Vigil with OpenTelemetry's Prometheus remote-write exporter
(opentelemetry-exporter-prometheus-remote-write), as a service instrumented with the
OpenTelemetry SDK would, then a series without a host.

    python remote_write.py URL TOKEN EVENTS.jsonl

EVENTS.jsonl holds Vigil `metric` events (`ts` RFC 3339, `host`, `name`, `value`). The samples
of each timestamp are one export, as one scrape of a fleet is one remote-write request: a gauge
per metric name, one resource per host with the attribute `instance` = `HOST:9100` (the exporter
writes resource attributes as labels). The token goes as the basic-auth password. Prints one
JSON object: the samples exported, the exports that failed, and what the failed export of the
series without a host was told.
"""

import json
import logging
import sys

from opentelemetry.exporter.prometheus_remote_write import PrometheusRemoteWriteMetricsExporter
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from common import samples_by_time

SCOPE = InstrumentationScope("vigil-tests")


class Captured(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def metrics_data(samples, ns):
    """samples: {host: [(name, value)]} of one timestamp."""
    resources = []
    for host, values in samples.items():
        metrics = [
            Metric(name=name, description="", unit="",
                   data=Gauge(data_points=[NumberDataPoint(attributes={}, start_time_unix_nano=0,
                                                           time_unix_nano=ns, value=value)]))
            for name, value in values
        ]
        resources.append(ResourceMetrics(resource=Resource({"instance": f"{host}:9100"}),
                                         scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")],
                                         schema_url=""))
    return MetricsData(resource_metrics=resources)


def main():
    url, token, path = sys.argv[1:4]
    captured = Captured()
    logging.getLogger("opentelemetry.exporter.prometheus_remote_write").addHandler(captured)
    exporter = PrometheusRemoteWriteMetricsExporter(endpoint=f"{url}/api/v1/write",
                                                    basic_auth={"username": "prometheus", "password": token})
    order, by_time = samples_by_time(path)
    exported = failed = 0
    for ns in order:
        result = exporter.export(metrics_data(by_time[ns], ns))
        if result == MetricExportResult.SUCCESS:
            exported += sum(len(v) for v in by_time[ns].values())
        else:
            failed += 1
    before = len(captured.messages)
    no_host = MetricsData(resource_metrics=[ResourceMetrics(
        resource=Resource({"service.name": "checkout"}),
        scope_metrics=[ScopeMetrics(scope=SCOPE, schema_url="", metrics=[Metric(
            name="up", description="", unit="",
            data=Gauge(data_points=[NumberDataPoint(attributes={}, start_time_unix_nano=0,
                                                    time_unix_nano=order[0], value=1.0)]))])],
        schema_url="")])
    malformed = exporter.export(no_host)
    print(json.dumps({
        "exported": exported,
        "failed": failed,
        "malformed": {"success": malformed == MetricExportResult.SUCCESS, "log": captured.messages[before:]},
    }))


if __name__ == "__main__":
    main()
