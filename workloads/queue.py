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
performed through confluent-kafka (librdkafka) against the broker. A send's
outcome, and each of its messages', comes from one table (SEND_OUTCOMES) of
what librdkafka can report; an acknowledged offset is always recorded, even
when the operation as a whole is indeterminate.

Final reads (`FinalReads`): a crash for fresh clients, an assign of every key
from the beginning with the broker's end offsets, polls to those ends (a final
poll records where its consumer found a key's end, `positions`, which passes
transaction markers it never returns), and a closing `final-reads` record of
how each key ended, also when time runs out.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ..models.spec import WORKLOADS
from .core import Workload
from .generator import PENDING, EachThread, fill, resume, rng_state

Op = dict[str, Any]

LOG_START = 0
# Seconds a final assign may spend asking the broker where the keys end.
END_OFFSETS_TIME = 10.0

# librdkafka's own log lines (connection refused while a broker is down, ...) go here;
# the runner sends them to clients.log in the run's store folder.
LIBRDKAFKA_LOG = logging.getLogger("faultline.librdkafka")

# What the client learned of one message of a send says whether the broker wrote it. One table,
# SEND_OUTCOMES, maps each thing the workload can see to the send's outcome (history-format.md,
# Completion types): `ok` (acknowledged: written), `fail` (no attempt of it can have been written)
# or `info` (it may have been written, now or later). The rows are keyed by librdkafka's error code
# (KafkaError.NO_ERROR for an acknowledgement) or, for messages that got no delivery report, by
# NO_REPORT, NOT_QUEUED and NOT_SENT.
#
# A refusal says only that the attempt it answers was not written. librdkafka retries a message
# (up to `retries`) after a timeout, a broken connection and most refusals; an attempt that timed
# out in flight may have been written, and a later attempt can still be refused: the broker checks
# the ISR, the leadership and the CRC before it recognises a retry as a duplicate (as Kafka does),
# so not even idempotence makes a final refusal certain. The client cannot see whether an earlier
# attempt timed out in flight (librdkafka's message status is not exposed to Python), so a refusal
# is `fail` only when the send had a single attempt (retries=0), and `info` whenever librdkafka may
# have retried it.

NO_REPORT = "no-report"
NOT_QUEUED = "not-queued"
NOT_SENT = "not-sent"


@dataclass(frozen=True)
class SendOutcome:
    """A row of SEND_OUTCOMES: the outcome of a message when the send had a single attempt
    (retries=0), the outcome when librdkafka may have retried it (retries > 0), and why."""

    one_attempt: str
    retried: str
    reason: str

    def type(self, retries: int) -> str:
        return self.one_attempt if retries == 0 else self.retried


def _refused(what: str) -> SendOutcome:
    return SendOutcome("fail", "info", f"{what}: this attempt was refused before the append, but an earlier "
                                       f"attempt that timed out in flight may have been written")


def _maybe_written(what: str) -> SendOutcome:
    return SendOutcome("info", "info", what)


E = KafkaError
SEND_OUTCOMES: dict[int | str, SendOutcome] = {
    # Acknowledged.
    E.NO_ERROR: SendOutcome("ok", "ok", "acknowledged: the broker wrote it at the offset it reported"),
    E.DUPLICATE_SEQUENCE_NUMBER: SendOutcome(
        "ok", "ok", "the broker already holds this batch from an earlier attempt (librdkafka reports it as "
                    "delivered, without an offset)"),
    # No delivery report, or never handed to librdkafka.
    NO_REPORT: _maybe_written("no delivery report before the timeout: it may be in flight or written"),
    NOT_QUEUED: SendOutcome("fail", "fail", "produce() refused it: it never left the client"),
    NOT_SENT: SendOutcome("fail", "fail", "not produced: produce() refused an earlier message of the operation"),
    # Refused by the client itself: certain only if it was never sent before (a retried message goes
    # back to the queue, where these can still befall it).
    E._UNKNOWN_PARTITION: _refused("the client knows no such partition"),
    E._UNKNOWN_TOPIC: _refused("the client knows no such topic"),
    E._PURGE_QUEUE: _refused("purged from the client's queue"),
    E._TIMED_OUT_QUEUE: _refused("timed out in the client's queue"),
    # Refused by the broker before the append.
    E.NOT_ENOUGH_REPLICAS: _refused("the ISR is smaller than min.insync.replicas"),
    E.NOT_LEADER_FOR_PARTITION: _refused("the broker does not lead the partition"),
    E.LEADER_NOT_AVAILABLE: _refused("the partition has no leader"),
    E.UNKNOWN_TOPIC_OR_PART: _refused("the broker knows no such partition"),
    E.FENCED_LEADER_EPOCH: _refused("the broker's leader epoch is newer"),
    E.UNKNOWN_LEADER_EPOCH: _refused("the broker's leader epoch is older"),
    E.INVALID_MSG: _refused("CORRUPT_MESSAGE: the CRC check refused it (librdkafka retries it)"),
    E.MSG_SIZE_TOO_LARGE: _refused("the batch is larger than the broker takes (a retry may batch differently)"),
    E.RECORD_LIST_TOO_LARGE: _refused("the batch is larger than a segment"),
    E.INVALID_RECORD: _refused("a record of the batch failed the broker's validation"),
    E.INVALID_TIMESTAMP: _refused("the timestamp is out of range"),
    E.TOPIC_AUTHORIZATION_FAILED: _refused("not authorised to write the topic"),
    E.CLUSTER_AUTHORIZATION_FAILED: _refused("not authorised to produce idempotently"),
    E.OUT_OF_ORDER_SEQUENCE_NUMBER: _refused("the sequence number leaves a gap"),
    E.UNKNOWN_PRODUCER_ID: _refused("the broker knows no state of this producer"),
    E.INVALID_PRODUCER_EPOCH: _refused("the producer's epoch is old"),
    E.PRODUCER_FENCED: _refused("a newer producer fenced this one"),
    E.INVALID_TXN_STATE: _refused("the transaction is in the wrong state"),
    E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: _refused("not authorised for the transactional id"),
    E.UNSUPPORTED_FOR_MESSAGE_FORMAT: _refused("the broker's message format does not support it"),
    E.UNSUPPORTED_VERSION: _refused("the broker does not support the request version"),
    E.POLICY_VIOLATION: _refused("a broker policy refused it"),
    E.THROTTLING_QUOTA_EXCEEDED: _refused("throttled"),
    # The same refusal for every attempt, decided before any append: the producer's acks setting.
    E.INVALID_REQUIRED_ACKS: SendOutcome("fail", "fail", "the broker refuses the producer's acks setting, for "
                                                         "every attempt alike, before any append"),
    # Maybe written.
    E._MSG_TIMED_OUT: _maybe_written("message.timeout.ms passed: an attempt may be in flight or written"),
    E._TIMED_OUT: _maybe_written("the request timed out in flight"),
    E.REQUEST_TIMED_OUT: _maybe_written("the broker appended it and timed out waiting for its replicas"),
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND: _maybe_written("written by the leader; the ISR shrank below "
                                                       "min.insync.replicas before it was replicated"),
    E._TRANSPORT: _maybe_written("the connection broke with the request in flight"),
    E.NETWORK_EXCEPTION: _maybe_written("the broker disconnected before it answered"),
    E._PURGE_INFLIGHT: _maybe_written("purged while in flight"),
    E._DESTROY: _maybe_written("the producer was closed with it queued or in flight"),
    E._ALL_BROKERS_DOWN: _maybe_written("every broker connection is down"),
    E._FAIL: _maybe_written("the connection to the broker failed"),
    E.KAFKA_STORAGE_ERROR: _maybe_written("a disk error on the broker: the append may be partial"),
    E._FATAL: _maybe_written("a fatal producer error: its idempotence state is lost"),
    E._FENCED: _maybe_written("the producer was fenced"),
    E._INCONSISTENT: _maybe_written("librdkafka's idempotence state is inconsistent"),
    E._GAPLESS_GUARANTEE: _maybe_written("librdkafka stopped to keep the ordering gap-less"),
    E.UNKNOWN: _maybe_written("an unknown broker error"),
}
del E
# Any code the table does not name.
UNLISTED = _maybe_written("an error this table does not name: whether it was written is unknown")


@dataclass(frozen=True)
class Report:
    """What the client learned of one message: `row`, the key of its SEND_OUTCOMES row (an error
    code, or one of NO_REPORT, NOT_QUEUED, NOT_SENT); the offset of an acknowledgement; the error's
    text."""

    row: int | str
    offset: int | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return {"row": self.row, "offset": self.offset, "detail": self.detail}

    @classmethod
    def from_json(cls, r: dict) -> "Report":
        return cls(r["row"], r.get("offset"), r.get("detail") or "")

    @classmethod
    def delivered(cls, err: KafkaError | None, offset: int | None) -> "Report":
        if err is None:
            return cls(KafkaError.NO_ERROR, offset)
        return cls(err.code(), None, err.str())


def send_outcome(report: "Report | None") -> SendOutcome:
    return SEND_OUTCOMES.get(NO_REPORT if report is None else report.row, UNLISTED)


def kafka_error(exc: BaseException) -> KafkaError:
    """The KafkaError behind an exception a confluent-kafka call raised: a KafkaException's own, or
    the one that caused a SystemError. A producer's fatal error (an idempotent producer's sequence
    desynchronised from the broker's) is set as a pending exception in the middle of a poll, so the
    next delivery callback of that poll fails with a SystemError caused by it. A SystemError with no
    KafkaError behind it (confluent-kafka can lose the pending error: "returned NULL without setting
    an exception") leaves the client's state unknown, so it is taken as a fatal error. Re-raises
    any other exception."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, KafkaException) and cause.args and isinstance(cause.args[0], KafkaError):
            return cause.args[0]
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, SystemError):
        return KafkaError(KafkaError._FATAL, f"confluent-kafka lost the client's error, which librdkafka's FATAL "
                                             f"line in the clients' log says: {exc}", fatal=True)
    raise exc


def produce_all(producer: Producer, mops: list[Op], timeout: float) -> "tuple[list[Report | None], str | None]":
    """Produce each send mop, in order, and wait up to `timeout` seconds for their delivery reports.
    Returns one Report per mop (None for those still queued or in flight, indeterminate) and, when
    the producer failed for good during the send (a fatal error: it sends nothing more), why."""
    reports: list[Report | None] = [None] * len(mops)
    fatal: str | None = None
    deadline = time.monotonic() + timeout

    def report(i: int):
        def delivered(err, msg):
            reports[i] = Report.delivered(err, None if err else msg.offset())
        return delivered

    for i, mop in enumerate(mops):
        topic, partition = parse_key(mop["key"])
        try:
            producer.produce(topic, str(mop["value"]).encode(), partition=partition, on_delivery=report(i))
        except (BufferError, KafkaException) as exc:
            # Never queued, and nothing after it is produced; those queued may still go out.
            reports[i] = Report(NOT_QUEUED, detail=f"produce() refused it: {exc or type(exc).__name__}")
            reports[i + 1:] = [Report(NOT_SENT) for _ in mops[i + 1:]]
            err = kafka_error(exc) if isinstance(exc, KafkaException) else None
            if err is not None and err.code() == KafkaError._FATAL:
                fatal = err.str()
            break
    # A fatal error ends the flush that meets it, and the delivery callback that runs while it is
    # pending loses its report (that message stays None: indeterminate); a second flush delivers
    # the reports of what the first left queued.
    for _ in range(2):
        try:
            producer.flush(max(0.0, deadline - time.monotonic()))
            break
        except (KafkaException, SystemError) as exc:
            err = kafka_error(exc)
            if not err.fatal():
                raise
            fatal = err.str()
    return reports, fatal


def send_completion(mops: list[Op], reports: "list[Report | None]", retries: int, fatal: str | None = None) -> Op:
    """A send's completion from what the client learned of each message (`reports`, one per mop;
    None: no delivery report came). Every mop keeps its outcome: an acknowledged one its `offset`
    (null when the broker gave none, as with acks=0), the others `offset: null` and `error`. The
    operation is ok when every message was acknowledged, fail when none can have been written, info
    otherwise: a partly acknowledged send is info with the acknowledged offsets kept. When the
    producer failed for good during the send (`fatal`: why), it is info whatever its messages' fates,
    so that its process ends and the next one opens a new producer, as an application must."""
    out, types, errors = [], set(), []
    for mop, report in zip(mops, reports):
        outcome = send_outcome(report)
        kind = outcome.type(retries)
        types.add(kind)
        if kind == "ok":
            offset = report.offset if report is not None else None
            out.append(dict(mop, offset=offset if offset is not None and offset >= 0 else None))
            continue
        if report is None and fatal:
            error = "no delivery report: the producer failed for good before it gave one; it may be written"
        else:
            error = report.detail if report is not None and report.detail else outcome.reason
        out.append(dict(mop, offset=None, error=error))
        errors.append(error)
    if fatal:
        errors.append(f"the producer failed for good ({fatal}): its process ends")
        return {"type": "info", "mops": out, "error": "; ".join(sorted(set(errors)))}
    if types == {"ok"}:
        return {"type": "ok", "mops": out}
    kind = "fail" if types == {"fail"} else "info"
    return {"type": kind, "mops": out, "error": "; ".join(sorted(set(errors)))}


# A transaction's commit (for a transactional workload): committed, certainly not (the transaction
# must be aborted: nothing it wrote becomes visible to read_committed consumers), or unknown (a
# commit that timed out or failed in flight may still complete).
def commit_outcome(err: KafkaError | None) -> tuple[str, str]:
    """(ok / fail / info, why) of `commit_transaction()` given the error it raised (None: none)."""
    if err is None:
        return "ok", "committed"
    if err.txn_requires_abort():
        return "fail", "the transaction must be aborted: nothing it wrote is committed"
    if err.code() in (KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT):
        return "info", "the commit timed out: it may still complete"
    return "info", "the commit failed in flight: it may have completed"


def record_of(m) -> dict:
    """A consumed librdkafka message as a history record; a value that is not one of ours (not an
    integer) is -1, which the check reports as unexpected."""
    try:
        value = int(m.value())
    except (TypeError, ValueError):
        value = -1
    return {"key": f"{m.topic()}/{m.partition()}", "offset": m.offset(), "value": value}


def rebalance_entry(kind: str, partitions) -> dict:
    """A `rebalance_log` entry: what the group did (`assigned`, `revoked`, `lost`) with which keys."""
    return {"type": kind, "keys": sorted(f"{p.topic}/{p.partition}" for p in partitions)}


def fetched(consumer: Consumer, limit: int, timeout: float) -> list:
    """One poll, as the Java consumer's poll(timeout) does it: back as soon as anything has been
    fetched, with what else is already there, up to `limit` messages (events such as partition
    EOF included). librdkafka's consume(n, timeout) waits for n messages or the whole timeout,
    which idled a worker for the poll timeout on every poll."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *(consumer.consume(limit - 1, 0) if limit > 1 else [])]


def parse_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


@dataclass(frozen=True)
class QueueGenerator:
    """The operation stream of one worker, a generator value (`workloads.generator`): `assign`
    first and again after its process crashed, then sends, polls and the odd re-assign. Each is
    due a random delay (mean concurrency/rate) after the one before was due, or as soon as the
    worker is free when it is late: the worker keeps the asked rate as long as its operations take
    less than that mean, and goes back to back when they take longer (never in a burst that
    makes up for lost time)."""

    worker: int
    concurrency: int
    keys: tuple
    max_sends: int
    rate: float
    state: tuple  # the worker's random stream
    sent: int = 0
    assigned: bool = False
    txn: bool = False  # each operation after the assign a transaction of 1-4 sends and polls
    subscribe: bool = False  # group membership (subscribe, and the odd crash) instead of assign
    # An application that retries: after a send whose outcome it never learned (info, the process
    # ended), the successor's first send is of the values not acknowledged, again (`resend`).
    resend: bool = False
    unsent: tuple = ()  # the values to send again
    due: float | None = None  # when the previous operation was due

    TXN_MOPS = 4
    # Under subscribe: the share of operations that end the process, its consumer leaving the group
    # and its successor joining it: each a rebalance.
    CRASH_P = 0.02

    @classmethod
    def start(cls, seed: int, worker: int, concurrency: int, keys: list[str], max_sends: int,
              rate: float, txn: bool = False, subscribe: bool = False, resend: bool = False) -> "QueueGenerator":
        return cls(worker, concurrency, tuple(keys), max_sends, rate, rng_state(f"{seed}/{worker}"), txn=txn,
                   subscribe=subscribe, resend=resend)

    def _send_mop(self, rng: random.Random, sent: int) -> Op:
        # A value is unique in the whole run: n * concurrency + worker.
        return {"f": "send", "key": rng.choice(self.keys), "value": sent * self.concurrency + self.worker}

    def _assign_op(self, rng: random.Random) -> Op:
        k = rng.randint(1, len(self.keys))
        keys = sorted(rng.sample(self.keys, k))
        if self.subscribe:
            return {"f": "subscribe", "keys": keys}
        return {"f": "assign", "keys": keys, "seek_to_beginning": rng.random() < 0.3}

    def op(self, ctx):
        thread = ctx.some_free_thread()
        if thread is None:
            return PENDING
        rng = resume(self.state)
        sent, assigned, unsent = self.sent, True, self.unsent
        if not self.assigned:
            op = self._assign_op(rng)
        elif unsent:
            op, unsent = {"f": "send", "mops": [dict(m) for m in unsent]}, ()
        elif self.subscribe and rng.random() < self.CRASH_P:
            op = {"f": "crash"}
        else:
            roll = rng.random()
            if self.txn and roll < 0.92:
                # Jepsen's transactional queue: 1-4 micro-operations, each a send or a poll.
                mops = []
                for _ in range(rng.randint(1, self.TXN_MOPS)):
                    if rng.random() < 0.5:
                        mops.append(self._send_mop(rng, sent))
                        sent += 1
                    else:
                        mops.append({"f": "poll"})
                op = {"f": "txn", "mops": mops}
            elif roll < 0.5:
                mops = []
                for _ in range(rng.randint(1, self.max_sends)):
                    mops.append(self._send_mop(rng, sent))
                    sent += 1
                op = {"f": "send", "mops": mops}
            elif roll < 0.92:
                op = {"f": "poll", "mops": [{"f": "poll"}]}
            else:
                op = self._assign_op(rng)
        delay = rng.uniform(0, 2 * self.concurrency / self.rate)
        free = ctx.since(thread)
        due = free + delay if self.due is None else max(free, self.due + delay)
        op = fill({**op, "at": due}, ctx, thread)
        return op, dataclasses.replace(self, state=rng.getstate(), sent=sent, assigned=assigned, unsent=unsent,
                                       due=due)

    def update(self, ctx, event):
        if event["type"] == "info":
            # The worker's client is reopened: it owns no keys until it assigns again.
            unsent = self.unsent
            if self.resend and event["f"] == "send":
                unsent += tuple({"f": "send", "key": m["key"], "value": m["value"]}
                                for m in event.get("mops") or [] if m.get("offset") is None)
            return dataclasses.replace(self, assigned=False, unsent=unsent)
        return self


@dataclass(frozen=True)
class PollUnseen:
    """Jepsen's poll-unseen, around the main phase's generator of every worker: consumers are
    steered to the keys holding acknowledged values that no poll has returned yet.

    It follows every completion: the highest acknowledged offset per key (a send's, of any
    outcome, since an acknowledgement is one whatever became of the rest of its operation; a
    transaction's only when it committed, since an aborted one's records are never read) and the
    highest offset a poll returned. A key whose acknowledged offsets run past what was polled is
    unseen. About one assign in three (drawn from a stream of its own, so the same completions
    give the same invocations) also takes every unseen key it lacks, and names those it added in
    `unseen`: per key, the highest offset polled (-1: none) and acknowledged. The keys the worker's
    own stream drew are then `keys` without those: what the seed fixes, whatever the timing. A
    reader of the history knows why the assign named the others; the checker ignores the field.
    Without this, a value acknowledged on a key no worker happened to own is first read by the
    final reads, and a loss there is told apart from a reader that never came only by the final
    reads' record."""

    gen: Any
    state: tuple
    sent: Mapping[str, int] = field(default_factory=dict)  # key -> highest acknowledged offset, while unseen
    polled: Mapping[str, int] = field(default_factory=dict)  # key -> highest offset polled

    SHARE = 1 / 3

    @classmethod
    def around(cls, gen, seed: Any) -> "PollUnseen":
        return cls(gen, rng_state(f"{seed}/poll-unseen"))

    def op(self, ctx):
        answer = self.gen.op(ctx)
        if answer is None or answer is PENDING:
            return answer
        op, rest = answer
        state = self.state
        if op["f"] == "assign" and not op.get("final") and self.sent:
            rng = resume(state)
            if rng.random() < self.SHARE:
                unseen = {k: {"polled": self.polled.get(k, -1), "sent": v} for k, v in sorted(self.sent.items())
                          if k not in op["keys"]}
                if unseen:
                    op = {**op, "keys": sorted(set(op["keys"]) | set(unseen)), "unseen": unseen}
            state = rng.getstate()
        return op, dataclasses.replace(self, gen=rest, state=state)

    def update(self, ctx, event):
        gen = self.gen.update(ctx, event)
        kind, f = event["type"], event["f"]
        if kind == "invoke" or f not in ("send", "poll", "txn"):
            return dataclasses.replace(self, gen=gen)
        acked, read = {}, {}
        for mop in event.get("mops") or []:
            if mop.get("f") == "send" and mop.get("offset") is not None and (f == "send" or kind == "ok"):
                acked[mop["key"]] = max(acked.get(mop["key"], -1), mop["offset"])
            for record in mop.get("records") or []:
                read[record["key"]] = max(read.get(record["key"], -1), record["offset"])
        # The maps are copied only when this completion moves them: this runs once per operation.
        sent, polled = self.sent, self.polled
        if read:
            polled = {**polled, **{k: max(polled.get(k, -1), o) for k, o in read.items()}}
        if acked or read:
            sent = {k: v for k, v in {**sent, **{k: max(sent.get(k, -1), o) for k, o in acked.items()}}.items()
                    if polled.get(k, -1) < v}
        return dataclasses.replace(self, gen=gen, sent=sent, polled=polled)


@dataclass(frozen=True)
class FinalReads:
    """Jepsen's final reads, for one worker (history-format.md, Final reads). First a `crash`, so
    that the reads run on a new producer and consumer with nothing carried over from the main phase;
    then (for a consumer group's workload, `committed`) ask the group's committed offsets; then
    assign every key from the beginning, learning from the broker where each key ends
    (`end_offsets` on the assign's completion), and poll until the consumer has read every key to
    that end. Then assign again without rewinding, to learn whether the ends moved meanwhile (a
    leader still bringing its followers up to date after the heal): done when they did not,
    otherwise poll on to the new ends. That second assign comes no sooner than `settle` seconds
    after the ends it checks were learned: an end is the high watermark, which stands still
    between the followers' fetches however much the leader has acknowledged (acks=1), so ends
    asked twice within that time agree without showing that they are final. A key whose end the
    broker could not say is asked again (backing off); a crashed process starts over from the
    assign.

    Whatever happens, the reader ends with its record: a `final-reads` operation whose
    `final_reads` says, per key, the end it aimed for, how far it read and whether it reached the
    end, could not read the key (`unavailable`) or ran out of time (`timeout`). It is given when
    the reads are done, or `seconds` after the reader was first asked for an operation (the final
    phase's time limit: it is its own, so that running out of time is recorded); with `unread`
    (why: the heal did not succeed) at once, reading nothing."""

    keys: tuple
    seconds: float = 30.0
    unread: str | None = None
    committed: bool = False  # ask the consumer group's committed offsets first (a `committed` op)
    fresh: bool = False  # the process's clients were opened for the final reads
    targets: Mapping[str, int] | None = None  # None: the next read is an assign from the beginning
    positions: Mapping[str, int] = field(default_factory=dict)
    unavailable: Mapping[str, str] = field(default_factory=dict)  # key -> why its end is unknown
    stable: bool = False  # every key read to its end, and the ends did not move
    closed: bool = False  # the record was given
    deadline: float | None = None
    backoff: float = 0.0  # seconds to wait before the next assign, doubling up to RETRY_MAX
    settle: float = 0.0  # seconds the ends must stand before they are believed
    learned: float | None = None  # when the ends aimed for were learned (run time, seconds)

    RETRY_MAX = 2.0

    def _reached(self) -> bool:
        return self.targets is not None and all(self.positions.get(k, 0) >= end for k, end in self.targets.items())

    def record(self) -> list[dict]:
        """Per key: the end it aimed for, one past the highest offset read, and the outcome."""
        out = []
        for key in self.keys:
            end = None if self.unread is not None or self.targets is None else self.targets.get(key)
            read_to = 0 if self.unread is not None else self.positions.get(key, 0)
            if end is not None and read_to >= end:
                outcome = "reached"
            elif self.unread is not None or key in self.unavailable:
                outcome = "unavailable"
            else:
                outcome = "timeout"
            out.append({"key": key, "end": end, "read_to": read_to, "outcome": outcome})
        return out

    def _next(self) -> Op:
        if not self.fresh:
            return {"f": "crash", "final": True}
        if self.committed:
            return {"f": "committed", "final": True}
        if self.targets is None or self._reached():
            return {"f": "assign", "keys": list(self.keys), "seek_to_beginning": self.targets is None, "final": True}
        return {"f": "poll", "mops": [{"f": "poll"}], "final": True}

    def op(self, ctx):
        if self.closed:
            return None
        thread = ctx.some_free_thread()
        if thread is None:
            return PENDING
        since = ctx.since(thread)
        deadline = self.deadline if self.deadline is not None else since + self.seconds
        after = dataclasses.replace(self, deadline=deadline)
        if self.unread is not None or self.stable:
            op, at = None, since
        else:
            op = self._next()
            at = since
            if op["f"] == "assign":
                at += self.backoff
                if not op["seek_to_beginning"] and self.learned is not None:
                    at = max(at, self.learned + self.settle)
            if at >= deadline:
                op, at = None, max(since, deadline)
        if op is None:
            op = {"f": "final-reads", "final": True, "_final_reads": self.record()}
        return fill({**op, "at": at}, ctx, thread), after

    def update(self, ctx, event):
        if event["type"] == "invoke":
            return self
        f = event["f"]
        if f == "final-reads":
            return dataclasses.replace(self, closed=True)
        if f == "committed":
            return dataclasses.replace(self, committed=False)  # asked once, whatever the answer
        if event["type"] == "info":
            # The process is over (the crash, or an operation that may not have ended): its
            # successor opens new clients and reads from the beginning again.
            return dataclasses.replace(self, fresh=True, targets=None, positions={}, stable=False,
                                       backoff=0.0 if f == "crash" else self.backoff)
        if f == "assign":
            if event["type"] != "ok":
                why = event.get("error") or "the assign failed"
                return dataclasses.replace(self, unavailable={k: why for k in self.keys}, backoff=self._longer())
            ends = dict(event.get("end_offsets") or {})
            unavailable = dict(event.get("unavailable") or {})
            backoff = self._longer() if unavailable else 0.0
            if event.get("seek_to_beginning"):
                return dataclasses.replace(self, targets=ends, positions={}, unavailable=unavailable, backoff=backoff,
                                           learned=ctx.time)
            stable = not unavailable and set(ends) == set(self.keys) and ends == dict(self.targets or {})
            return dataclasses.replace(self, targets={**(self.targets or {}), **ends}, unavailable=unavailable,
                                       stable=stable, backoff=backoff, learned=ctx.time)
        positions = dict(self.positions)
        for mop in event.get("mops") or []:
            for rec in mop.get("records") or []:
                positions[rec["key"]] = max(positions.get(rec["key"], 0), rec["offset"] + 1)
        # Where the consumer found a key's end counts too: past what it never returns (transaction
        # markers; aborted records under read_committed).
        for key, offset in (event.get("positions") or {}).items():
            positions[key] = max(positions.get(key, 0), offset)
        return dataclasses.replace(self, positions=positions)

    def _longer(self) -> float:
        return min(self.RETRY_MAX, max(0.1, 2 * self.backoff))


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
        self.asker: Consumer | None = None  # the final reads' consumer for end offsets, opened when first needed
        self.send_timeout = int(producer_settings.get("message.timeout.ms", 5000)) / 1000 + 5
        self.idempotent = str(producer_settings.get("enable.idempotence", "false")).strip().lower() == "true"
        # librdkafka's default: retry (practically) forever within message.timeout.ms
        self.retries = int(producer_settings.get("retries", producer_settings.get("message.send.max.retries",
                                                                               2147483647)))

    def open(self) -> None:
        self.producer = self._open_producer()
        # enable.partition.eof: the consumer says where it found a partition's end, which is past
        # transaction markers that it never returns (the final reads need to know).
        self.consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group_id,
                                  "enable.partition.eof": True, **self.consumer_settings}, logger=LIBRDKAFKA_LOG)
        self.assignment = []
        self.positions = {}
        self.subscribed = False
        self.rebalances: list[dict] = []  # since the last poll: {"type": ..., "keys": [...]}

    def _open_producer(self) -> Producer | None:
        return Producer({"bootstrap.servers": self.bootstrap, **self.producer_settings}, logger=LIBRDKAFKA_LOG)

    def close(self) -> None:
        for consumer in (self.consumer, self.asker):
            if consumer is not None:
                try:
                    consumer.close()
                except (KafkaException, RuntimeError):
                    pass
        self.asker = None
        if self.producer is not None:
            # Queued and in flight alike: whatever the process still held goes with it (a transaction
            # it left open is the coordinator's to abort).
            try:
                self.producer.purge()
                self.producer.flush(0)
            except KafkaException as exc:
                # A producer failed for good (a fenced transactional one) refuses even this.
                LIBRDKAFKA_LOG.info("closing the producer of a process that ended: %s", exc)
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
        if f == "subscribe":
            return self._subscribe(op)
        if f == "crash":
            # Jepsen's crash: the process ends (info), and its successor opens new clients.
            return {"type": "info", "error": "crashed on purpose: the next operation opens a new producer and "
                                             "consumer"}
        if f == "final-reads":
            # The final reader's account of how each key ended, which it keeps from this client's
            # completions (FinalReads), handed over unrecorded: it belongs on the completion only.
            return {"type": "ok", "final_reads": op["_final_reads"]}
        raise ValueError(f"the queue client cannot perform {f!r}")

    def _send(self, op: Op) -> Op:
        reports, fatal = produce_all(self.producer, op["mops"], self.send_timeout)
        return send_completion(op["mops"], reports, self.retries, fatal)

    def _poll(self, op: Op) -> Op:
        if not self.assignment and not self.subscribed:
            return {"type": "fail", "mops": [{"f": "poll", "records": []}], "error": "no keys assigned"}
        records = []
        error = None
        ends: dict[str, int] = {}  # where the consumer found a key's end
        try:
            messages = fetched(self.consumer, self.max_poll_records, self.poll_timeout)
        except (KafkaException, RuntimeError) as exc:
            return {"type": "fail", "mops": [{"f": "poll", "records": []}], "error": str(exc)}
        for m in messages:
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() is not None and m.offset() >= 0:
                        ends[f"{m.topic()}/{m.partition()}"] = m.offset()
                else:
                    error = m.error().str()
                continue
            record = record_of(m)
            records.append(record)
            self.positions[record["key"]] = m.offset() + 1
        # librdkafka's per-partition errors are informational (it recovers by
        # itself), and the consumer's position has moved past every record it
        # returned: a poll that returned records happened, whatever else it said.
        if error is None or records:
            completion = {"type": "ok", "mops": [{"f": "poll", "records": records}]}
            if error:
                completion["warning"] = error
        else:
            completion = {"type": "fail", "mops": [{"f": "poll", "records": records}], "error": error}
        if self.rebalances:
            completion["rebalance_log"], self.rebalances = self.rebalances, []
        if self.subscribed and records:
            # As an application of a group does (Jepsen's commitSync after each poll): the group's
            # next owner of a key resumes where this one got.
            try:
                self.consumer.commit(asynchronous=False)
            except KafkaException as exc:
                completion["warning"] = "; ".join(filter(None, [completion.get("warning"),
                                                                f"the offsets were not committed: {exc}"]))
        if op.get("final") and ends:
            # Where the consumer found each key's end (librdkafka's partition EOF): at the end offset
            # even when the log ends in what it never returns (transaction markers; aborted records
            # under read_committed), so that the final reads, and the check, know it got there.
            completion["positions"] = ends
        return completion

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
        # A final read records where the logs end, so the check knows the whole final log; a key
        # whose end the broker cannot say now is named, with why, in `unavailable`.
        ends, unavailable = self.end_offsets(op["keys"])
        done: Op = {"type": "ok", "end_offsets": ends}
        if unavailable:
            done["unavailable"] = unavailable
        return done

    def _subscribe(self, op: Op) -> Op:
        """Join the group for the topics of the op's keys; which partitions this consumer gets is the
        group's to say, in the rebalances its polls record (`rebalance_log`)."""
        topics = sorted({parse_key(k)[0] for k in op["keys"]})
        try:
            self.consumer.subscribe(topics, on_assign=self._rebalanced("assigned"),
                                    on_revoke=self._rebalanced("revoked"), on_lost=self._rebalanced("lost"))
        except (KafkaException, RuntimeError) as exc:
            return {"type": "fail", "error": str(exc)}
        self.subscribed = True
        return {"type": "ok"}

    def _rebalanced(self, kind: str):
        """A rebalance callback: logs the keys given or taken (only those that changed, under the
        incremental protocols; the whole assignment under eager classic ones). librdkafka assigns
        or unassigns them itself after the callback."""
        def callback(consumer, partitions):
            entry = rebalance_entry(kind, partitions)
            self.rebalances.append(entry)
            keys = entry["keys"]
            if kind == "assigned":
                self.assignment = sorted(set(self.assignment) | set(keys))
            else:
                self.assignment = [k for k in self.assignment if k not in keys]
        return callback

    def end_offsets(self, keys: list[str]) -> tuple[dict[str, int], dict[str, str]]:
        """Where each key's log ends for consumers now: its high watermark, asked of the broker
        (ListOffsets latest, not librdkafka's cache). Returns (end by key, why by key for the keys
        whose end the broker could not say)."""
        ends: dict[str, int] = {}
        unavailable: dict[str, str] = {}
        known_topics = set()
        # Asked through a consumer of their own that never fetches: a broker answers a
        # connection's requests in order, so behind the assigned consumer's long-poll fetch
        # (fetch.wait.max.ms, 500 ms) every question waited that long, and 32 keys took 16 s.
        if self.asker is None:
            self.asker = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group_id,
                                   **self.consumer_settings}, logger=LIBRDKAFKA_LOG)
        asker = self.asker
        # Each question may wait up to 5 s; all of them together END_OFFSETS_TIME, so that a broker
        # that answers nothing holds the final reader up once, not once per key.
        deadline = time.monotonic() + END_OFFSETS_TIME
        stuck = False

        def wait() -> float | None:
            left = deadline - time.monotonic()
            return None if left <= 0 else min(5.0, max(0.5, left))

        for topic in sorted({parse_key(k)[0] for k in keys}):
            # A new consumer knows no partition until it has the topic's metadata: without it the
            # query answers _UNKNOWN_PARTITION at once.
            try:
                if (timeout := wait()) is None:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "not asked: earlier questions took "
                                                                           f"{END_OFFSETS_TIME:g}s"))
                asker.list_topics(topic, timeout=timeout)
                known_topics.add(topic)
            except KafkaException as exc:
                stuck = True
                for key in keys:
                    if parse_key(key)[0] == topic:
                        unavailable[key] = f"no metadata for {topic}: {exc}"
        for key in keys:
            topic, partition = parse_key(key)
            if topic not in known_topics:
                continue
            if (timeout := wait()) is None:
                unavailable[key] = f"not asked: the questions before took {END_OFFSETS_TIME:g}s"
                continue
            try:
                _, end = asker.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout,
                                                     cached=False)
            except KafkaException as exc:
                unavailable[key] = f"the end offset is unknown: {exc}"
                continue
            if end is None or end < 0:
                unavailable[key] = f"the broker gave no end offset ({end})"
            else:
                ends[key] = end
        if stuck:
            # A consumer opened while every broker refused connections was seen to fail each
            # metadata request after that for 30 s (Broker transport failure) while new ones
            # read at once: the next question goes through a new consumer.
            self.asker = None
            try:
                asker.close()
            except (KafkaException, RuntimeError):
                pass
        return ends, unavailable


def workload(spec, clients_dir=None) -> Workload:
    """The queue workload of a test spec: every worker assigns, sends and polls at the spec's rate,
    its stream drawn from the spec's seed; final reads of every key."""
    return queue_workload(spec, "queue", lambda bootstrap, process, group_id: QueueClient(
        bootstrap, spec.producer, spec.consumer, group_id=group_id))


def subscribe_workload(spec, clients_dir=None) -> Workload:
    """The queue workload with group membership: every worker's consumer subscribes (one group for
    the run) and now and then ends its process, leaving the group to a successor that joins it;
    each poll records the rebalances it went through."""
    return queue_workload(spec, "subscribe", lambda bootstrap, process, group_id: QueueClient(
        bootstrap, spec.producer, spec.consumer, group_id=group_id))


def settle_time(broker_settings: Mapping[str, str]) -> float:
    """Seconds the final reads let the ends they read to stand before believing them (FinalReads):
    a leader's high watermark moves on when its followers' next fetches come, and a follower's
    fetch waits at the leader up to replica.fetch.wait.max.ms (500 ms unless the run sets it) for
    data; one such wait and a second more for the follower's next fetch and the reader's ask."""
    try:
        wait_ms = int(broker_settings.get("replica.fetch.wait.max.ms", 500))
    except ValueError:  # the broker refuses it at start; the wait is then moot
        wait_ms = 500
    return wait_ms / 1000 + 1.0


# The one consumer group of a run whose consumers subscribe.
GROUP = "faultline-group"


def queue_workload(spec, name: str, make_client, main=None) -> Workload:
    """A workload of the queue family (`name` in models.spec.WORKLOADS, whose traits say how it
    consumes): `make_client(bootstrap, process, group_id)` for each process, the group the run's
    (GROUP) when its consumers subscribe and the process's own otherwise; `main(thread)` each
    worker's generator (default: the queue generator, transactional or subscribing as the traits
    say). Final reads of every key, first asking a committing group's offsets."""
    traits = WORKLOADS[name]
    subscribe = traits.consumer_mode == "subscribe"

    def client(bootstrap: str, process: int):
        return make_client(bootstrap, process, GROUP if subscribe else f"faultline-{process}")

    def queue_main(thread: int) -> QueueGenerator:
        return QueueGenerator.start(spec.seed, thread, spec.concurrency, spec.keys, spec.max_sends_per_op, spec.rate,
                                    txn=traits.transactions, subscribe=subscribe)

    def final(unread: str | None = None):
        return EachThread(lambda thread: FinalReads(tuple(spec.keys), spec.final_time_limit, unread=unread,
                                                    committed=traits.commit is not None and unread is None,
                                                    settle=settle_time(spec.broker_settings)))

    workers = EachThread(main or queue_main)
    return Workload(
        name=name,
        # A group decides what its members own: only assigning consumers can be steered.
        generator=workers if subscribe else PollUnseen.around(workers, spec.seed),
        final_generator=final(),
        final_unhealed=final,
        client=client,
        hints={"consumer_mode": traits.consumer_mode, "transactions": traits.transactions},
        setup=((lambda bootstrap: wait_group_coordinator(bootstrap, GROUP, spec.keys[0]))
               if "group" in traits.coordinators else None),
    )


GROUP_READY_S = 90


def wait_group_coordinator(bootstrap: str, group: str, key: str, timeout: float = GROUP_READY_S) -> None:
    """Wait until the broker coordinating `group` answers for it: an OffsetFetch of `key`'s
    partition, which needs no membership. Kafka creates the offsets topic and loads a
    coordinator's partition on the first request for a group; until then members get
    COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS, and a run whose faults begin then
    may never form its group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                consumer.committed([TopicPartition(*parse_key(key))], timeout=END_OFFSETS_TIME)
                return
            except KafkaException as exc:
                last = exc.args[0] if exc.args else exc
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the coordinator of consumer group {group} on {bootstrap} did not answer in "
                                   f"{timeout:.0f} s (last: {last}): members could not have joined")
            time.sleep(0.2)
    finally:
        consumer.close()
