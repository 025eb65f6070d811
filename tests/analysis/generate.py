"""Histories of a correct broker, with at most one injected fault.

In: a Builder to append to, a scenario name (prefix of its keys), a
`random.Random` and the fault to inject (None for a correct run).
Out: the scenario's keys and the anomaly types the analysis must report
for them, exactly.

The broker is an in-memory log per key. Clients send (ok: appended and
acknowledged with offsets; fail: not appended; info or never completed:
appended or not, all values of the operation alike, and the process is
replaced), assign keys (optionally seeking to the beginning; otherwise a
newly owned key starts at the log end) and poll contiguous ranges from
their positions. At the end one fresh consumer assigns every key with
seek_to_beginning, told where each log ends (`end_offsets`), and reads
every log to its end.

Faults and what they must produce:
- "duplicate": the log holds a second copy of a value -> {duplicate}.
- "unexpected": the log holds a value nobody sent -> {unexpected}.
- "inconsistent": a poll by a fresh process returns, at an existing offset,
  the value of a failed send. A failed poll -> {inconsistent-offsets, G1a}
  (a failed poll's records are evidence: it read a failed send's value);
  an ok poll -> {inconsistent-offsets, uncommitted-read, G1a} (the final log
  holds the other value there, so the ok poll read something uncommitted).
- "aborted": a send is reported failed, yet its value is appended -> {G1a}
  (the final reads return it).
- "int-skip" / "int-rewind": a fresh process's ok poll returns two records
  of a key out of step: offsets o, o+2 while o+1 exists -> {int-poll-skip};
  o+1 then o -> {int-nonmonotonic-poll}.
- "int-send-reorder": one ok send of two values to a key, acknowledged at
  o+1 and o (the log holds them in that reverse order) -> {int-nonmonotonic-send}.
- "int-send-skip": one ok send of two values to a key, acknowledged at o and
  o+2, with a third value (an indeterminate send of another process)
  between them -> {int-send-skip}.
- "write-cycle": two ok sends, each of a value to two keys, whose values
  stand in one order in the first key's log and in the other order in the
  second's -> {G0} (found by the checker's cycle search, from the
  engines' dependencies).
- "lost": an acknowledged record never becomes visible (readers step over
  its offset) -> {unseen}, plus lost-write when a later record of the key
  exists (the final read passes the offset), plus poll-skip when a poll
  boundary falls on the hole (the acknowledged offset is in the log), and
  int-poll-skip when one poll returns records on both sides of it. The
  oracle below tracks consumer chains to know which.
- "truncated": just before the final reads, the log of a key loses its last
  record, acknowledged by an ok send (a leader that never replicated it was
  replaced); the final reads are told the shorter end and reach it ->
  {lost-write} (the complete final log lacks a committed write), plus
  uncommitted-read when an ok poll had read the record, unseen otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from faultline.models.history import write_history

from .histories import Builder

FAULTS = (None, "duplicate", "unexpected", "inconsistent", "lost", "aborted", "int-skip", "int-rewind",
          "int-send-reorder", "int-send-skip", "write-cycle", "truncated")


@dataclass
class Entry:
    value: int
    visible: bool = True
    acked: bool = False  # by an ok send, at its offset
    read_ok: bool = False  # returned by an ok poll


@dataclass
class Consumer:
    process: int
    positions: dict[str, int] = field(default_factory=dict)
    # last offset read per key since the last assign: the poll chain of the analysis
    last: dict[str, int] = field(default_factory=dict)


@dataclass
class Generated:
    name: str
    keys: list[str]
    fault: str | None
    expected: set[str]
    detail: dict = field(default_factory=dict)


class _Run:
    def __init__(self, b: Builder, name: str, rnd: random.Random, fault: str | None):
        self.b, self.rnd, self.fault = b, rnd, fault
        self.keys = [f"{name}-t/{i}" for i in range(rnd.randint(1, 3))]
        self.log: dict[str, list[Entry]] = {k: [] for k in self.keys}
        self.next_value = 1
        self.expected: set[str] = set()
        self.detail: dict = {}
        self.hole_pending = False
        self.truncate_pending = False

    def value(self) -> int:
        self.next_value += 1
        return self.next_value - 1

    def visible(self, k: str) -> list[int]:
        return [o for o, e in enumerate(self.log[k]) if e.visible]

    # --- client operations ---------------------------------------------

    def send(self, c: Consumer) -> Consumer:
        r = self.rnd
        mops = [(r.choice(self.keys), self.value()) for _ in range(r.randint(1, 2))]
        outcome = r.choices(["ok", "fail", "info", "never"], [70, 12, 12, 6])[0]
        if outcome == "ok":
            sends = []
            for k, v in mops:
                entry = Entry(v, acked=True)
                if self.hole_pending:
                    entry.visible = False
                    self.hole_pending = False
                    self.detail = {"key": k, "value": v, "offset": len(self.log[k])}
                self.log[k].append(entry)
                sends.append((k, v, len(self.log[k]) - 1))
            self.b.send(c.process, sends, "ok")
            return c
        if outcome == "fail":
            self.b.send(c.process, [(k, v, None) for k, v in mops], "fail")
            return c
        if r.random() < 0.5:  # an indeterminate send may well have happened
            for k, v in mops:
                self.log[k].append(Entry(v))
        self.b.send(c.process, [(k, v, None) for k, v in mops], "info", completed=outcome == "info")
        return Consumer(self.b.process())

    def assign(self, c: Consumer, keys: list[str] | None = None, seek: bool | None = None,
               ends: bool = False) -> None:
        """ends: the broker says where each key's log ends (the final reads ask)."""
        r = self.rnd
        keys = keys or r.sample(self.keys, r.randint(1, len(self.keys)))
        seek = r.random() < 0.4 if seek is None else seek
        f = "assign" if seek or r.random() < 0.7 else "subscribe"
        c.positions = {k: 0 if seek else c.positions.get(k, len(self.log[k])) for k in keys}
        # A poll chain goes on through an assign that keeps the key without rewinding (Jepsen's
        # poll-skip+nonmonotonic-cases): only a dropped or rewound key starts afresh.
        c.last = {k: o for k, o in c.last.items() if k in keys and not seek}
        self.b.assign(c.process, keys, seek=seek, f=f, ends={k: len(self.log[k]) for k in keys} if ends else None)

    def poll(self, c: Consumer, most: int = 3, outcome: str | None = None) -> Consumer:
        r = self.rnd
        outcome = outcome or r.choices(["ok", "fail", "info"], [85, 10, 5])[0]
        if outcome != "ok":  # a timeout or an error: nothing returned, nothing consumed
            self.b.poll(c.process, [], outcome)
            return c if outcome == "fail" else Consumer(self.b.process())
        records = []
        for k in r.sample(list(c.positions), len(c.positions)):
            pos = c.positions[k]
            n = r.randint(0, most)
            got = [(k, o, self.log[k][o].value) for o in range(pos, min(pos + n, len(self.log[k])))
                   if self.log[k][o].visible]
            for _, o, _ in got:
                self.log[k][o].read_ok = True
            c.positions[k] = min(pos + n, len(self.log[k]))
            if got:
                if k in c.last and got[0][1] > c.last[k] + 1:
                    self.expected.add("poll-skip")
                if any(b[1] > a[1] + 1 for a, b in zip(got, got[1:])):
                    self.expected.add("int-poll-skip")
                c.last[k] = got[-1][1]
            records += got
        self.b.poll(c.process, records, "ok")
        return c

    # --- faults ----------------------------------------------------------

    def inject(self, slots: list[Consumer]) -> None:
        r, k = self.rnd, self.rnd.choice(self.keys)
        if self.fault == "duplicate" and self.visible(k):
            v = self.log[k][r.choice(self.visible(k))].value
            self.log[k].append(Entry(v))
            self.expected.add("duplicate")
            self.detail = {"key": k, "value": v}
        elif self.fault == "unexpected":
            v = 10_000_000 + self.value()
            self.log[k].append(Entry(v))
            self.expected.add("unexpected")
            self.detail = {"key": k, "value": v}
        elif self.fault == "inconsistent" and self.visible(k):
            o = r.choice(self.visible(k))
            w = self.value()
            self.b.send(slots[0].process, [(k, w, None)], "fail")
            type_ = r.choice(["ok", "fail"])
            self.b.poll(self.b.process(), [(k, o, w)], type_)
            self.expected |= {"inconsistent-offsets", "G1a"} | ({"uncommitted-read"} if type_ == "ok" else set())
            self.detail = {"key": k, "offset": o, "values": sorted([self.log[k][o].value, w]), "poll": type_}
        elif self.fault == "lost":
            self.hole_pending = True
        elif self.fault == "truncated":
            self.truncate_pending = True
        elif self.fault == "aborted":
            w = self.value()
            self.b.send(slots[0].process, [(k, w, None)], "fail")
            self.log[k].append(Entry(w))
            self.expected.add("G1a")
            self.detail = {"key": k, "value": w}
        elif self.fault in ("int-skip", "int-rewind"):
            seen = self.visible(k)
            runs = [o for o in seen if o + 1 in seen and o + 2 in seen]
            if runs:
                o = r.choice(runs)
                pair = [o, o + 2] if self.fault == "int-skip" else [o + 1, o]
                self.b.poll(self.b.process(), [(k, p, self.log[k][p].value) for p in pair], "ok")
                self.expected.add("int-poll-skip" if self.fault == "int-skip" else "int-nonmonotonic-poll")
                self.detail = {"key": k, "offsets": pair}
        elif self.fault == "write-cycle" and len(self.keys) >= 2:
            k1, k2 = r.sample(self.keys, 2)
            a1, a2, b1, b2 = (self.value() for _ in range(4))
            o1, o2 = len(self.log[k1]), len(self.log[k2])
            self.log[k1] += [Entry(a1), Entry(b1)]
            self.log[k2] += [Entry(b2), Entry(a2)]
            self.b.send(slots[0].process, [(k1, a1, o1), (k2, a2, o2 + 1)], "ok")
            self.b.send(slots[1].process, [(k1, b1, o1 + 1), (k2, b2, o2)], "ok")
            self.expected.add("G0")
            self.detail = {"keys": [k1, k2]}
        elif self.fault == "int-send-reorder":
            v1, v2, o = self.value(), self.value(), len(self.log[k])
            self.log[k] += [Entry(v2), Entry(v1)]
            self.b.send(slots[0].process, [(k, v1, o + 1), (k, v2, o)], "ok")
            self.expected.add("int-nonmonotonic-send")
            self.detail = {"key": k, "offsets": [o + 1, o]}
        elif self.fault == "int-send-skip":
            v1, w, v2, o = self.value(), self.value(), self.value(), len(self.log[k])
            self.log[k] += [Entry(v1), Entry(w), Entry(v2)]
            self.b.send(self.b.process(), [(k, w, None)], "info")
            self.b.send(slots[0].process, [(k, v1, o), (k, v2, o + 2)], "ok")
            self.expected.add("int-send-skip")
            self.detail = {"key": k, "offsets": [o, o + 2]}

    def run(self, steps: int) -> None:
        r = self.rnd
        slots = [Consumer(self.b.process()) for _ in range(r.randint(2, 3))]
        inject_at = r.randrange(steps)
        for step in range(steps):
            if step == inject_at:
                self.inject(slots)
            i = r.randrange(len(slots))
            action = r.choices(["send", "poll", "assign"], [45, 40, 15])[0]
            if action == "send":
                slots[i] = self.send(slots[i])
            elif action == "assign":
                self.assign(slots[i])
            else:
                slots[i] = self.poll(slots[i])
        if self.truncate_pending:
            # A record below it stays, so that the final reads return something.
            cut = [k for k in self.keys if len(self.log[k]) >= 2 and self.log[k][-1].acked]
            if cut:
                k = r.choice(cut)
                e = self.log[k].pop()
                self.expected |= {"lost-write", "uncommitted-read" if e.read_ok else "unseen"}
                self.detail = {"key": k, "value": e.value, "offset": len(self.log[k]), "read": e.read_ok}
        # The final reads: one fresh consumer reads every key from the beginning.
        final = Consumer(self.b.process())
        self.assign(final, list(self.keys), seek=True, ends=True)
        while any(final.positions[k] < len(self.log[k]) for k in self.keys):
            self.poll(final, most=4, outcome="ok")
        if self.detail and self.fault == "lost":
            k, o = self.detail["key"], self.detail["offset"]
            self.expected.add("unseen")
            if any(p > o for p in self.visible(k)):
                self.expected.add("lost-write")


def generate(b: Builder, name: str, rnd: random.Random, fault: str | None, steps: int = 20) -> Generated:
    run = _Run(b, name, rnd, fault)
    run.run(steps)
    return Generated(name, run.keys, fault, run.expected, run.detail)


def write_with_anomalies(directory: Path) -> set[str]:
    """directory/history.jsonl: six scenarios, five with a fault; the anomaly types they must show."""
    b = Builder()
    rnd = random.Random(11)
    runs = [generate(b, f"s{i}", rnd, fault, 12)
            for i, fault in enumerate([None, "duplicate", "lost", "write-cycle", "int-rewind", "aborted"])]
    write_history(directory / "history.jsonl", b.lines)
    return set().union(*(r.expected for r in runs))
