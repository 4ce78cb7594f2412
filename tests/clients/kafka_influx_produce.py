"""Produces metric events to a Kafka topic as line protocol, as Telegraf's Kafka output does
with `data_format = "influx"` and `use_batch_format = true` (the lines of one flush in one
message), with Confluent's Python client (confluent-kafka, librdkafka underneath).

    python kafka_influx_produce.py BROKERS TOPIC EVENTS.jsonl

EVENTS.jsonl holds Vigil `metric` events (`ts` RFC 3339, `host`, `name`, `value`). The samples
of one timestamp make one message of lines `name,host=H value=V NS` (nanosecond timestamps,
Telegraf's default), all to partition 0, in order; then one message of two lines, the first
not line protocol. Prints one JSON object: how many messages and lines were produced.
"""

import json
import sys

from common import KafkaOut, nanoseconds


def main():
    brokers, topic, path = sys.argv[1:4]
    out = KafkaOut(brokers, topic)

    messages = lines = 0
    batch, last = [], None

    def flush_batch():
        nonlocal messages, batch
        if batch:
            out.produce("\n".join(batch).encode())
            messages += 1
            batch = []

    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            ns = nanoseconds(e["ts"])
            if ns != last:
                flush_batch()
                last = ns
            batch.append(f'{e["name"]},host={e["host"]} value={float(e["value"])!r} {ns}')
            lines += 1
    flush_batch()
    out.produce(b"cpu,host=eu value=abc 1396310400000000000\ncpu,host=late value=2 1396310400000000000")
    out.finish()
    print(json.dumps({"messages": messages + 1, "lines": lines}))


if __name__ == "__main__":
    main()
