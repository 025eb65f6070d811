"""A consumer group member in a process of its own, so that a nemesis can SIGKILL it as it would
an application: no close, no leave, no last commit.

In: on stdin, one JSON object a line: first the configuration `{"config": {librdkafka settings},
"pid_file": path}`, then commands `{"f": "subscribe", "topics": [...]}`, `{"f": "poll", "max":
n, "timeout": seconds}`, `{"f": "commit", "offsets": {key: offset}}`, `{"f": "committed",
"keys": [...], "timeout": seconds}`, `{"f": "ping"}`, `{"f": "close"}`. Out: on stdout, one JSON answer a line per
command: `{"records": [...], "rebalances": [...]}` for a poll (the rebalances its callbacks saw),
`{"offsets": {...}}` for committed, `{}` otherwise, or `{"error": text}`. The process writes its
pid to `pid_file` once it runs, and the keys the group gave it, after every change, to the same
name with `.keys` (a JSON list; the kill-consumer nemesis kills a member that holds some). It dies
with its parent (`workloads.child`): a harness killed with SIGKILL leaves no member behind.

Run as `python -m faultline.workloads.consumer_child`; `workloads.consume` starts and drives it.
"""

from __future__ import annotations

import json
import os

from confluent_kafka import Consumer, KafkaError, TopicPartition

from .child import serve, write_atomically
from .queue import fetched, rebalance_entry, record_of


def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _tp(key: str, offset: int | None = None) -> TopicPartition:
    topic, _, partition = key.rpartition("/")
    return TopicPartition(topic, int(partition)) if offset is None else TopicPartition(topic, int(partition), offset)


class Member:
    """The group member: its consumer, and the rebalances its callbacks saw since the last poll."""

    def __init__(self, setup: dict):
        self.consumer = Consumer(setup["config"])
        self.rebalances: list[dict] = []
        self.held: set[str] = set()
        self.keys_file = os.path.splitext(setup["pid_file"])[0] + ".keys" if setup.get("pid_file") else None

    def logged(self, kind: str):
        def callback(_consumer, partitions):
            entry = rebalance_entry(kind, partitions)
            self.rebalances.append(entry)
            # Assignments are incremental under cooperative and KIP-848 protocols, whole under eager
            # ones (revoked first): adding and removing serves both.
            self.held = self.held | set(entry["keys"]) if kind == "assigned" else self.held - set(entry["keys"])
            if self.keys_file:
                write_atomically(self.keys_file, json.dumps(sorted(self.held)))
        return callback


def handle(member: Member, cmd: dict) -> dict:
    consumer, f = member.consumer, cmd["f"]
    if f == "subscribe":
        consumer.subscribe(cmd["topics"], on_assign=member.logged("assigned"), on_revoke=member.logged("revoked"),
                           on_lost=member.logged("lost"))
        return {}
    if f == "poll":
        records, error = [], None
        for m in fetched(consumer, cmd["max"], cmd["timeout"]):
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    error = m.error().str()
                continue
            records.append(record_of(m))
        done = {"records": records, "rebalances": member.rebalances[:]}
        member.rebalances.clear()
        return {**done, "error": error} if error else done
    if f == "commit":
        consumer.commit(offsets=[_tp(k, o) for k, o in sorted(cmd["offsets"].items())], asynchronous=False)
        return {}
    if f == "committed":
        parts = consumer.committed([_tp(k) for k in cmd["keys"]], timeout=cmd["timeout"])
        return {"offsets": {_key(p.topic, p.partition): p.offset for p in parts
                            if p.offset is not None and p.offset >= 0}}
    if f == "close":
        consumer.close()
        return {}
    return {} if f == "ping" else {"error": f"unknown command {f!r}"}


if __name__ == "__main__":
    serve(Member, handle)
