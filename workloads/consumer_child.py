"""A consumer group member in a process of its own, so that a nemesis can SIGKILL it as it would
an application: no close, no leave, no last commit.

In: on stdin, one JSON object a line: first the configuration `{"config": {librdkafka settings},
"pid_file": path}`, then commands `{"f": "subscribe", "topics": [...]}`, `{"f": "poll", "max":
n, "timeout": seconds}`, `{"f": "commit", "offsets": {key: offset}}`, `{"f": "committed",
"keys": [...], "timeout": seconds}`, `{"f": "ping"}`, `{"f": "close"}`. Out: on stdout, one JSON answer a line per
command: `{"records": [...], "rebalances": [...]}` for a poll (the rebalances its callbacks saw),
`{"offsets": {...}}` for committed, `{}` otherwise, or `{"error": text}`. The process writes its
pid to `pid_file` once it runs, and dies with its parent (`workloads.child`): a harness killed
with SIGKILL leaves no member behind.

Run as `python -m faultline.workloads.consumer_child`; `workloads.consume` starts and drives it.
"""

from __future__ import annotations

import json
import sys

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from .child import become_child
from .queue import rebalance_entry, record_of

def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _tp(key: str, offset: int | None = None) -> TopicPartition:
    topic, _, partition = key.rpartition("/")
    return TopicPartition(topic, int(partition)) if offset is None else TopicPartition(topic, int(partition), offset)


def main() -> None:
    out = sys.stdout
    setup = json.loads(sys.stdin.readline())
    become_child(setup.get("pid_file"))
    consumer = Consumer(setup["config"])
    rebalances: list[dict] = []

    def logged(kind: str):
        def callback(_consumer, partitions):
            rebalances.append(rebalance_entry(kind, partitions))
        return callback

    def answer(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in sys.stdin:
        cmd = json.loads(line)
        f = cmd["f"]
        try:
            if f == "subscribe":
                consumer.subscribe(cmd["topics"], on_assign=logged("assigned"), on_revoke=logged("revoked"),
                                   on_lost=logged("lost"))
                answer({})
            elif f == "poll":
                records, error = [], None
                for m in consumer.consume(cmd["max"], cmd["timeout"]):
                    if m.error() is not None:
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            error = m.error().str()
                        continue
                    records.append(record_of(m))
                done = {"records": records, "rebalances": rebalances[:]}
                rebalances.clear()
                if error:
                    done["error"] = error
                answer(done)
            elif f == "commit":
                consumer.commit(offsets=[_tp(k, o) for k, o in sorted(cmd["offsets"].items())], asynchronous=False)
                answer({})
            elif f == "committed":
                parts = consumer.committed([_tp(k) for k in cmd["keys"]], timeout=cmd["timeout"])
                answer({"offsets": {_key(p.topic, p.partition): p.offset for p in parts
                                    if p.offset is not None and p.offset >= 0}})
            elif f == "ping":
                answer({})
            elif f == "close":
                consumer.close()
                answer({})
                return
            else:
                answer({"error": f"unknown command {f!r}"})
        except (KafkaException, RuntimeError) as exc:
            answer({"error": str(exc)})


if __name__ == "__main__":
    main()
