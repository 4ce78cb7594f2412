"""Produces metric events to a Kafka topic as OTLP protobuf, as the OpenTelemetry Collector's
Kafka exporter does with `encoding: otlp_proto` (one ExportMetricsServiceRequest per message),
with Confluent's Python client (confluent-kafka) and the OpenTelemetry SDK's OTLP encoder.

    python kafka_otlp_produce.py BROKERS TOPIC EVENTS.jsonl

EVENTS.jsonl holds Vigil `metric` events (`ts` RFC 3339, `host`, `name`, `value`). The samples
of one timestamp make one message (gauges and cumulative sums, as otlp_export.py builds them),
all to partition 0, in order; then a message holding a delta sum and one that is not protobuf.
Prints one JSON object: how many messages and samples were produced.
"""

import json
import sys
from collections import defaultdict
from datetime import datetime

from confluent_kafka import Producer
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource

from otlp_export import SCOPE, metrics_data, point


def main():
    brokers, topic, path = sys.argv[1:4]
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "linger.ms": 5})
    failures = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    def produce(value):
        producer.produce(topic, value=value, partition=0, on_delivery=delivered)
        producer.poll(0)

    by_time = defaultdict(lambda: defaultdict(list))
    order = []
    samples = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            ns = int(datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()) * 1_000_000_000
            if ns not in by_time:
                order.append(ns)
            by_time[ns][e["host"]].append((e["name"], float(e["value"])))
            samples += 1
    for ns in order:
        produce(encode_metrics(metrics_data(by_time[ns], ns)).SerializeToString())
    delta = MetricsData(resource_metrics=[ResourceMetrics(
        resource=Resource({"host.name": "delta-host"}),
        scope_metrics=[ScopeMetrics(scope=SCOPE, schema_url="", metrics=[Metric(
            name="requests", description="", unit="",
            data=Sum(data_points=[point(order[0], 3.0)],
                     aggregation_temporality=AggregationTemporality.DELTA, is_monotonic=True))])],
        schema_url="")])
    produce(encode_metrics(delta).SerializeToString())
    produce(b"\x0a\xff\xff\xff")
    producer.flush(30)
    if failures:
        sys.exit(f"deliveries failed: {failures[:3]}")
    print(json.dumps({"messages": len(order) + 2, "samples": samples}))


if __name__ == "__main__":
    main()
