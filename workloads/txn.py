"""Jepsen's transactional queue workload for Kafka.

Generator: the queue workload's (`QueueGenerator` with `txn`): an assign, then operations that are
each a transaction (`f: "txn"`) of 1-4 micro-operations, each a send of a unique value or a poll,
and the odd re-assign.

Client. In: one operation. Out: its completion. A `txn` runs on a transactional producer (a
`transactional.id` of its own per process, `init_transactions` before its first transaction) and
the process's consumer (read_committed unless the run says otherwise): begin, the micro-operations
in order, commit. A share of transactions (`abort_p`, drawn from the client's own random stream,
seeded by the run's seed and the process) is aborted on purpose, before one of its
micro-operations or before the commit, after a flush: what it sent so far is in the log (acknowledged,
uncommitted) when the abort marker follows. Completions:

- `ok`: committed; every send carries its offset, every poll its records.
- `fail`: aborted (on purpose, or because the producer said the transaction must be): nothing it
  sent is committed, so its sends carry no offset; its polls keep their records (what the log
  held). The consumer is sought back to where the transaction began reading (KAFKA-17582: neither
  librdkafka nor the Java consumer rewinds by itself after an abort), so the process reads those
  records again, as the checker's rule for rolled-back transactions expects.
- `info`: the commit's outcome is unknown (it timed out twice, or failed in flight), or the
  producer is fenced or failed for good: the process ends, and its successor opens a new producer
  with a new transactional.id. Sends the broker acknowledged keep their offsets.

Under subscribe (`txn-subscribe`) the consumer is a member of the run's group, each transaction
also commits the group's offsets of what it read (send_offsets_to_transaction, as Jepsen's), an
abort seeks the consumer back to the group's committed offsets, and a transaction's completion
carries the rebalances its polls went through.

Final reads are the queue workload's: under read_committed a log ends in transaction markers, so
the final reader goes by where its consumer found each key's end, past them.
"""

from __future__ import annotations

import random

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from .core import Workload
from .queue import (Op, QueueClient, Report, commit_outcome, fetched, kafka_error, parse_key, queue_workload,
                    record_of, send_outcome)

ABORTED = "aborted on purpose"
# Share of transactions the client aborts on purpose (Jepsen's maybe-abort).
ABORT_P = 0.1


class TxnClient(QueueClient):
    """One process's transactional producer and read_committed consumer."""

    def __init__(self, *args, seed: int, process: int, abort_p: float = ABORT_P, **kw):
        super().__init__(*args, **kw)
        self.transactional_id = f"faultline-txn-{process}"
        self.producer_settings = {**self.producer_settings, "transactional.id": self.transactional_id}
        self.rng = random.Random(f"{seed}/txn/{process}")
        self.abort_p = abort_p
        # Each transactional call may take this long; librdkafka keeps going in the background.
        self.txn_timeout = max(self.send_timeout, 10.0)
        self.initialized = False

    def open(self) -> None:
        super().open()
        self.initialized = False

    def invoke(self, op: Op) -> Op:
        if op["f"] == "txn":
            return self._txn(op)
        return super().invoke(op)

    def _txn(self, op: Op) -> Op:
        mops = op["mops"]
        reports: list[Report | None] = [None] * len(mops)
        records: dict[int, list] = {}
        began_at = dict(self.positions)  # where each key read resumes if the transaction aborts
        read: set[str] = set()
        step = "init_transactions"
        try:
            if not self.initialized:
                self.producer.init_transactions(self.txn_timeout)
                self.initialized = True
            step = "begin_transaction"
            self.producer.begin_transaction()
            # Aborted on purpose: before which micro-operation (len(mops): before the commit).
            abort_at = self.rng.randrange(len(mops) + 1) if self.rng.random() < self.abort_p else None
            for i, mop in enumerate(mops):
                if i == abort_at:
                    step = "flush before the abort"
                    return self._abort_on_purpose(mops, reports, records, began_at, read)
                if mop["f"] == "send":
                    step = f"send {mop['value']} to {mop['key']}"
                    topic, partition = parse_key(mop["key"])
                    self.producer.produce(topic, str(mop["value"]).encode(), partition=partition,
                                          on_delivery=self._delivered(reports, i))
                else:
                    step = "poll"
                    records[i] = self._consume(read)
            if abort_at == len(mops):
                step = "flush before the abort"
                return self._abort_on_purpose(mops, reports, records, began_at, read)
            if self.subscribed and read:
                # Jepsen's: the group's offsets commit with the transaction, or not at all.
                step = "send_offsets_to_transaction"
                self.producer.send_offsets_to_transaction(
                    [TopicPartition(*parse_key(k), self.positions[k]) for k in sorted(read)],
                    self.consumer.consumer_group_metadata(), self.txn_timeout)
            step = "commit_transaction"
            return self._commit(mops, reports, records, began_at, read)
        except (KafkaException, SystemError) as exc:
            err = kafka_error(exc)  # a fatal error can surface as a SystemError (queue.kafka_error)
            if step != "init_transactions" and err.txn_requires_abort():
                return self._abort(mops, reports, records, began_at, read, f"{step}: {err.str()}")
            if step in ("init_transactions", "begin_transaction") and not err.fatal():
                # Nothing of this transaction reached the broker.
                return self._completion("fail", mops, reports, records, f"{step}: {err.str()}")
            # Fenced, fatal, or a state the producer cannot say: the process ends.
            return self._completion("info", mops, reports, records, f"{step}: {err.str()}; the producer is "
                                                                    f"replaced")
        except BufferError as exc:
            return self._abort(mops, reports, records, began_at, read, f"{step}: the producer's queue is full: {exc}")

    @staticmethod
    def _delivered(reports: list, i: int):
        def delivered(err, msg):
            reports[i] = Report.delivered(err, None if err else msg.offset())
        return delivered

    def _consume(self, read: set[str]) -> list[dict]:
        out = []
        for m in fetched(self.consumer, self.max_poll_records, self.poll_timeout):
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                continue
            record = record_of(m)
            out.append(record)
            read.add(record["key"])
            self.positions[record["key"]] = m.offset() + 1
        return out

    def _commit(self, mops, reports, records, began_at, read) -> Op:
        for attempt in (1, 2):
            try:
                self.producer.commit_transaction(self.txn_timeout)
                self.producer.poll(0)  # the delivery reports of the last sends
                return self._completion("ok", mops, reports, records, None)
            except (KafkaException, SystemError) as exc:
                err = kafka_error(exc)
                kind, why = commit_outcome(err)
                if kind == "fail":
                    return self._abort(mops, reports, records, began_at, read, f"commit_transaction: {err.str()}")
                if err.retriable() and not err.fatal() and attempt == 1:
                    continue  # librdkafka resumes the commit it began: ask for its outcome again
                return self._completion("info", mops, reports, records,
                                        f"commit_transaction: {err.str()}: {why}; the producer is replaced")
        raise AssertionError("unreachable")

    def _abort_on_purpose(self, mops, reports, records, began_at, read) -> Op:
        """Abort after the transaction's sends so far reached the log (a flush within the
        transaction), as an application's that fails after writing: without it librdkafka purges
        what is still queued, an aborted transaction often leaves nothing in the log, and neither
        read_committed's hiding of aborted records nor a read_uncommitted consumer's reading them is
        put to the test."""
        self.producer.flush(self.txn_timeout)
        return self._abort(mops, reports, records, began_at, read, ABORTED)

    def _abort(self, mops, reports, records, began_at, read, why: str) -> Op:
        try:
            self.producer.abort_transaction(self.txn_timeout)
        except (KafkaException, SystemError) as exc:
            return self._completion("info", mops, reports, records,
                                    f"{why}; abort_transaction: {kafka_error(exc).str()}; the producer is replaced")
        # Read again what the aborted transaction read: its consumption is rolled back too.
        try:
            self._rewind(read, began_at)
        except (KafkaException, RuntimeError) as exc:
            return self._completion("info", mops, reports, records,
                                    f"{why}; rewinding the consumer failed: {exc}; the process is replaced")
        return self._completion("fail", mops, reports, records, why)

    def _rewind(self, read: set[str], began_at: dict[str, int]) -> None:
        """Seek the consumer back over what an aborted transaction read: by assign, to where this
        client was before it; by subscribe, to the group's committed offsets (the aborted
        transaction's offsets were not committed), for the keys the consumer still holds."""
        if not read:
            return
        if not self.subscribed:
            for key in read:
                self.positions[key] = began_at.get(key, self.positions[key])
            self.consumer.assign([TopicPartition(*parse_key(k), self.positions.get(k, 0)) for k in self.assignment])
            return
        held = [TopicPartition(*parse_key(k)) for k in sorted(read) if k in self.assignment]
        for tp in self.consumer.committed(held, self.txn_timeout) if held else []:
            key = f"{tp.topic}/{tp.partition}"
            offset = tp.offset if tp.offset is not None and tp.offset >= 0 else 0  # none committed: the start
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            self.positions[key] = offset

    def _completion(self, kind: str, mops, reports, records, why: str | None) -> Op:
        """The txn's completion: sends with their offsets (ok; info when acknowledged) or none
        (fail, and what was not acknowledged) and why; polls with the records they returned."""
        out = []
        for i, mop in enumerate(mops):
            if mop["f"] != "send":
                out.append({"f": "poll", "records": records.get(i, [])})
                continue
            report = reports[i]
            acked = report is not None and send_outcome(report).type(self.retries) == "ok"
            if kind != "fail" and acked:
                out.append(dict(mop, offset=report.offset if report.offset is not None and report.offset >= 0
                                else None))
            elif kind == "ok":
                raise AssertionError(f"a committed transaction's send has no acknowledgement: {report}")
            else:
                if acked:
                    detail = "acknowledged, then aborted with its transaction"
                elif report is None:
                    detail = "no acknowledgement before the transaction ended"
                else:
                    detail = report.detail or send_outcome(report).reason
                out.append(dict(mop, offset=None, error=detail))
        done: Op = {"type": kind, "mops": out}
        if why:
            done["error"] = why
        if self.rebalances:
            done["rebalance_log"], self.rebalances = self.rebalances, []
        return done


def workload(spec, clients_dir=None) -> Workload:
    """The transactional queue workload of a test spec."""
    return queue_workload(spec, "txn", _clients(spec))


def subscribe_workload(spec, clients_dir=None) -> Workload:
    """The transactional queue with group membership: each transaction commits the group's offsets
    of what it read (send_offsets_to_transaction)."""
    return queue_workload(spec, "txn-subscribe", _clients(spec))


def _clients(spec):
    return lambda bootstrap, process, group_id: TxnClient(bootstrap, spec.producer, spec.consumer, group_id=group_id,
                                                          seed=spec.seed, process=process)
