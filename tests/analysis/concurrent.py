"""Concurrent histories of a correct broker, with at most one injected fault.

In: a `Recorder` (history lines and the stats both engines must report), a
scenario name (the prefix of its keys), a `random.Random`, the fault to
inject (None for a correct run), the first process number the scenario may
use, and its shape (concurrency, operations, atomic or interleaved effects,
how often clients subscribe).
Out: a `Run`: the scenario's keys, the anomaly types the engines must report
for them (exactly), the witnesses of the types a correct history can show
too (exactly, each with its cause), and, per operation, when its writes and
reads took effect (to judge the engines' dependencies).

The broker is an in-memory log per key. Several workers (`concurrency`)
each run one client process; a process runs one operation at a time, but
the operations of different processes overlap: an operation is an `invoke`
line, then the moments at which its effects happen, then its completion
line, and a scheduler interleaves these steps of all workers (and a
nemesis, whose lines the engines only count). The moments are where the
log changes, so every offset is given in the order in which appends really
happened.

Operations (the effects of one operation happen between its lines):
- send of 1-3 values to random keys: `ok` appends every value (in mop order)
  and acknowledges each with its offset; `fail` appends nothing; `info`, or
  an invocation never completed, appends all its values now, later (after
  other operations' effects; at the latest just before the final reads), or
  never, all alike, and retires the process;
- poll of 1-2 poll mops (consumer poll() calls): each reads, from the
  consumer's position in each key it owns, up to 3 records per key (fewer at
  the log end) and moves past them. `ok` returns
  them; `fail` usually reads nothing, sometimes returns what it read (records
  of a failed poll are evidence, and the consumer moved past them); `info`
  reads nothing and retires the process;
- txn: 2-4 mops mixing sends and polls, done as a client without broker
  transactions does them: each mop takes effect in order. `ok`: all of them,
  and a poll may return a value the operation itself sent earlier; `fail`:
  refused before any mop took effect; `info`/never: its sends as an `info`
  send's, its polls read nothing, the process retires;
- assign of a random subset of keys, with seek_to_beginning (positions 0) or
  without (a key it owned keeps its position, a new one starts at the log
  end); leaves the consumer group if the process was in it;
- subscribe to every key of the scenario: the process joins the scenario's
  consumer group (see below);
- a process that completes `info` (or never completes) is retired, and its
  worker carries on as process old + concurrency, with a fresh consumer.

The consumer group (a simple model of Kafka's cooperative rebalancing with
fenced commits):
- every change of membership (a subscribe, a member's assign, a member's
  crash) starts a new generation, which deals the keys, in a random order,
  round-robin to the sorted members;
- a member learns of generations only inside a poll (each poll mop of a
  txn too), before it fetches: its `rebalance_log` lists its key set after
  each generation that changed it. A key it kept throughout keeps its
  position; a key it gained (or lost and regained) restarts at the group's
  committed offset for it, or at 0 when none was committed. A member does
  not fetch between polls, so after a rebalance no two members fetch a key;
- right after fetching, a member commits its positions (probability 0.6):
  commits lag, so a new owner may re-read records.
So under subscribe a process may skip offsets (its key was read by others
meanwhile) or go back (its own reads were not committed): poll-skip and
nonmonotonic-poll across operations, and their int- forms inside one poll or txn
whose poll mops straddle a rebalance.

End of the run: every worker's operation completes, the `info` effects
still pending land or not, the nemesis heals, and the final reads start:
the keys are split among up to `concurrency` workers, each of which assigns
its keys with seek_to_beginning and `"final": true`, its `ok` completion
carrying `end_offsets` (the log end of each key), polls (`"final": true`)
until it has passed every key's end, and assigns again without rewinding
(same `end_offsets`): the ends did not move. Final readers run concurrently.

What a correct history shows (`Run.expected` without a fault), by the
engines' definitions (history_analysis/result.py, shared/anomalies.md):
- poll-skip / nonmonotonic-poll (and int-poll-skip / int-nonmonotonic-poll
  within a txn) from rebalances only: predicted exactly by following each
  process's poll chain (process, assignment, key), each with cause
  "rebalance";
- int-send-skip: two sends of one `ok` operation to one key with another
  process's append between them (interleaved mode only): no write isolation;
- precommitted-read: an `ok` txn that polled a value it had itself sent
  earlier: correct for a client without transactions (each send is committed
  when acknowledged), though the models forbid it;
- nothing else: no unseen, lost-write, uncommitted-read (the final reads read
  every log to its end), duplicate, inconsistent or reused offsets,
  unexpected, G1a, nonmonotonic-send, int-nonmonotonic-send.
Cycles: in atomic mode (all effects of an operation at one moment, an
`info` one's possibly after its completion) the moments are a topological
order of every dependency, process and real-time edge, so there is no
cycle of any type. In interleaved mode multi-key sends and txns make G0 and
G1c cycles (Kafka has no write isolation) and their process/real-time
variants; what is stable there is that every dependency the engines derive
is a real order of effects (`Run.effects`).

Faults (at most one per scenario, injected at a random step of the run):
- "duplicate": the broker appends a second copy of a visible value -> {duplicate};
- "unexpected": the broker appends a value nobody sent -> {unexpected};
- "aborted": the next send is reported failed, yet its values are appended -> {G1a};
- "lost": the next acknowledged value never becomes visible (readers step
  over its offset) -> {unseen}, plus lost-write when a visible record lies
  above it, plus the chain witnesses (poll-skip, int-poll-skip) that step
  over its offset, cause "lost"; the final reads are short of the end when
  it is the last record of its key;
- "truncated": just before the final reads, a key loses its last record,
  acknowledged by an ok send; the final reads are told the shorter end ->
  {lost-write}, plus uncommitted-read if an ok poll had read it, else unseen;
- "inconsistent": a fresh process's failed send of w, and another fresh
  process's poll returning w at an existing offset: a failed poll ->
  {inconsistent-offsets}; an ok one -> {inconsistent-offsets,
  uncommitted-read, G1a};
- "int-skip" / "int-rewind": a fresh process's ok poll returns offsets o, o+2
  (o+1 exists) / o+1, o of a key -> {int-poll-skip} / {int-nonmonotonic-poll};
- "int-send-reorder": a fresh process's ok send of two values to a key,
  appended and acknowledged in reverse order -> {int-nonmonotonic-send}.
A fault that finds nothing to act on (no visible record yet, say) is not
injected (`Run.injected` is False) and the run is judged as a correct one.
Not here: "write-cycle" (G0 needs no fault in interleaved mode, and the
cycle types are being split), "int-send-skip" (a correct interleaved run
shows it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterator

from .histories import Builder

FAULTS = (None, "duplicate", "unexpected", "aborted", "lost", "truncated", "inconsistent", "int-skip",
          "int-rewind", "int-send-reorder")
# What each fault must add, whatever else happens (the rest is decided as the run goes).
FAULT_TYPES = {
    "duplicate": {"duplicate"}, "unexpected": {"unexpected"}, "aborted": {"G1a"}, "lost": {"unseen"},
    "truncated": {"lost-write"}, "inconsistent": {"inconsistent-offsets"}, "int-skip": {"int-poll-skip"},
    "int-rewind": {"int-nonmonotonic-poll"}, "int-send-reorder": {"int-nonmonotonic-send"},
}
# Witness types predicted one by one (`Run.witnesses`), with how to compare a found witness.
CHAIN_TYPES = ("poll-skip", "nonmonotonic-poll")
INT_POLL_TYPES = ("int-poll-skip", "int-nonmonotonic-poll")
PREDICTED = (*CHAIN_TYPES, *INT_POLL_TYPES, "int-send-skip", "precommitted-read")
PROCESS_SPAN = 100_000  # process numbers of one scenario: base .. base + PROCESS_SPAN - 1


def witness_id(kind: str, w: dict) -> tuple:
    """What identifies a witness of a PREDICTED type, as the engines write it."""
    if kind in CHAIN_TYPES:
        return (w["process"], w["key"], w["prev_offset"], w["next_offset"], tuple(w["ops"]))
    if kind in (*INT_POLL_TYPES, "int-send-skip"):
        return (w["process"], w["key"], w["op"], w["prev_offset"], w["next_offset"])
    return (w["process"], w["key"], w["op"], w["value"], w["offset"])  # precommitted-read


class Recorder:
    """History lines (through a Builder: index and time) and the stats the engines must report."""

    def __init__(self, b: Builder | None = None):
        self.b = b or Builder()
        self.stats: dict[str, Any] = {"ops": 0, "ok": 0, "fail": 0, "info": 0}
        self.by_f: dict[str, dict[str, int]] = {}

    @property
    def lines(self) -> list[dict]:
        return self.b.lines

    def expected_stats(self) -> dict[str, Any]:
        return {**self.stats, **({"by_f": self.by_f} if self.by_f else {})}

    def invoke(self, process, f: str, **fields) -> int:
        if process != "nemesis":
            self.stats["ops"] += 1
        return self.b.line(process, "invoke", f, **fields)

    def complete(self, process, type_: str, f: str, **fields) -> int:
        if process != "nemesis":
            self._counted(f, type_)
        return self.b.line(process, type_, f, **fields)

    def never(self, f: str) -> None:
        """An invocation the history never completes: the readers count it as info."""
        self._counted(f, "info")

    def _counted(self, f: str, type_: str) -> None:
        self.stats[type_] += 1
        n = self.by_f.setdefault(f, {"invoked": 0, "ok": 0})
        n["invoked"] += 1
        n["ok"] += type_ == "ok"


@dataclass
class Entry:
    value: int
    writer: "Op | None"
    visible: bool = True
    acked: bool = False  # by an ok operation, at its offset
    read_ok: bool = False  # returned by an ok poll
    read: bool = False  # returned by any poll


@dataclass
class Op:
    process: int
    f: str
    invoke: int = -1
    index: int = -1  # its completion's index; the invocation's when it never completes
    type: str = "invoke"
    first_append: dict[str, int] = field(default_factory=dict)  # key -> moment of its first append there
    last_read: dict[str, int] = field(default_factory=dict)  # key -> moment of its last fetch returning it
    rebalances: list[list[str]] = field(default_factory=list)
    sent: set = field(default_factory=set)  # (key, value)


@dataclass
class Consumer:
    process: int
    mode: str = "none"  # "assign" | "subscribe"
    positions: dict[str, int] = field(default_factory=dict)
    assignment: int = 0  # assign/subscribe invocations so far: the engines' chain number
    gen: int = 0  # the last generation of the group it went through
    keys: frozenset = frozenset()
    reset: set = field(default_factory=set)  # keys whose position a rebalance reset, not read since
    chain: dict = field(default_factory=dict)  # (assignment, key) -> (op index, last offset read)


@dataclass
class Record:
    key: str
    offset: int
    value: int
    after_reset: bool  # the first record of its key fetched after a rebalance reset its position


@dataclass
class Run:
    name: str
    keys: list[str]
    fault: str | None
    injected: bool
    expected: set[str]
    # type -> {witness_id: cause}, for the PREDICTED types
    witnesses: dict[str, dict[tuple, str]]
    detail: dict
    atomic: bool
    # op index -> Op: when each operation's writes and reads took effect
    effects: dict[int, Op]
    # the log of each key as the final reads saw it: (end offset, values)
    final_logs: dict[str, tuple[int, list[int]]]
    first_process: int


class _Group:
    def __init__(self, keys: list[str], rnd: random.Random):
        self.keys, self.rnd = keys, rnd
        self.members: set[int] = set()
        self.gen = 0
        self.assignments: list[dict[int, frozenset]] = [{}]
        self.committed: dict[str, int] = {}

    def rebalance(self) -> None:
        members = sorted(self.members)
        keys = list(self.keys)
        self.rnd.shuffle(keys)
        deal: dict[int, set] = {m: set() for m in members}
        for i, k in enumerate(keys):
            if members:
                deal[members[i % len(members)]].add(k)
        self.gen += 1
        self.assignments.append({m: frozenset(ks) for m, ks in deal.items()})

    def join(self, process: int) -> None:
        self.members.add(process)
        self.rebalance()

    def leave(self, process: int) -> None:
        if process in self.members:
            self.members.discard(process)
            self.rebalance()


class _Worker:
    def __init__(self, number: int, process: int):
        self.number = number
        self.consumer = Consumer(process)
        self.task: Iterator | None = None


class Scenario:
    def __init__(self, rec: Recorder, name: str, rnd: random.Random, fault: str | None, first_process: int,
                 concurrency: int = 3, ops: int = 30, atomic: bool = False, subscribe: float = 0.3):
        self.rec, self.rnd, self.fault = rec, rnd, fault
        self.name, self.first_process = name, first_process
        self.concurrency, self.ops, self.atomic, self.subscribe = concurrency, ops, atomic, subscribe
        self.keys = [f"{name}-t/{i}" for i in range(rnd.randint(1, 4))]
        self.log: dict[str, list[Entry]] = {k: [] for k in self.keys}
        self.group = _Group(self.keys, rnd)
        self.moment = 0
        self.next_value = 1
        self.fresh = first_process + PROCESS_SPAN // 2  # processes of injected operations
        self.pending: list[tuple[Op, list[tuple[str, int]]]] = []  # info effects not landed yet
        self.effects: dict[int, Op] = {}
        self.witnesses: dict[str, dict[tuple, str]] = {t: {} for t in PREDICTED}
        self.expected: set[str] = set()
        self.detail: dict = {}
        self.injected = False
        self.fault_armed = False  # aborted / lost: waiting for the operation to act on
        self.fault_due = False  # waiting for something to act on

    # --- the broker ------------------------------------------------------

    def tick(self) -> int:
        self.moment += 1
        return self.moment

    def value(self) -> int:
        self.next_value += 1
        return self.next_value - 1

    def append(self, key: str, value: int, op: Op | None, acked: bool = False) -> int:
        t = self.tick()
        entry = Entry(value, op, acked=acked)
        if acked and self.fault == "lost" and self.fault_armed:
            entry.visible = False
            self.fault_armed = False
            self.injected = True
            self.detail = {"key": key, "value": value, "offset": len(self.log[key])}
        self.log[key].append(entry)
        if op is not None:
            op.first_append.setdefault(key, t)
        return len(self.log[key]) - 1

    def sync(self, c: Consumer, op: Op) -> None:
        """A member goes through the generations it missed (inside a poll, before fetching)."""
        if c.mode != "subscribe" or c.process not in self.group.members:
            return
        current, gained = set(c.keys), set()
        for g in range(c.gen + 1, self.group.gen + 1):
            keys = set(self.group.assignments[g].get(c.process, frozenset()))
            if keys != current:
                op.rebalances.append(sorted(keys))
                gained |= keys - current
                current = keys
        for k in list(c.positions):
            if k not in current:
                del c.positions[k]
        for k in current:
            if k in gained or k not in c.positions:
                c.positions[k] = self.group.committed.get(k, 0)
                c.reset.add(k)
        c.keys, c.gen = frozenset(current), self.group.gen

    def fetch(self, c: Consumer, op: Op, most: int = 3) -> list[Record]:
        self.sync(c, op)
        t = self.tick()
        out = []
        for k in self.rnd.sample(sorted(c.positions), len(c.positions)):
            pos = c.positions[k]
            end = min(pos + self.rnd.randint(0, most), len(self.log[k]))
            got = [Record(k, o, self.log[k][o].value, False) for o in range(pos, end) if self.log[k][o].visible]
            c.positions[k] = end
            if got:
                got[0].after_reset = k in c.reset
                c.reset.discard(k)
                op.last_read[k] = t
            out += got
        if c.mode == "subscribe" and self.rnd.random() < 0.6:
            for k in c.keys:
                self.group.committed[k] = c.positions[k]
        return out

    # --- what the engines will find in a process's records -----------------

    def observe(self, c: Consumer, op: Op, records: list[Record], ok: bool) -> None:
        """Follow the engines' poll chains (process, assignment, key) over an operation's records,
        predicting their chain witnesses; mark what was read."""
        last_in_op: dict[str, Record] = {}
        for r in records:
            e = self.log[r.key][r.offset]
            e.read = True
            e.read_ok |= ok
            prev = last_in_op.get(r.key)
            if prev is not None:
                a, b = prev.offset, r.offset
                kind = "int-nonmonotonic-poll" if b <= a else "int-poll-skip" if b > a + 1 else None
                if kind:
                    self.witnesses[kind][(c.process, r.key, op.index, a, b)] = self.cause(r, a, b, op)
            else:
                before = c.chain.get((c.assignment, r.key))
                if before is not None:
                    prev_op, a = before
                    b = r.offset
                    kind = "nonmonotonic-poll" if b <= a else "poll-skip" if b > a + 1 else None
                    if kind:
                        self.witnesses[kind][(c.process, r.key, a, b, (prev_op, op.index))] = self.cause(r, a, b, op)
            last_in_op[r.key] = r
        for k, r in last_in_op.items():
            c.chain[(c.assignment, k)] = (op.index, r.offset)

    def cause(self, r: Record, a: int, b: int, op: Op) -> str:
        if r.after_reset:
            return "rebalance"
        if self.fault == "lost" and self.detail.get("key") == r.key and a < self.detail["offset"] < b:
            return "lost"
        if op.process >= self.first_process + PROCESS_SPAN // 2:
            return "fault"
        return "unexplained"  # a bug of this generator: the test fails on it

    def observe_sends(self, op: Op, acked: list[tuple[str, int, int]]) -> None:
        """int-send-skip: two acknowledged sends of one operation to a key, not adjacent."""
        last: dict[str, tuple[int, int]] = {}
        for k, v, o in acked:
            if k in last and o > last[k][1] + 1:
                self.witnesses["int-send-skip"][(op.process, k, op.index, last[k][1], o)] = "interleaved"
            last[k] = (v, o)

    # --- client operations: generators, one step per effect ----------------

    def retire(self, w: _Worker) -> None:
        self.group.leave(w.consumer.process)
        w.consumer = Consumer(w.consumer.process + self.concurrency)

    def finish(self, op: Op, type_: str, f: str, **fields) -> None:
        op.type = type_
        if type_ == "never":
            op.index = op.invoke
            self.rec.never(f)
        else:
            op.index = self.rec.complete(op.process, type_, f, **fields)
        self.effects[op.index] = op

    def indeterminate(self, op: Op, sends: list[tuple[str, int]]) -> Iterator:
        """The sends of an info (or never completed) operation: all now, all later, or none."""
        when = self.rnd.choice(["now", "later", "never"])
        if when == "now":
            for i, (k, v) in enumerate(sends):
                if i and not self.atomic:
                    yield
                self.append(k, v, op)
        elif when == "later" and sends:
            self.pending.append((op, sends))

    def send_op(self, w: _Worker) -> Iterator:
        c = w.consumer
        sends = [(self.rnd.choice(self.keys), self.value()) for _ in range(self.rnd.randint(1, 3))]
        outcome = self.rnd.choices(["ok", "fail", "info", "never"], [70, 10, 12, 8])[0]
        aborted = self.fault == "aborted" and self.fault_armed
        if aborted:
            outcome, self.fault_armed, self.injected = "fail", False, True
            self.detail = {"values": [(k, v) for k, v in sends]}
        op = Op(c.process, "send", sent=set(sends))
        op.invoke = self.rec.invoke(c.process, "send", mops=[{"f": "send", "key": k, "value": v} for k, v in sends])
        yield
        offsets: list[int | None] = [None] * len(sends)
        if outcome == "ok" or aborted:
            for i, (k, v) in enumerate(sends):
                if i and not self.atomic:
                    yield
                offsets[i] = self.append(k, v, op, acked=outcome == "ok")
            yield
        elif outcome in ("info", "never"):
            yield from self.indeterminate(op, sends)
            yield
        done = [{"f": "send", "key": k, "value": v, "offset": offsets[i] if outcome == "ok" else None}
                for i, (k, v) in enumerate(sends)]
        self.finish(op, outcome, "send", mops=done)
        if outcome == "ok":
            self.observe_sends(op, [(k, v, o) for (k, v), o in zip(sends, offsets)])
        if outcome in ("info", "never"):
            self.retire(w)

    def poll_op(self, w: _Worker, final: bool = False, most: int = 3) -> Iterator:
        c = w.consumer
        outcome = self.rnd.choices(["ok", "fail", "info"], [85, 10, 5] if not final else [90, 10, 0])[0]
        returns = outcome == "ok" or (outcome == "fail" and not final and self.rnd.random() < 0.3)
        calls = 1 if final else self.rnd.choices([1, 2], [80, 20])[0]
        op = Op(c.process, "poll")
        op.invoke = self.rec.invoke(c.process, "poll", mops=[{"f": "poll"}] * calls, final=final or None)
        yield
        fetched: list[list[Record]] = []
        for i in range(calls):
            if i and not self.atomic:
                yield
            fetched.append(self.fetch(c, op, most) if returns else [])
        yield
        if outcome == "info":
            self.finish(op, "info", "poll", mops=[{"f": "poll"}] * calls)
            self.retire(w)
            return
        done = [{"f": "poll", "records": [{"key": r.key, "offset": r.offset, "value": r.value} for r in got]}
                for got in fetched]
        self.finish(op, outcome, "poll", mops=done, final=final or None,
                    rebalance_log=[{"keys": ks} for ks in op.rebalances] or None)
        self.observe(c, op, [r for got in fetched for r in got], outcome == "ok")

    def txn_op(self, w: _Worker) -> Iterator:
        c = w.consumer
        n = self.rnd.randint(2, 4)
        kinds = ["send", "poll"] + [self.rnd.choice(["send", "poll"]) for _ in range(n - 2)]
        self.rnd.shuffle(kinds)
        mops = [("send", self.rnd.choice(self.keys), self.value()) if kind == "send" else ("poll",) for kind in kinds]
        sends = [(m[1], m[2]) for m in mops if m[0] == "send"]
        outcome = self.rnd.choices(["ok", "fail", "info", "never"], [75, 8, 10, 7])[0]
        op = Op(c.process, "txn", sent=set(sends))
        op.invoke = self.rec.invoke(c.process, "txn", mops=[
            {"f": "send", "key": m[1], "value": m[2]} if m[0] == "send" else {"f": "poll"} for m in mops])
        yield
        if outcome == "ok":
            done, records, acked = [], [], []
            for i, m in enumerate(mops):
                if i and not self.atomic:
                    yield
                if m[0] == "send":
                    o = self.append(m[1], m[2], op, acked=True)
                    acked.append((m[1], m[2], o))
                    done.append({"f": "send", "key": m[1], "value": m[2], "offset": o})
                else:
                    got = self.fetch(c, op)
                    records += got
                    done.append({"f": "poll", "records": [{"key": r.key, "offset": r.offset, "value": r.value}
                                                          for r in got]})
            yield
            self.finish(op, "ok", "txn", mops=done, rebalance_log=[{"keys": ks} for ks in op.rebalances] or None)
            self.observe(c, op, records, True)
            self.observe_sends(op, acked)
            for r in records:
                if (r.key, r.value) in op.sent:
                    self.witnesses["precommitted-read"][(op.process, r.key, op.index, r.value, r.offset)] = \
                        "own write"
            return
        if outcome in ("info", "never"):
            yield from self.indeterminate(op, sends)
        yield
        done = [{"f": "send", "key": m[1], "value": m[2], "offset": None} if m[0] == "send" else {"f": "poll"}
                for m in mops]
        self.finish(op, outcome, "txn", mops=done)
        if outcome in ("info", "never"):
            self.retire(w)

    def assign_op(self, w: _Worker, keys: list[str] | None = None, seek: bool | None = None,
                  final: bool = False) -> Iterator:
        c = w.consumer
        keys = keys or sorted(self.rnd.sample(self.keys, self.rnd.randint(1, len(self.keys))))
        seek = self.rnd.random() < 0.4 if seek is None else seek
        outcome = "ok" if final else self.rnd.choices(["ok", "fail", "info"], [90, 5, 5])[0]
        op = Op(c.process, "assign")
        fields = {"keys": keys, "seek_to_beginning": True if seek else None, "final": final or None}
        op.invoke = self.rec.invoke(c.process, "assign", **fields)
        c.assignment += 1
        yield
        ends = None
        if outcome == "ok":
            self.group.leave(c.process)
            old, was = c.positions, c.mode
            c.mode, c.keys, c.reset = "assign", frozenset(keys), set()
            c.positions = {k: 0 if seek else old[k] if was == "assign" and k in old else len(self.log[k])
                           for k in keys}
            if final:
                ends = {k: len(self.log[k]) for k in keys}
        yield
        self.finish(op, outcome, "assign", **fields, end_offsets=ends)
        if outcome == "info":
            self.retire(w)

    def subscribe_op(self, w: _Worker) -> Iterator:
        c = w.consumer
        outcome = self.rnd.choices(["ok", "fail", "info"], [90, 5, 5])[0]
        op = Op(c.process, "subscribe")
        op.invoke = self.rec.invoke(c.process, "subscribe", keys=list(self.keys))
        c.assignment += 1
        yield
        if outcome == "ok":
            if c.process in self.group.members:
                self.group.rebalance()
            else:
                c.mode, c.positions, c.keys, c.reset = "subscribe", {}, frozenset(), set()
                self.group.join(c.process)
                c.gen = self.group.gen - 1
        yield
        self.finish(op, outcome, "subscribe", keys=list(self.keys))
        if outcome == "info":
            self.retire(w)

    def client_op(self, w: _Worker) -> Iterator:
        r = self.rnd.random()
        if w.consumer.mode == "none" and r < 0.5:
            return self.subscribe_op(w) if self.rnd.random() < self.subscribe else self.assign_op(w)
        # A member seldom subscribes again or leaves: its poll chain goes on through rebalances.
        member = w.consumer.mode == "subscribe"
        action = self.rnd.choices(["send", "poll", "txn", "assign", "subscribe"],
                                  [35, 30, 15, 1 + 10 * (1 - self.subscribe) * (not member),
                                   1 if member else 10 * self.subscribe])[0]
        return {"send": self.send_op, "poll": self.poll_op, "txn": self.txn_op, "assign": self.assign_op,
                "subscribe": self.subscribe_op}[action](w)

    def nemesis_op(self, f: str) -> Iterator:
        self.rec.invoke("nemesis", f, value={"grudge": {"n1": ["n2"]}})
        yield
        self.rec.complete("nemesis", "info", f, value={"grudge": {"n1": ["n2"]}})

    # --- faults ------------------------------------------------------------

    def fresh_process(self) -> int:
        self.fresh += 1
        return self.fresh - 1

    def inject(self) -> Iterator | None:
        """Try the fault now (`injected` once done, `fault_armed` while it waits for an operation to
        act on); returns the operation of fresh processes that carries it, if it needs one."""
        r, f = self.rnd, self.fault
        visible = {k: [o for o, e in enumerate(self.log[k]) if e.visible] for k in self.keys}
        k = r.choice(self.keys)
        if f == "duplicate":
            keys = [k for k in self.keys if visible[k]]
            if keys:
                k = r.choice(keys)
                v = self.log[k][r.choice(visible[k])].value
                self.append(k, v, None)
                self.injected, self.detail = True, {"key": k, "value": v}
        elif f == "unexpected":
            v = 10_000_000 + self.value()
            self.append(k, v, None)
            self.injected, self.detail = True, {"key": k, "value": v}
        elif f in ("aborted", "lost"):
            self.fault_armed = True
            return None
        elif f == "truncated":
            return None  # at the end
        elif f == "inconsistent":
            keys = [k for k in self.keys if visible[k]]
            if keys:
                k = r.choice(keys)
                self.injected = True
                return self.inconsistent_op(k, r.choice(visible[k]))
        elif f in ("int-skip", "int-rewind"):
            runs = [(k, o) for k in self.keys for o in visible[k] if o + 1 in visible[k] and o + 2 in visible[k]]
            if runs:
                k, o = r.choice(runs)
                self.injected = True
                return self.misread_op(k, [o, o + 2] if f == "int-skip" else [o + 1, o])
        elif f == "int-send-reorder":
            self.injected = True
            return self.reorder_op(k)
        return None

    def inconsistent_op(self, k: str, o: int) -> Iterator:
        w, p, q = self.value(), self.fresh_process(), self.fresh_process()
        inv = self.rec.invoke(p, "send", mops=[{"f": "send", "key": k, "value": w}])
        yield
        op = Op(p, "send", invoke=inv, sent={(k, w)})
        self.finish(op, "fail", "send", mops=[{"f": "send", "key": k, "value": w, "offset": None}])
        type_ = self.rnd.choice(["ok", "fail"])
        poll = Op(q, "poll")
        poll.invoke = self.rec.invoke(q, "poll", mops=[{"f": "poll"}])
        yield
        self.finish(poll, type_, "poll", mops=[{"f": "poll", "records": [{"key": k, "offset": o, "value": w}]}])
        self.detail = {"key": k, "offset": o, "values": sorted([self.log[k][o].value, w]), "poll": type_}
        self.expected |= {"uncommitted-read", "G1a"} if type_ == "ok" else set()

    def misread_op(self, k: str, offsets: list[int]) -> Iterator:
        c = Consumer(self.fresh_process())
        op = Op(c.process, "poll")
        op.invoke = self.rec.invoke(c.process, "poll", mops=[{"f": "poll"}])
        yield
        records = [Record(k, o, self.log[k][o].value, False) for o in offsets]
        self.finish(op, "ok", "poll", mops=[{"f": "poll", "records": [
            {"key": r.key, "offset": r.offset, "value": r.value} for r in records]}])
        self.observe(c, op, records, True)
        self.detail = {"key": k, "offsets": offsets}

    def reorder_op(self, k: str) -> Iterator:
        p = self.fresh_process()
        v1, v2 = self.value(), self.value()
        op = Op(p, "send", sent={(k, v1), (k, v2)})
        op.invoke = self.rec.invoke(p, "send", mops=[{"f": "send", "key": k, "value": v} for v in (v1, v2)])
        yield
        o2 = self.append(k, v2, op, acked=True)
        o1 = self.append(k, v1, op, acked=True)
        yield
        self.finish(op, "ok", "send", mops=[{"f": "send", "key": k, "value": v1, "offset": o1},
                                            {"f": "send", "key": k, "value": v2, "offset": o2}])
        self.detail = {"key": k, "offsets": [o1, o2]}

    # --- the run -----------------------------------------------------------

    def run(self) -> Run:
        r = self.rnd
        workers = [_Worker(i, self.first_process + i) for i in range(self.concurrency)]
        nemesis: Iterator | None = None
        faulty: Iterator | None = None
        started = 0
        inject_at = r.randrange(max(self.ops, 1))
        while started < self.ops or any(w.task for w in workers) or nemesis or faulty:
            if self.fault and not self.injected and not self.fault_armed and started >= inject_at and not faulty:
                faulty = self.inject()
            if self.group.members and r.random() < 0.03:
                self.group.rebalance()  # the group's coordinator moved: the members rejoin
            if self.pending and r.random() < 0.15:
                op, sends = self.pending.pop(r.randrange(len(self.pending)))
                for k, v in sends:
                    self.append(k, v, op)
            choices = [w for w in workers if w.task or started < self.ops]
            lanes: list[Any] = list(choices)
            if nemesis is not None or (started < self.ops and r.random() < 0.03):
                lanes.append("nemesis")
            if faulty is not None:
                lanes.append("fault")
            lane = r.choice(lanes)
            if lane == "nemesis":
                nemesis = nemesis or self.nemesis_op(r.choice(["start-partition", "stop-partition"]))
                nemesis = self.step(nemesis)
            elif lane == "fault":
                faulty = self.step(faulty)
            else:
                if lane.task is None:
                    lane.task = self.client_op(lane)
                    started += 1
                lane.task = self.step(lane.task)
        # Indeterminate effects still pending land now or never.
        for op, sends in self.pending:
            if r.random() < 0.5:
                for k, v in sends:
                    self.append(k, v, op)
        self.pending = []
        # A fault that found nothing to act on yet has a last chance.
        if self.fault and not self.injected and self.fault not in ("aborted", "lost", "truncated"):
            got = self.inject()
            if got is not None:
                self.drain(got)
        self.drain(self.nemesis_op("heal"))
        if self.fault == "truncated":
            self.truncate()
        self.final_reads(workers)
        return self.result()

    @staticmethod
    def step(task: Iterator) -> Iterator | None:
        try:
            next(task)
            return task
        except StopIteration:
            return None

    def drain(self, task: Iterator) -> None:
        while task is not None:
            task = self.step(task)

    def truncate(self) -> None:
        keys = [k for k in self.keys if len(self.log[k]) >= 2 and self.log[k][-1].acked and self.log[k][-1].visible]
        if keys:
            k = self.rnd.choice(keys)
            e = self.log[k].pop()
            self.injected = True
            self.expected.add("uncommitted-read" if e.read_ok else "unseen")
            self.detail = {"key": k, "value": e.value, "offset": len(self.log[k]), "read": e.read_ok}

    def final_reads(self, workers: list[_Worker]) -> None:
        keys = list(self.keys)
        self.rnd.shuffle(keys)
        readers = workers[:min(len(workers), len(keys))]
        groups = [keys[i::len(readers)] for i in range(len(readers))]
        tasks = {w.number: self.final_read(w, sorted(ks)) for w, ks in zip(readers, groups)}
        while tasks:
            n = self.rnd.choice(sorted(tasks))
            if self.step(tasks[n]) is None:
                del tasks[n]

    def final_read(self, w: _Worker, keys: list[str]) -> Iterator:
        yield from self.assign_op(w, keys, seek=True, final=True)
        while any(w.consumer.positions[k] < len(self.log[k]) for k in keys):
            yield from self.poll_op(w, final=True, most=4)
        yield from self.assign_op(w, keys, seek=False, final=True)

    def result(self) -> Run:
        expected = set(self.expected)
        if self.injected:
            expected |= FAULT_TYPES[self.fault]
            if self.fault == "lost":
                k, o = self.detail["key"], self.detail["offset"]
                if any(e.visible for e in self.log[k][o + 1:]):
                    expected.add("lost-write")
        else:
            expected = set()
        witnesses = {t: ws for t, ws in self.witnesses.items() if ws}
        expected |= set(witnesses)
        finals = {k: (len(log), [e.value for e in log if e.visible]) for k, log in self.log.items()}
        return Run(self.name, self.keys, self.fault, self.injected, expected, witnesses, self.detail, self.atomic,
                   self.effects, finals, self.first_process)


def generate(rec: Recorder, name: str, rnd: random.Random, fault: str | None, first_process: int,
             **shape) -> Run:
    return Scenario(rec, name, rnd, fault, first_process, **shape).run()
