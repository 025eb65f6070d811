"""Jepsen's queue workload for Kafka-protocol brokers.

Generator. In: the seed, the worker's number, the keys. Out: an endless,
reproducible sequence of operations for that worker: `assign` (a random
subset of keys, sometimes rewinding to the beginning), `send` (1..N unique
integer values to random keys) and `poll`. Each worker draws from its own
random stream, so the same seed gives every worker the same sequence of
invocations whatever the timing. A value is unique in the whole run:
value = n * concurrency + worker.

Client. In: one operation (a history op's invocation fields). Out: its
completion (`ok`, `fail` or `info`, with offsets or records filled in),
performed through confluent-kafka (librdkafka) against the broker.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

Op = dict[str, Any]

LOG_START = 0

# librdkafka's own log lines (connection refused while a broker is down, ...) go here;
# the runner sends them to clients.log in the run's store folder.
LIBRDKAFKA_LOG = logging.getLogger("faultline.librdkafka")

# Errors after which librdkafka certainly did not write the message.
DEFINITE_FAILURES = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.INVALID_REQUIRED_ACKS,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.INVALID_MSG,  # CORRUPT_MESSAGE: the CRC check refused it
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
}


def parse_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


class QueueGenerator:
    """The operation stream of one worker."""

    def __init__(self, seed: int, worker: int, concurrency: int, keys: list[str], max_sends: int):
        self.rng = random.Random(f"{seed}/{worker}")
        self.worker = worker
        self.concurrency = concurrency
        self.keys = keys
        self.max_sends = max_sends
        self.sent = 0
        self.assigned = False

    def next_value(self) -> int:
        value = self.sent * self.concurrency + self.worker
        self.sent += 1
        return value

    def assign_op(self) -> Op:
        k = self.rng.randint(1, len(self.keys))
        keys = sorted(self.rng.sample(self.keys, k))
        return {"f": "assign", "keys": keys, "seek_to_beginning": self.rng.random() < 0.3}

    def next_op(self) -> Op:
        if not self.assigned:
            self.assigned = True
            return self.assign_op()
        roll = self.rng.random()
        if roll < 0.5:
            n = self.rng.randint(1, self.max_sends)
            mops = [{"f": "send", "key": self.rng.choice(self.keys), "value": self.next_value()} for _ in range(n)]
            return {"f": "send", "mops": mops}
        if roll < 0.92:
            return {"f": "poll", "mops": [{"f": "poll"}]}
        return self.assign_op()

    def crashed(self) -> None:
        """The worker's client was reopened: it owns no keys until it assigns again."""
        self.assigned = False

    def delay(self, rate: float) -> float:
        """Seconds to wait before the next operation: mean concurrency/rate, jittered."""
        return self.rng.uniform(0, 2 * self.concurrency / rate)


class QueueClient:
    """One worker's producer and consumer, opened and reopened as Jepsen's client is."""

    def __init__(self, bootstrap: str, producer_settings: dict[str, str], consumer_settings: dict[str, str],
                 group_id: str, poll_timeout: float = 0.1, max_poll_records: int = 500):
        self.bootstrap = bootstrap
        self.producer_settings = producer_settings
        self.consumer_settings = consumer_settings
        self.group_id = group_id
        self.poll_timeout = poll_timeout
        self.max_poll_records = max_poll_records
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.assignment: list[str] = []
        self.positions: dict[str, int] = {}
        self.send_timeout = int(producer_settings.get("message.timeout.ms", 5000)) / 1000 + 5

    def open(self) -> None:
        self.producer = Producer({"bootstrap.servers": self.bootstrap, **self.producer_settings},
                                 logger=LIBRDKAFKA_LOG)
        self.consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group_id,
                                  **self.consumer_settings}, logger=LIBRDKAFKA_LOG)
        self.assignment = []
        self.positions = {}

    def close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close()
            except (KafkaException, RuntimeError):
                pass
        if self.producer is not None:
            self.producer.purge()
            self.producer.flush(0)
        self.producer = self.consumer = None

    def invoke(self, op: Op) -> Op:
        """Perform `op`; return the completion fields (type, and results)."""
        f = op["f"]
        if f == "send":
            return self._send(op)
        if f == "poll":
            return self._poll(op)
        if f == "assign":
            return self._assign(op)
        raise ValueError(f"the queue client cannot perform {f!r}")

    def _send(self, op: Op) -> Op:
        results: list[tuple[KafkaError | None, int | None]] = [None] * len(op["mops"])  # type: ignore[list-item]

        def report(i: int):
            def delivered(err, msg):
                results[i] = (err, None if err else msg.offset())
            return delivered

        try:
            for i, mop in enumerate(op["mops"]):
                topic, partition = parse_key(mop["key"])
                self.producer.produce(topic, str(mop["value"]).encode(), partition=partition,
                                      on_delivery=report(i))
        except (BufferError, KafkaException) as exc:
            # Nothing queued after the one that raised; those queued may still go out.
            self.producer.flush(self.send_timeout)
            if all(r is None for r in results):
                return {"type": "fail", "mops": op["mops"], "error": f"produce refused: {exc}"}
            return {"type": "info", "mops": op["mops"], "error": f"produce refused part way: {exc}"}
        remaining = self.producer.flush(self.send_timeout)
        errors = [r[0] for r in results if r is not None and r[0] is not None]
        if remaining or any(r is None for r in results):
            return {"type": "info", "mops": op["mops"], "error": "no delivery report before the timeout"}
        if not errors:
            mops = [dict(m, offset=(off if off is not None and off >= 0 else None))
                    for m, (_, off) in zip(op["mops"], results)]
            return {"type": "ok", "mops": mops}
        text = "; ".join(sorted({e.str() for e in errors}))
        if len(errors) == len(results) and all(e.code() in DEFINITE_FAILURES for e in errors):
            return {"type": "fail", "mops": op["mops"], "error": text}
        return {"type": "info", "mops": op["mops"], "error": text}

    def _poll(self, op: Op) -> Op:
        if not self.assignment:
            return {"type": "fail", "mops": [{"f": "poll", "records": []}], "error": "no keys assigned"}
        records = []
        error = None
        try:
            messages = self.consumer.consume(self.max_poll_records, self.poll_timeout)
        except (KafkaException, RuntimeError) as exc:
            return {"type": "fail", "mops": [{"f": "poll", "records": []}], "error": str(exc)}
        for m in messages:
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    error = m.error().str()
                continue
            try:
                value = int(m.value())
            except (TypeError, ValueError):
                value = -1  # not ours: shows up as unexpected
            key = f"{m.topic()}/{m.partition()}"
            records.append({"key": key, "offset": m.offset(), "value": value})
            self.positions[key] = m.offset() + 1
        # librdkafka's per-partition errors are informational (it recovers by
        # itself), and the consumer's position has moved past every record it
        # returned: a poll that returned records happened, whatever else it said.
        if error is None or records:
            completion = {"type": "ok", "mops": [{"f": "poll", "records": records}]}
            if error:
                completion["warning"] = error
            return completion
        return {"type": "fail", "mops": [{"f": "poll", "records": records}], "error": error}

    def _assign(self, op: Op) -> Op:
        partitions = []
        for key in op["keys"]:
            topic, partition = parse_key(key)
            # The client keeps its own positions rather than committing them to a group, so
            # an assign needs no group coordinator: a key read before resumes where it was.
            if op.get("seek_to_beginning"):
                self.positions.pop(key, None)
            # "From the beginning" is offset 0, not the logical OFFSET_BEGINNING: librdkafka (2.16)
            # resolves a logical start by ListOffsets, and when a later assign makes an answer
            # outdated it queries the logical start again half a second on, even after the
            # partition has moved to a concrete offset, rewinding the consumer to 0 in the middle
            # of a poll (tests/test_queue_client.py). A log that no longer starts at 0 answers
            # OFFSET_OUT_OF_RANGE, and auto.offset.reset=earliest moves the consumer to its start.
            offset = self.positions.get(key, LOG_START)
            partitions.append(TopicPartition(topic, partition, offset))
        try:
            self.consumer.assign(partitions)
        except (KafkaException, RuntimeError) as exc:
            return {"type": "fail", "error": str(exc)}
        self.assignment = list(op["keys"])
        return {"type": "ok"}

    def caught_up(self, positions: dict[str, int]) -> bool:
        """True when, for every assigned key, the consumer is at the high watermark."""
        for key in self.assignment:
            topic, partition = parse_key(key)
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=2,
                                                              cached=False)
            except KafkaException:
                return False
            if positions.get(key, 0) < high:
                return False
        return True


def final_read(client: QueueClient, invoke, keys: list[str], deadline: float) -> bool:
    """Jepsen's final reads: assign every key from the beginning and poll until
    the consumer has reached every key's high watermark (or the deadline).
    `invoke(op)` records and performs one operation, returning its completion.
    Returns whether the reads caught up."""
    done = invoke({"f": "assign", "keys": list(keys), "seek_to_beginning": True})
    if done["type"] != "ok":
        return False
    positions: dict[str, int] = {}
    while time.monotonic() < deadline:
        done = invoke({"f": "poll", "mops": [{"f": "poll"}]})
        if done["type"] == "info":
            return False
        for rec in done["mops"][0].get("records", []):
            positions[rec["key"]] = max(positions.get(rec["key"], 0), rec["offset"] + 1)
        if not done["mops"][0].get("records") and client.caught_up(positions):
            return True
    return False
