#!/usr/bin/env python3
"""Whether a broker answers a fetch that starts inside a record batch, with a plain librdkafka
client (confluent-kafka).

    python3 benches/kafka/mid_batch_probe.py [BROKERS]

Produces 1,000 records into a fresh one-partition topic, batched by the producer (linger 50 ms),
then reads them from offsets 0, 1, 500 and 999 with a fresh consumer each. Apache Kafka answers
every start (the client drops the records before it); Tansu 0.6.0 answers only the batch's
first offset (RELIABILITY.md).
"""
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

brokers = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
topic = "mid-batch-" + uuid.uuid4().hex[:8]
admin = AdminClient({"bootstrap.servers": brokers})
admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
producer = Producer({"bootstrap.servers": brokers, "linger.ms": 50})
for i in range(1000):
    producer.produce(topic, value=f"m{i}".encode(), partition=0)
producer.flush()
for start in [0, 1, 500, 999]:
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "probe-" + uuid.uuid4().hex[:6],
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, start)])
    got = []
    started = time.time()
    while time.time() - started < 5 and len(got) < 1000 - start:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.offset())
    print(f"from offset {start}: {len(got)} of {1000 - start} records in 5 s")
    consumer.close()
