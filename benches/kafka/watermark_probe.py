#!/usr/bin/env python3
"""Whether a broker's answer to a ListOffsets for the latest offset (the high watermark) is right,
with a plain librdkafka client (confluent-kafka).

    python3 benches/kafka/watermark_probe.py [BROKERS]

Produces 2,000 records into each of 12 partitions of a fresh topic, waits for the broker to take
them, asks the broker for each partition's watermarks, reads every partition from offset 0, and
prints what it asked and what the fetch responses said (librdkafka's cached watermarks). On
Tansu 0.6.0 the ListOffsets answer is far below 2,000 while every record can be read and the
fetch responses say 2,000 (RELIABILITY.md).
"""
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_topic import filled_topic  # noqa: E402

brokers = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
partitions, per = 12, 2000
topic = filled_topic(brokers, "watermark", partitions, per)
time.sleep(1)
consumer = Consumer({"bootstrap.servers": brokers, "group.id": "probe-" + uuid.uuid4().hex[:6],
                     "enable.auto.commit": False})
consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
read = {}
started = time.time()
while time.time() - started < 10 and sum(read.values()) < partitions * per:
    m = consumer.poll(0.2)
    if m is not None and m.error() is None:
        read[m.partition()] = read.get(m.partition(), 0) + 1
print("partition | records read | ListOffsets (low, high) | fetch responses (low, high)")
for p in range(partitions):
    tp = TopicPartition(topic, p)
    asked = consumer.get_watermark_offsets(tp, timeout=5)
    cached = consumer.get_watermark_offsets(tp, cached=True)
    print(f"{p} | {read.get(p, 0)} of {per} | {asked} | {cached}")
consumer.close()
