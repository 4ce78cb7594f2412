"""Produces metric events to a Kafka topic in a collector's JSON, with Confluent's Python client
(confluent-kafka):

    python kafka_json_produce.py BROKERS TOPIC EVENTS.jsonl FORMAT

FORMAT `telegraf-json`: as Telegraf's Kafka output with `data_format = "json"` and
`use_batch_format = true`, the metrics of one timestamp in one message
`{"metrics": [{"name", "tags": {"host"}, "fields": {"value"}, "timestamp": seconds}]}`.
FORMAT `prometheus-kafka-adapter`: as prometheus-kafka-adapter writes what Prometheus
remote-writes to it, one sample per message `{"timestamp", "value": text, "name", "labels"}`
with the host in `instance` as `HOST:9100` and the event's own `labels` (`job`, say). All to partition 0, in order; then one message
without a host (Telegraf's `omit_hostname`; a recording rule's series). Prints one JSON object: how many messages and samples were produced.
"""

import json
import sys

from common import KafkaOut, nanoseconds


def main():
    brokers, topic, path, fmt = sys.argv[1:5]
    out = KafkaOut(brokers, topic)

    def produce(value):
        out.produce(json.dumps(value).encode())

    events = []
    with open(path) as f:
        for line in f:
            if line.strip():
                events.append(json.loads(line))
    messages = 0
    if fmt == "telegraf-json":
        batch, last = [], None
        for e in events:
            seconds = nanoseconds(e["ts"]) // 1_000_000_000
            if seconds != last and batch:
                produce({"metrics": batch})
                messages += 1
                batch = []
            last = seconds
            batch.append({"name": e["name"], "tags": {"host": e["host"]},
                          "fields": {"value": float(e["value"])}, "timestamp": seconds})
        produce({"metrics": batch})
        produce({"name": "cpu", "tags": {"dc": "eu"}, "fields": {"value": 1.0}, "timestamp": 1396310400})
        messages += 2
    else:
        for e in events:
            produce({"timestamp": e["ts"], "value": repr(float(e["value"])), "name": e["name"],
                     "labels": {**e.get("labels", {}), "__name__": e["name"], "instance": f'{e["host"]}:9100'}})
            messages += 1
        produce({"timestamp": events[0]["ts"], "value": "1", "name": "up", "labels": {"__name__": "up"}})
        messages += 1
    out.finish()
    print(json.dumps({"messages": messages, "samples": len(events)}))


if __name__ == "__main__":
    main()
