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
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from common import KafkaOut, samples_by_time
from otlp_export import delta_sum, metrics_data


def main():
    brokers, topic, path = sys.argv[1:4]
    out = KafkaOut(brokers, topic)
    order, by_time = samples_by_time(path)
    for ns in order:
        out.produce(encode_metrics(metrics_data(by_time[ns], ns)).SerializeToString())
    out.produce(encode_metrics(delta_sum(order[0])).SerializeToString())
    out.produce(b"\x0a\xff\xff\xff")
    out.finish()
    samples = sum(len(v) for hosts in by_time.values() for v in hosts.values())
    print(json.dumps({"messages": len(order) + 2, "samples": samples}))


if __name__ == "__main__":
    main()
