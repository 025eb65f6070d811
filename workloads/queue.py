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

import dataclasses
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from .core import Workload
from .generator import PENDING, EachThread, fill, rng_state

Op = dict[str, Any]

LOG_START = 0

# librdkafka's own log lines (connection refused while a broker is down, ...) go here;
# the runner sends them to clients.log in the run's store folder.
LIBRDKAFKA_LOG = logging.getLogger("faultline.librdkafka")

# What a delivery report's error says of whether the broker wrote the message.
# Refused before anything was written, whatever came before: the message never left the client
# (_UNKNOWN_*, a purge of the queue), or a broker refusal that no attempt gets past and that
# librdkafka does not retry (a retry of an earlier, possibly written attempt would have been
# refused the same way).
NEVER_WRITTEN = {
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._PURGE_QUEUE,
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_REQUIRED_ACKS,
    KafkaError.INVALID_MSG,  # CORRUPT_MESSAGE: the CRC check refused it
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
}
# The last attempt was refused before the append, but librdkafka retries these: an earlier
# attempt that timed out may have been written. With idempotence a retry of a written batch is
# answered as a duplicate (success), so a final refusal means nothing was written; without it, or
# when it was the only attempt (retries=0), it is certain only in the second case.
REFUSED_BEFORE_APPEND = {
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
}
# Everything else is indeterminate: timeouts (_MSG_TIMED_OUT, REQUEST_TIMED_OUT, _TIMED_OUT),
# transport failures, a purge of messages in flight, NOT_ENOUGH_REPLICAS_AFTER_APPEND (written
# by the leader, not known to be replicated), fatal producer errors.


def certainly_not_written(code: int, idempotent: bool, retries: int) -> bool:
    """Whether a message whose delivery report carries this error code was certainly not written."""
    if code in NEVER_WRITTEN:
        return True
    return code in REFUSED_BEFORE_APPEND and (idempotent or retries == 0)


def send_completion(mops: list[Op], reports: list, remaining: int, idempotent: bool, retries: int) -> Op:
    """A send's completion from its delivery reports (one per mop: (error or None, offset), or None
    when none came) and the messages still queued: ok when every message was acknowledged, fail when
    none of them can have been written, info otherwise."""
    if remaining or any(r is None for r in reports):
        return {"type": "info", "mops": mops, "error": "no delivery report before the timeout"}
    errors = [err for err, _ in reports if err is not None]
    if not errors:
        return {"type": "ok", "mops": [dict(m, offset=(off if off is not None and off >= 0 else None))
                                       for m, (_, off) in zip(mops, reports)]}
    text = "; ".join(sorted({e.str() for e in errors}))
    if len(errors) == len(reports) and all(certainly_not_written(e.code(), idempotent, retries) for e in errors):
        return {"type": "fail", "mops": mops, "error": text}
    return {"type": "info", "mops": mops, "error": text}


def parse_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


@dataclass(frozen=True)
class QueueGenerator:
    """The operation stream of one worker, a generator value (`workloads.generator`): `assign`
    first and again after its process crashed, then sends, polls and the odd re-assign, each due a
    random delay (mean concurrency/rate) after the worker became free."""

    worker: int
    concurrency: int
    keys: tuple
    max_sends: int
    rate: float
    state: tuple  # the worker's random stream
    sent: int = 0
    assigned: bool = False

    @classmethod
    def start(cls, seed: int, worker: int, concurrency: int, keys: list[str], max_sends: int,
              rate: float) -> "QueueGenerator":
        return cls(worker, concurrency, tuple(keys), max_sends, rate, rng_state(f"{seed}/{worker}"))

    def _assign_op(self, rng: random.Random) -> Op:
        k = rng.randint(1, len(self.keys))
        keys = sorted(rng.sample(self.keys, k))
        return {"f": "assign", "keys": keys, "seek_to_beginning": rng.random() < 0.3}

    def op(self, ctx):
        thread = ctx.some_free_thread()
        if thread is None:
            return PENDING
        rng = random.Random()
        rng.setstate(self.state)
        sent, assigned = self.sent, True
        if not self.assigned:
            op = self._assign_op(rng)
        else:
            roll = rng.random()
            if roll < 0.5:
                n = rng.randint(1, self.max_sends)
                mops = []
                for _ in range(n):
                    # A value is unique in the whole run: n * concurrency + worker.
                    mops.append({"f": "send", "key": rng.choice(self.keys), "value": sent * self.concurrency + self.worker})
                    sent += 1
                op = {"f": "send", "mops": mops}
            elif roll < 0.92:
                op = {"f": "poll", "mops": [{"f": "poll"}]}
            else:
                op = self._assign_op(rng)
        delay = rng.uniform(0, 2 * self.concurrency / self.rate)
        op = fill({**op, "at": ctx.since(thread) + delay}, ctx, thread)
        return op, dataclasses.replace(self, state=rng.getstate(), sent=sent, assigned=assigned)

    def update(self, ctx, event):
        if event["type"] == "info":
            # The worker's client is reopened: it owns no keys until it assigns again.
            return dataclasses.replace(self, assigned=False)
        return self


@dataclass(frozen=True)
class FinalReads:
    """Jepsen's final reads, for one worker: assign every key from the beginning, learning from the
    broker where each key ends (`end_offsets` on the assign's completion), and poll until the
    consumer has read every key to that end. Then assign again without rewinding, to learn whether
    the ends moved meanwhile (a leader still bringing its followers up to date after the heal):
    done when they did not, otherwise poll on to the new ends. A crashed process starts over."""

    keys: tuple
    targets: Mapping[str, int] | None = None  # None: the next op is an assign from the beginning
    positions: Mapping[str, int] = field(default_factory=dict)
    rewind: bool = True
    done: bool = False
    backoff: float = 0.0  # seconds to wait after a failed assign, doubling up to RETRY_MAX

    RETRY_MAX = 2.0

    def _reached(self) -> bool:
        return self.targets is not None and all(self.positions.get(k, 0) >= end for k, end in self.targets.items())

    def op(self, ctx):
        if self.done:
            return None
        if self.targets is None or (self._reached() and not self.rewind):
            op = {"f": "assign", "keys": list(self.keys), "seek_to_beginning": self.rewind, "final": True}
        else:
            op = {"f": "poll", "mops": [{"f": "poll"}], "final": True}
        thread = ctx.some_free_thread()
        if thread is None:
            return PENDING
        return fill({**op, "at": ctx.since(thread) + self.backoff}, ctx, thread), self

    def update(self, ctx, event):
        if event["type"] == "invoke":
            return self
        if event["type"] == "info":
            return FinalReads(self.keys)
        if event["f"] == "assign":
            if event["type"] != "ok":
                return dataclasses.replace(self, backoff=min(self.RETRY_MAX, max(0.1, 2 * self.backoff)))
            ends = dict(event["end_offsets"])
            if not event.get("seek_to_beginning") and ends == dict(self.targets or {}):
                return dataclasses.replace(self, done=True)
            positions = {} if event.get("seek_to_beginning") else dict(self.positions)
            return dataclasses.replace(self, targets=ends, positions=positions, rewind=False, backoff=0.0)
        positions = dict(self.positions)
        for rec in event["mops"][0].get("records", []):
            positions[rec["key"]] = max(positions.get(rec["key"], 0), rec["offset"] + 1)
        return dataclasses.replace(self, positions=positions)


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
        self.idempotent = str(producer_settings.get("enable.idempotence", "false")).strip().lower() == "true"
        # librdkafka's default: retry (practically) forever within message.timeout.ms
        self.retries = int(producer_settings.get("retries", producer_settings.get("message.send.max.retries",
                                                                               2147483647)))

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
        return send_completion(op["mops"], results, remaining, self.idempotent, self.retries)

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
        if not op.get("final"):
            return {"type": "ok"}
        # A final read records where the logs end, so the check knows the whole final log.
        try:
            return {"type": "ok", "end_offsets": self.end_offsets(op["keys"])}
        except KafkaException as exc:
            return {"type": "fail", "error": f"the end offsets are unknown: {exc}"}

    def end_offsets(self, keys: list[str]) -> dict[str, int]:
        """Where each key's log ends for consumers now: its high watermark, asked of the broker
        (ListOffsets latest, not librdkafka's cache). Raises KafkaException when it cannot say."""
        ends = {}
        for topic in sorted({parse_key(k)[0] for k in keys}):
            # A new consumer knows no partition until it has the topic's metadata: without it the
            # query answers _UNKNOWN_PARTITION at once.
            self.consumer.list_topics(topic, timeout=5)
        for key in keys:
            topic, partition = parse_key(key)
            _, ends[key] = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5,
                                                               cached=False)
        return ends


def workload(spec) -> Workload:
    """The queue workload of a test spec: every worker assigns, sends and polls at the spec's rate,
    its stream drawn from the spec's seed; final reads of every key."""

    def client(bootstrap: str, process: int) -> QueueClient:
        return QueueClient(bootstrap, spec.producer, spec.consumer, group_id=f"faultline-{process}")

    def main(thread: int) -> QueueGenerator:
        return QueueGenerator.start(spec.seed, thread, spec.concurrency, spec.keys, spec.max_sends_per_op, spec.rate)

    return Workload(
        name="queue",
        generator=EachThread(main),
        final_generator=EachThread(lambda thread: FinalReads(tuple(spec.keys))),
        client=client,
        hints={"consumer_mode": "assign", "transactions": False},
    )
