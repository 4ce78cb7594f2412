#!/usr/bin/env python3
"""What a consumer in a group reads of the partitions it keeps through a rebalance, with a plain
librdkafka client (confluent-kafka): cooperative-sticky, session.timeout.ms 6000, 12 partitions.

    python3 benches/kafka/handover_probe.py [BROKERS]

Produces 2,000 records into each of 12 partitions. Member A reads them slowly (0.5 ms a
record), committing every second; after 4 s member B joins and takes half the partitions. Each
member reads what it is assigned from the beginning. After 25 s both leave, and the probe prints
the offsets of each partition that neither member read. A broker that answers a fetch from any
offset leaves none; on Tansu 0.6.0 a partition that A kept through the rebalance stops, or skips
a range, at the offset where librdkafka fetched it again (RELIABILITY.md).
"""
import os
import sys
import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_topic import filled_topic  # noqa: E402

brokers = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
partitions, per = 12, 2000
topic = filled_topic(brokers, "handover", partitions, per)
group = "probe-" + uuid.uuid4().hex[:6]


class Member:
    def __init__(self, name):
        self.name = name
        self.consumer = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False,
                                  "partition.assignment.strategy": "cooperative-sticky",
                                  "session.timeout.ms": 6000, "auto.offset.reset": "earliest",
                                  "client.id": name})
        self.next = {}
        self.seen = {}
        self.stop = False

    def on_assign(self, consumer, assigned):
        for p in assigned:
            p.offset = OFFSET_BEGINNING

    def on_revoke(self, consumer, revoked):
        done = [TopicPartition(topic, p.partition, self.next[p.partition]) for p in revoked if p.partition in self.next]
        if done:
            consumer.commit(offsets=done, asynchronous=False)
        for p in revoked:
            self.next.pop(p.partition, None)

    def run(self):
        self.consumer.subscribe([topic], on_assign=self.on_assign, on_revoke=self.on_revoke)
        committed = time.time()
        while not self.stop:
            m = self.consumer.poll(0.1)
            if m is not None and m.error() is None:
                self.next[m.partition()] = m.offset() + 1
                self.seen.setdefault(m.partition(), set()).add(m.offset())
                time.sleep(0.0005)
            if time.time() - committed > 1 and self.next:
                self.consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in self.next.items()],
                                     asynchronous=True)
                committed = time.time()
        self.consumer.close()


a, b = Member("A"), Member("B")
threads = [threading.Thread(target=a.run)]
threads[0].start()
time.sleep(4)
threads.append(threading.Thread(target=b.run))
threads[1].start()
time.sleep(25)
a.stop = b.stop = True
for t in threads:
    t.join()
unread = 0
for p in range(partitions):
    seen = a.seen.get(p, set()) | b.seen.get(p, set())
    missing = sorted(set(range(per)) - seen)
    unread += len(missing)
    if missing:
        print(f"partition {p}: {len(missing)} offsets never read, {missing[0]} to {missing[-1]}; "
              f"A read {len(a.seen.get(p, ()))}, B read {len(b.seen.get(p, ()))}")
print(f"{unread} of {partitions * per} offsets never read")
