"""Consumers that process and commit as applications do: the consume workloads.

Generator (`ConsumeGenerator`). In: the seed, the worker, the keys, the commit mode. Out: for each
worker, a subscribe, then operations that are either a send (as the queue workload's) or the next
step of its consume cycle: `poll`, then by mode `process`, and `commit` after every third batch
(after: commit after processing), `commit` and `process` (before), or `process` alone (auto: librdkafka commits in the
background, `enable.auto.commit=true`). A new process starts the cycle over.

Client (`ConsumeClient`). The queue client's producer, and a group member in a process of its own
(`workloads.consumer_child`), so that the kill-consumer nemesis can SIGKILL it as it would an
application. What the member polled waits to be processed; `process` hands it over (`processed`);
`commit` commits, by mode, one past what was processed or polled since the last commit
(`offsets`); committing before processing, what could not be committed is not processed. A member
found dead before an operation began did nothing (`info` with no records or offsets); one that
dies during it may have done it (`info`, with what it was doing); either way its process ends and
its successor starts a new member in the same group. The final reads run on an in-harness
consumer (assign, no membership) after asking the group's committed offsets (`committed`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException, TopicPartition

from ..models.spec import WORKLOADS
from .child import Child, ChildGone
from .core import Workload
from .generator import PENDING, fill, resume, rng_state
from .queue import END_OFFSETS_TIME, Op, QueueClient, parse_key, queue_workload

CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")
# Committing after processing, an application commits every few batches (here three), as one that
# commits every N records or every T ms does; committing before, it must commit each batch first.
CYCLES = {"auto": ("poll", "process"), "after": ("poll", "process") * 3 + ("commit",),
          "before": ("poll", "commit", "process")}
# librdkafka's errors that refuse a commit outright (the member is not, or no longer, in the group's
# generation): nothing was committed. Any other failure may have committed.
REFUSED = {"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "REBALANCE_IN_PROGRESS", "FENCED_INSTANCE_ID",
           "STALE_MEMBER_EPOCH", "FENCED_MEMBER_EPOCH", "UNKNOWN_TOPIC_OR_PART"}


@dataclass(frozen=True)
class ConsumeGenerator:
    worker: int
    concurrency: int
    keys: tuple
    max_sends: int
    rate: float
    cycle: tuple
    state: tuple
    step: int = 0
    sent: int = 0
    subscribed: bool = False

    @classmethod
    def start(cls, seed: int, worker: int, concurrency: int, keys: list[str], max_sends: int, rate: float,
              mode: str) -> "ConsumeGenerator":
        return cls(worker, concurrency, tuple(keys), max_sends, rate, CYCLES[mode], rng_state(f"{seed}/{worker}"))

    def op(self, ctx):
        thread = ctx.some_free_thread()
        if thread is None:
            return PENDING
        rng = resume(self.state)
        sent, step = self.sent, self.step
        if not self.subscribed:
            op = {"f": "subscribe", "keys": list(self.keys)}
        elif rng.random() < 0.4:
            mops = []
            for _ in range(rng.randint(1, self.max_sends)):
                mops.append({"f": "send", "key": rng.choice(self.keys), "value": sent * self.concurrency + self.worker})
                sent += 1
            op = {"f": "send", "mops": mops}
        else:
            f = self.cycle[step]
            op = {"f": "poll", "mops": [{"f": "poll"}]} if f == "poll" else {"f": f}
            step = (step + 1) % len(self.cycle)
        delay = rng.uniform(0, 2 * self.concurrency / self.rate)
        op = fill({**op, "at": ctx.since(thread) + delay}, ctx, thread)
        return op, dataclasses.replace(self, state=rng.getstate(), sent=sent, step=step, subscribed=True)

    def update(self, ctx, event):
        if event["type"] == "info":
            # The process ended: its successor joins the group and starts the cycle over.
            return dataclasses.replace(self, subscribed=False, step=0)
        return self


class ConsumeClient(QueueClient):
    """One process's producer, in-harness consumer (final reads) and group member (a child)."""

    def __init__(self, *args, mode: str, process: int, keys: list[str], clients_dir: Path | None, **kw):
        super().__init__(*args, **kw)
        self.mode = mode
        self.keys = list(keys)
        self.process = process
        self.member = Child("faultline.workloads.consumer_child",
                            None if clients_dir is None else Path(clients_dir) / f"consumer-{process}.pid")
        self.pending: list[dict] = []  # polled, not yet processed
        # What the next commit commits, key -> one past the highest offset: processed since the last
        # commit (after) or polled since it (before). Only the keys of this batch: committing a key
        # the member read long ago could move the group back past another member's progress.
        self.uncommitted: dict[str, int] = {}

    def close(self) -> None:
        self.member.close()
        super().close()

    def _start_member(self) -> None:
        config = {"bootstrap.servers": self.bootstrap, "group.id": self.group_id, **self.consumer_settings}
        if config.get("group.protocol") == "consumer":
            # KIP-848: the broker keeps the session; librdkafka refuses the classic protocol's settings.
            for name in CLASSIC_ONLY:
                config.pop(name, None)
        self.member.start({"config": config})

    def _ask(self, cmd: dict, timeout: float) -> dict:
        return self.member.ask(cmd, timeout)

    def invoke(self, op: Op) -> Op:
        f = op["f"]
        if op.get("final") or f in ("send", "crash", "final-reads", "assign"):
            return self._committed() if f == "committed" else super().invoke(op)
        if f == "subscribe" and self.member.proc is None:
            self._start_member()
        if not self.member.alive:
            # Dead before the operation began: it did nothing (no records, no offsets), and it is `info`
            # only because the process ends with its member.
            return {"type": "info", **self._empty(f), "error": "the member's process was dead (killed) before "
                                                               "this operation, which did nothing: its process ends"}
        try:
            return {"subscribe": self._join, "poll": self._member_poll, "process": self._process,
                    "commit": self._commit}[f](op)
        except ChildGone as exc:
            return {"type": "info", **self._empty(f), "error": f"{exc}: its process ends"}

    @staticmethod
    def _empty(f: str) -> dict:
        return {"poll": {"mops": [{"f": "poll", "records": []}]}, "process": {"processed": []}}.get(f, {})

    def _join(self, op: Op) -> Op:
        answer = self._ask({"f": "subscribe", "topics": sorted({parse_key(k)[0] for k in op["keys"]})}, 10)
        return {"type": "fail", "error": answer["error"]} if "error" in answer else {"type": "ok"}

    def _member_poll(self, op: Op) -> Op:
        answer = self._ask({"f": "poll", "max": self.max_poll_records, "timeout": self.poll_timeout}, 30)
        records = answer.get("records") or []
        self.pending += records
        if self.mode == "before":
            self._mark(records)
        done: Op = {"type": "ok", "mops": [{"f": "poll", "records": records}]}
        if answer.get("rebalances"):
            done["rebalance_log"] = answer["rebalances"]
        if answer.get("error"):
            done["warning"] = answer["error"]
        return done

    def _process(self, op: Op) -> Op:
        # The member acknowledges that it processed what it was handed: a member killed first has not,
        # and one killed meanwhile may have.
        processed, self.pending = self.pending, []
        try:
            self._ask({"f": "ping"}, 10)
        except ChildGone as exc:
            return {"type": "info", "processed": processed, "error": f"{exc} while processing these records: "
                                                                     f"they may have been; its process ends"}
        if self.mode == "after":
            self._mark(processed)
        return {"type": "ok", "processed": processed}

    def _mark(self, records: list[dict]) -> None:
        for r in records:
            self.uncommitted[r["key"]] = max(self.uncommitted.get(r["key"], 0), r["offset"] + 1)

    def _commit(self, op: Op) -> Op:
        offsets, self.uncommitted = self.uncommitted, {}
        if not offsets:
            return {"type": "ok", "offsets": {}}
        try:
            answer = self._ask({"f": "commit", "offsets": offsets}, 30)
        except ChildGone:
            self._not_committed()
            raise
        if "error" not in answer:
            return {"type": "ok", "offsets": offsets}
        self._not_committed()
        refused = any(code in answer["error"] for code in REFUSED)
        return {"type": "fail" if refused else "info", "offsets": offsets, "error": answer["error"]}

    def _not_committed(self) -> None:
        """Committing before processing, an application processes only what it committed: what it
        polled and could not commit is left for the group to deliver again (to whoever commits it)."""
        if self.mode == "before":
            self.pending = []

    def _committed(self) -> Op:
        """The group's committed offsets, asked of the broker after the run (OffsetFetch: no membership)."""
        keys = sorted(self.keys)
        try:
            parts = self.consumer.committed([TopicPartition(*parse_key(k)) for k in keys], timeout=END_OFFSETS_TIME)
        except KafkaException as exc:
            return {"type": "fail", "error": f"the group's committed offsets are unknown: {exc}"}
        return {"type": "ok", "offsets": {f"{p.topic}/{p.partition}": p.offset for p in parts
                                          if p.offset is not None and p.offset >= 0}}


def workload(spec, name: str, clients_dir: Path | None = None) -> Workload:
    """A consume workload (`name`: consume-auto, consume-after or consume-before) of a test spec."""
    mode = WORKLOADS[name].commit

    def client(bootstrap: str, process: int, group_id: str) -> ConsumeClient:
        return ConsumeClient(bootstrap, spec.producer, spec.consumer, group_id=group_id, mode=mode, process=process,
                             keys=spec.keys, clients_dir=clients_dir)

    def main(thread: int) -> ConsumeGenerator:
        return ConsumeGenerator.start(spec.seed, thread, spec.concurrency, spec.keys, spec.max_sends_per_op, spec.rate,
                                      mode)

    return queue_workload(spec, name, client, main)
