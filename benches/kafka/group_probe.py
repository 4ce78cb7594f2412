#!/usr/bin/env python3
"""How a Kafka broker's consumer-group protocol behaves, seen by a plain librdkafka client
(confluent-kafka), before Vigil builds its scale-out on it (issue 21, docs/scaling.md).

Each scenario runs member processes in one group over a 12-partition topic and prints what
each member owned over time, from its own assign / revoke / lost callbacks:

  join      one member, then a second joins: how the partitions are split
  kill      two members, one is killed with SIGKILL: how long until the survivor owns all
  stop      two members, one is stopped (SIGSTOP) past the session timeout, then resumed:
            whether it is told its partitions were lost, and how the group settles
  static    two members with group.instance.id (static membership): whether the group settles

    python3 -m venv venv && venv/bin/pip install confluent-kafka
    venv/bin/python benches/kafka/group_probe.py 127.0.0.1:9092 join|kill|stop|static \\
        [--strategy cooperative-sticky|range]

Results on Tansu 0.6.0 are in RELIABILITY.md ("The broker's group protocol").
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

PARTITIONS = 12
SESSION_MS = 6000


def member(args):
    """One group member: subscribes, polls, and prints every change of what it owns."""
    from confluent_kafka import Consumer

    owned = set()
    started = time.time()

    def say(event, parts):
        print(json.dumps({"member": args.name, "event": event, "t": round(time.time() - started, 2),
                          "partitions": sorted(parts), "owned": sorted(owned)}), flush=True)

    def on_assign(consumer, partitions):
        got = {p.partition for p in partitions}
        owned.update(got)
        if args.strategy == "cooperative-sticky":
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        say("assign", got)

    def on_revoke(consumer, partitions):
        gone = {p.partition for p in partitions}
        owned.difference_update(gone)
        if args.strategy == "cooperative-sticky":
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        say("revoke", gone)

    def on_lost(consumer, partitions):
        gone = {p.partition for p in partitions}
        owned.difference_update(gone)
        say("lost", gone)

    config = {
        "bootstrap.servers": args.brokers,
        "group.id": args.group,
        "partition.assignment.strategy": args.strategy,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 1000,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    if args.static:
        config["group.instance.id"] = args.name
    consumer = Consumer(config)
    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    while True:
        consumer.poll(0.2)


def create_topic(brokers, topic):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": brokers})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)


class Group:
    """Member processes and what each owns, read from their output."""

    def __init__(self, args, topic, group):
        self.args, self.topic, self.group = args, topic, group
        self.members, self.owned, self.events = {}, {}, []
        self.lock = threading.Lock()
        self.t0 = time.time()

    def start(self, name, static=False):
        cmd = [sys.executable, __file__, self.args.brokers, "member", "--name", name, "--topic", self.topic,
               "--group", self.group, "--strategy", self.args.strategy] + (["--static"] if static else [])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.members[name] = p
        self.owned[name] = set()
        threading.Thread(target=self._read, args=(name, p), daemon=True).start()

    def _read(self, name, p):
        for line in p.stdout:
            e = json.loads(line)
            with self.lock:
                self.owned[name] = set(e["owned"])
                e["at"] = round(time.time() - self.t0, 2)
                self.events.append(e)
            print(f"  {e['at']:7.2f}s {name} {e['event']} {e['partitions']} -> owns {len(e['owned'])}", flush=True)

    def counts(self):
        with self.lock:
            return {n: len(o) for n, o in self.owned.items()}

    def until(self, check, timeout):
        """Seconds until `check(counts)` holds, or None after `timeout`."""
        start = time.time()
        while time.time() - start < timeout:
            if check(self.counts()):
                return round(time.time() - start, 2)
            time.sleep(0.1)
        return None

    def stop_all(self):
        for p in self.members.values():
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except ProcessLookupError:
                pass


def scenario(args):
    run = uuid.uuid4().hex[:8]
    topic, group = f"probe-{run}", f"probe-{args.scenario}-{run}"
    create_topic(args.brokers, topic)
    g = Group(args, topic, group)
    result = {"scenario": args.scenario, "strategy": args.strategy, "partitions": PARTITIONS,
              "session_timeout_ms": SESSION_MS}
    try:
        static = args.scenario == "static"
        g.start("a", static)
        result["first_owns_all_s"] = g.until(lambda c: c["a"] == PARTITIONS, 60)
        g.start("b", static)
        settled = g.until(lambda c: c["a"] + c["b"] == PARTITIONS and min(c.values()) > 0, 60)
        result["second_joined_settled_s"] = settled
        time.sleep(5)
        result["after_join"] = g.counts()
        if args.scenario == "kill":
            g.members["b"].kill()
            result["survivor_owns_all_s"] = g.until(lambda c: c["a"] == PARTITIONS, 60)
        elif args.scenario == "stop":
            g.members["b"].send_signal(signal.SIGSTOP)
            result["survivor_owns_all_s"] = g.until(lambda c: c["a"] == PARTITIONS, 60)
            time.sleep(2)
            g.members["b"].send_signal(signal.SIGCONT)
            result["resumed_settled_s"] = g.until(lambda c: c["a"] + c["b"] == PARTITIONS and c["b"] > 0, 60)
            time.sleep(5)
            result["stopped_member_told_lost"] = any(e["member"] == "b" and e["event"] == "lost" for e in g.events)
        elif args.scenario == "static":
            time.sleep(20)
            with g.lock:
                result["assign_and_revoke_events"] = len(g.events)
        result["final"] = g.counts()
    finally:
        g.stop_all()
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("brokers")
    parser.add_argument("scenario", choices=["join", "kill", "stop", "static", "member"])
    parser.add_argument("--strategy", default="cooperative-sticky", choices=["cooperative-sticky", "range"])
    parser.add_argument("--name")
    parser.add_argument("--topic")
    parser.add_argument("--group")
    parser.add_argument("--static", action="store_true")
    args = parser.parse_args()
    if args.scenario == "member":
        member(args)
    else:
        scenario(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
