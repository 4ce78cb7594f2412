"""A fresh topic filled with numbered records, for the broker probes of this folder."""
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def filled_topic(brokers, prefix, partitions, per):
    """Creates `prefix-<random>` with `partitions` partitions, produces `per` records into each
    (batched by the producer, linger 20 ms), waits until the broker has them, returns the name."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": brokers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    producer = Producer({"bootstrap.servers": brokers, "linger.ms": 20})
    for i in range(partitions * per):
        producer.produce(topic, value=f"m{i}".encode(), partition=i % partitions)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush()
    return topic
