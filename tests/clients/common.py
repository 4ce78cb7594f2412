"""What the client scripts share: reading Vigil's metric events, and producing to Kafka."""

import json
import sys
from collections import defaultdict
from datetime import datetime

from confluent_kafka import Producer


def nanoseconds(ts):
    """An RFC 3339 time of whole seconds as epoch nanoseconds."""
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()) * 1_000_000_000


def samples_by_time(path):
    """The metric events of a JSON-lines file (`ts`, `host`, `name`, `value`) by time: the
    times in order of first appearance, and {ns: {host: [(name, value)]}}."""
    by_time = defaultdict(lambda: defaultdict(list))
    order = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            ns = nanoseconds(e["ts"])
            if ns not in by_time:
                order.append(ns)
            by_time[ns][e["host"]].append((e["name"], float(e["value"])))
    return order, by_time


class KafkaOut:
    """An idempotent producer to partition 0 of a topic, which fails the script if a delivery
    fails."""

    def __init__(self, brokers, topic):
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "linger.ms": 5})
        self.failures = []

    def _delivered(self, err, _msg):
        if err is not None:
            self.failures.append(str(err))

    def produce(self, value):
        self.producer.produce(self.topic, value=value, partition=0, on_delivery=self._delivered)
        self.producer.poll(0)

    def finish(self):
        self.producer.flush(30)
        if self.failures:
            sys.exit(f"deliveries failed: {self.failures[:3]}")
