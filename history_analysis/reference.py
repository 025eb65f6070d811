"""The analysis in plain Python, in one process: history.jsonl -> Analysis.

In: the path of a history (shared/history-format.md), read and validated by
`faultline.models.history.read_history`.
Out: the same `Analysis` the Spark engine (`anomalies.analyse`) gives:
counts per anomaly type, the first `limit` witnesses of each in the shared
order, operation statistics and notes; with `full_dir`, every witness in
`full_dir/<type>.jsonl`. Malformed histories raise `HistoryError`.

Each definition of `anomalies.py` is written out here directly, over lists
and dicts, without sharing code with the Spark engine: this is the oracle
the Spark engine is tested against, and `faultline check --engine python`
for histories that fit in memory.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..models.history import read_history
from .ownership import TYPE as OWNERSHIP
from .ownership import Call, End, overlaps, typed_entries
from .result import (SKIPPED_SHOWN, TYPES, UNEXPECTED_OPS, UNSEEN_VALUES, Analysis, unjudged_note,
                     witness_json, witness_order)


@dataclass
class Event:
    """One fact about a key: a record a poll returned ('r') or a send micro-operation ('s')."""
    kind: str
    key: str
    op: int
    process: Any
    type: str
    offset: int | None
    value: int | None
    pos: int
    # A send the broker acknowledged at `offset` (see `_acknowledge`); reads are never acked.
    acked: bool = False


@dataclass
class Operation:
    op: int
    invoke: int
    process: Any
    type: str
    f: str
    mops: list
    keys: list
    seek: bool
    # A final read's assign: where the broker said each key's log ends (history-format.md).
    end_offsets: dict | None = None
    # The keys a rebalance during the operation assigned or revoked (its rebalance_log).
    rebalanced: frozenset = frozenset()
    # Its rebalance_log's typed entries, as (type, keys) in order (ownership.typed_entries).
    rebalance: tuple = ()
    # A final-reads record: per key, where the final reader aimed, how far it read, and how it ended.
    final_reads: list | None = None
    # A poll's: where its consumer found a key's end (history-format.md, positions).
    positions: dict | None = None
    # A process operation's records; a commit's (or committed's) offsets.
    processed: list | None = None
    offsets: dict | None = None


def operations(ops: list[dict], real: int) -> tuple[list[Operation], dict[str, int]]:
    """Pair invocations with completions: (client operations, stats). `ops[real:]` are
    the reader's made-up completions of invocations the history never completed."""
    open_ops: dict[Any, dict] = {}
    out: list[Operation] = []
    stats = {"ops": 0, "ok": 0, "fail": 0, "info": 0, "mixed": 0}
    for op in ops:
        process = op["process"]
        if op["type"] == "invoke":
            open_ops[process] = op
            if process != "nemesis":
                stats["ops"] += 1
            continue
        inv = open_ops.pop(process)
        if process == "nemesis":
            if op["f"] == "heal" and op.get("error") is not None and op["index"] < real:
                stats.setdefault("heal_errors", []).append({"op": inv["index"], "error": op["error"]})
            continue
        stats[op["type"]] += 1
        by_f = stats.setdefault("by_f", {})
        counts = by_f.setdefault(op["f"], {"invoked": 0, "ok": 0})
        counts["invoked"] += 1
        counts["ok"] += op["type"] == "ok"
        # An operation the history never completed is named by its invocation.
        index = inv["index"] if op["index"] >= real else op["index"]
        mops = op.get("mops")
        if mops is None:
            mops = inv.get("mops")
        keys = op.get("keys") if op.get("keys") is not None else inv.get("keys")
        seek = op.get("seek_to_beginning")
        seek = inv.get("seek_to_beginning") if seek is None else seek
        ends = op.get("end_offsets") if op["type"] == "ok" else None
        mops = mops or []
        fs = {m.get("f") for m in mops}
        stats["mixed"] += "send" in fs and "poll" in fs
        rebalance_log = op.get("rebalance_log") if op.get("rebalance_log") is not None else inv.get("rebalance_log")
        rebalanced = frozenset(k for entry in rebalance_log or [] for k in entry.get("keys") or [])
        finals = op.get("final_reads") if op["f"] == "final-reads" and op["index"] < real else None
        out.append(Operation(index, inv["index"], process, op["type"], op["f"], mops, keys or [], bool(seek),
                             ends, rebalanced, typed_entries(rebalance_log), finals, op.get("positions"),
                             op.get("processed"), op.get("offsets")))
    return out, stats


def events(ops: list[Operation]) -> tuple[list[Event], list[tuple[str, Operation]]]:
    """Every send and read of the history, and each ok seek_to_beginning assign per key it names."""
    out: list[Event] = []
    seeks: list[tuple[str, Operation]] = []
    for o in ops:
        for mpos, mop in enumerate(o.mops):
            if mop.get("f") == "poll":
                for i, r in enumerate(mop.get("records") or []):
                    out.append(Event("r", r["key"], o.op, o.process, o.type, r["offset"], r["value"],
                                     mpos * 4294967296 + i))
            else:
                out.append(Event("s", mop["key"], o.op, o.process, o.type, mop.get("offset"), mop.get("value"), mpos))
        if o.type == "ok" and o.f == "assign" and o.seek:
            for key in dict.fromkeys(o.keys):
                seeks.append((key, o))
    _acknowledge(out, {o.op for o in ops if o.f == "send"})
    return out, seeks


def _acknowledge(evs: list[Event], plain_sends: set[int]) -> None:
    """Mark the sends the broker acknowledged (the spec's 'acknowledged'): with an offset, in an ok
    operation; in an info operation of plain sends (each record acknowledged on its own); or in an
    info operation that took effect (a value of it was read: Jepsen's `must-have-committed?`), since
    the offsets of a transaction whose commit is unknown do not alone prove it committed."""
    read = {(e.key, e.value) for e in evs if e.kind == "r"}
    took_effect = {e.op for e in evs if e.kind == "s" and e.type == "info" and (e.key, e.value) in read}
    for e in evs:
        if e.kind == "s" and e.offset is not None:
            e.acked = e.type == "ok" or (e.type == "info" and (e.op in plain_sends or e.op in took_effect))


@dataclass
class FinalLog:
    """A key's final log (result.FINAL_READS): the last assign with seek_to_beginning naming it
    (`assign`, None if there is none), the broker's end offset for it (`end`, None if the history
    does not say), how far the final chain read (`read_to`: one past the highest offset), one past
    the highest offset any evidence shows (`known_end`), and the values it read by offset."""

    key: str
    assign: int | None
    end: int | None
    known_end: int
    read_to: int = 0
    # One past the highest offset shown by operations that completed after the assign: the log
    # grew after its final read began, so that read is not of the final log.
    late_end: int = 0
    values: dict = None  # offset -> [(op, value)]
    # How the harness's final reader says its read of the key ended (history-format.md, Final reads).
    outcome: str | None = None

    def __post_init__(self):
        self.values = {} if self.values is None else self.values

    @property
    def complete(self) -> bool:
        """Whether the final chain read the whole log: to the broker's end offset, or where the
        history does not give one, past every offset anything showed; and past every offset shown
        by operations that completed after its assign."""
        return (self.assign is not None and self.read_to >= self.late_end
                and self.read_to >= (self.end if self.end is not None else self.known_end))

    def end_fields(self) -> dict:
        return {"final_end": self.end, "final_read_to": self.read_to}

    def summary(self) -> dict:
        return {"key": self.key, "assign": self.assign, "end": self.end, "read_to": self.read_to,
                "known_end": self.known_end, "late_end": self.late_end, "complete": self.complete,
                "outcome": self.outcome}


class Found:
    """Witnesses by type, each with its sort key and weight."""

    def __init__(self):
        self.rows: dict[str, list[tuple[tuple, int, str]]] = defaultdict(list)

    def add(self, kind: str, witness: dict, s1: int, s3: int, weight: int = 1) -> None:
        text = witness_json(witness)
        self.rows[kind].append((witness_order(s1, witness["key"], s3, text), weight, text))


def _rows(found: Found, kind: str):
    return ((order, weight, json.loads(text)) for order, weight, text in found.rows.get(kind, []))


class Log:
    """The distinct offsets each key's log is known to hold, sorted."""

    def __init__(self, evs: Iterable[Event]):
        offsets: dict[str, set[int]] = defaultdict(set)
        for e in evs:
            offsets[e.key].add(e.offset)
        self.offsets = {k: sorted(v) for k, v in offsets.items()}

    def between(self, key: str, a: int, b: int) -> list[int]:
        """The log's offsets strictly between a and b."""
        offs = self.offsets.get(key, [])
        return offs[bisect.bisect_right(offs, a):bisect.bisect_left(offs, b)]


def _in_log(e: Event) -> bool:
    return e.kind == "r" or e.acked


def _send_position(e: Event, pos: dict[tuple, int]) -> int | None:
    """A send's position in the version order: its own acknowledged offset (the log holds its
    value there), or else its value's position (the lowest offset the log holds it at; None:
    nowhere). A value sent again by a later operation is placed where that one wrote it."""
    return e.offset if e.acked else pos.get((e.key, e.value))


def _skip_fields(log: Log, key: str, a: int, b: int) -> tuple[list[int], int]:
    inside = log.between(key, a, b)
    return inside[:SKIPPED_SHOWN], len(inside)


def _duplicate_and_inconsistent(evs: list[Event], facts: dict[tuple, int], found: Found) -> None:
    """duplicate (a value at two offsets, more than the producer sessions that sent it) or
    resent-duplicate (no more than those sessions), inconsistent-offsets (polls returned two values at one
    offset) and reused-offset (an offset acknowledged for a value that no poll returned there
    holds another value: the acknowledged write was lost and its offset given to another)."""
    by_value: dict[tuple, list] = defaultdict(list)
    for (key, offset, value), op in facts.items():
        by_value[(key, value)].append((offset, op))
    senders: dict[tuple, set] = defaultdict(set)  # (key, value) -> {(op, process, type)} of its sends
    for e in evs:
        if e.kind == "s":
            senders[(e.key, e.value)].add((e.op, e.process, e.type))
    for (key, value), e in by_value.items():
        if len(e) >= 2:
            e.sort()
            sends = [{"op": op, "process": process, "type": type_}
                     for op, process, type_ in sorted(senders.get((key, value), ()))]
            sessions = len({s["process"] for s in sends})
            kind = "resent-duplicate" if 2 <= len(e) <= sessions else "duplicate"
            found.add(kind, {"key": key, "value": value, "offsets": [o for o, _ in e],
                             "ops": [op for _, op in e], "sends": sends}, min(op for _, op in e), value)
    read: dict[tuple, dict[int, int]] = defaultdict(dict)  # (key, offset) -> value -> first op
    acked: dict[tuple, dict[int, int]] = defaultdict(dict)
    for e in evs:
        if _in_log(e):
            side = read if e.kind == "r" else acked
            values = side[(e.key, e.offset)]
            values[e.value] = min(values.get(e.value, e.op), e.op)
    for (key, offset), values in read.items():
        if len(values) >= 2:
            e = sorted((v, op) for v, op in values.items())
            found.add("inconsistent-offsets", {"key": key, "offset": offset, "values": [v for v, _ in e],
                                               "ops": [op for _, op in e]}, min(op for _, op in e), offset)
    for (key, offset), values in acked.items():
        there = {**values, **read.get((key, offset), {})}
        for value, send_op in sorted(values.items()):
            if value in read.get((key, offset), {}):
                continue
            others = [(op, v) for v, op in there.items() if v != value]
            if others:
                other_op, other = min(others)
                found.add("reused-offset", {"key": key, "offset": offset, "value": value, "send_op": send_op,
                                            "other_value": other, "other_op": other_op,
                                            "ops": [send_op, other_op]}, min(send_op, other_op), offset)


def _lost_and_unseen(evs: list[Event], finals: dict[str, FinalLog], found: Found) -> None:
    """lost-write (over acknowledged sends: the committed writes whose offset is known; Jepsen's
    lost-write-cases) and unseen (Jepsen's unseen)."""
    read = {(e.key, e.value) for e in evs if e.kind == "r"}
    read_ok = {(e.key, e.value) for e in evs if e.kind == "r" and e.type == "ok"}
    ok_reads: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in evs:
        if e.kind == "r" and e.type == "ok":
            ok_reads[e.key].append((e.offset, e.op))
    # Per key, the earliest ok poll (by op) among those that returned an offset above o.
    passed_above: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
    for key, reads in ok_reads.items():
        reads.sort()
        offsets, best, running = [], [], None
        for offset, op in reversed(reads):
            running = (op, offset) if running is None or (op, offset) < running else running
            offsets.append(offset)
            best.append(running)
        passed_above[key] = (offsets[::-1], best[::-1])
    for e in evs:
        if not (e.acked and (e.key, e.value) not in read):
            continue
        offsets, best = passed_above.get(e.key, ([], []))
        i = bisect.bisect_right(offsets, e.offset)
        if i < len(offsets):
            read_op, read_offset = best[i]
            found.add("lost-write", {"key": e.key, "value": e.value, "offset": e.offset, "send_op": e.op,
                                     "read_op": read_op, "read_offset": read_offset, "ops": [e.op, read_op]},
                      min(e.op, read_op), e.offset)
    # A committed write the complete final log does not hold where it was acknowledged: cut from
    # the tail (the log now ends before it), or replaced; read before or not.
    flagged = {(w["key"], w["value"]) for _, _, w in _rows(found, "lost-write")}
    for e in evs:
        if not (e.acked and (e.key, e.value) not in flagged):
            continue
        log = finals.get(e.key)
        if log is None or log.assign is None or not log.complete or log.end is None:
            continue
        there = log.values.get(e.offset, [])
        if e.value in {v for _, v in there}:
            continue
        flagged.add((e.key, e.value))
        found.add("lost-write", {"key": e.key, "value": e.value, "offset": e.offset, "send_op": e.op,
                                 "final_value": min(there)[1] if there else None, "final_assign": log.assign,
                                 **log.end_fields(), "ops": [e.op, log.assign]},
                  min(e.op, log.assign), e.offset)
    # Acknowledged sends, and ok sends whose offset the client could not learn (acks=0).
    unseen: dict[str, list[Event]] = defaultdict(list)
    for e in evs:
        if e.kind == "s" and (e.acked or e.type == "ok") and (e.key, e.value) not in read_ok:
            unseen[e.key].append(e)
    for key, es in unseen.items():
        first = sorted(es, key=lambda e: (e.op, e.pos))[:UNSEEN_VALUES]
        found.add("unseen", {"key": key, "count": len(es), "values": [e.value for e in first],
                             "offsets": [e.offset for e in first], "ops": [e.op for e in first]},
                  first[0].op, 0, weight=len(es))


def _unexpected_and_aborted(evs: list[Event], found: Found) -> None:
    senders: dict[tuple, list[Event]] = defaultdict(list)
    for e in evs:
        if e.kind == "s":
            senders[(e.key, e.value)].append(e)
    unexpected: dict[tuple, list[Event]] = defaultdict(list)
    aborted: dict[tuple, list[Event]] = defaultdict(list)
    for e in evs:
        if e.kind != "r":
            continue
        sends = senders.get((e.key, e.value))
        if not sends:
            unexpected[(e.key, e.value)].append(e)
        elif all(s.type == "fail" for s in sends):
            aborted[(e.key, e.value)].append(e)
    for (key, value), es in unexpected.items():
        first = min(es, key=lambda e: (e.op, e.pos))
        ops = sorted({e.op for e in es})
        found.add("unexpected", {"key": key, "value": value, "offset": first.offset,
                                 "offsets": sorted({e.offset for e in es}), "reads": len(ops),
                                 "ops": ops[:UNEXPECTED_OPS]}, ops[0], value)
    # G1a (Jepsen's g1a-cases, but over readers of any outcome: a failed poll's records are evidence).
    for (key, value), es in aborted.items():
        first = min(es, key=lambda e: (e.op, e.pos))
        send_op = min(s.op for s in senders[(key, value)])
        found.add("G1a", {"key": key, "value": value, "offset": first.offset, "send_op": send_op,
                          "read_op": first.op, "reads": len({e.op for e in es}), "ops": [send_op, first.op]},
                  min(send_op, first.op), value)


def _epochs(ops: list[Operation]) -> dict[Any, list[tuple[int, frozenset, bool]]]:
    """Per process, its ok assign and subscribe operations in order: (op, keys, rewinds)."""
    out: dict[Any, list[tuple[int, frozenset, bool]]] = defaultdict(list)
    for o in sorted(ops, key=lambda o: o.op):
        if o.type == "ok" and o.f in ("assign", "subscribe"):
            out[o.process].append((o.op, frozenset(o.keys), o.f == "assign" and o.seek))
    return out


def _chains(evs: list[Event], ops: list[Operation], log: Log, pos: dict[tuple, int], found: Found) -> None:
    """poll-skip, nonmonotonic-poll (across polls) and nonmonotonic-send (across sends)."""
    # A consumer's position on a key starts over only where an ok assign or subscribe of its
    # process dropped the key or rewound it (Jepsen's poll-skip+nonmonotonic-cases-per-process);
    # an assign that was refused or whose outcome is unknown changes nothing.
    epochs = _epochs(ops)

    def epoch(process, key: str, op: int) -> int:
        return sum(1 for a, keys, rewinds in epochs.get(process, ()) if a < op and (key not in keys or rewinds))

    # A transaction that failed or whose outcome is unknown is rolled back, and its consumer with
    # it (the client seeks back): it is judged against the chain but does not move it, so the next
    # poll may read its records again and one that does not is a skip (Jepsen's txn abort
    # semantics). A plain poll's records moved the consumer, whatever its outcome.
    rolled_back = {o.op for o in ops if o.f == "txn" and o.type in ("fail", "info")}
    polls: dict[tuple, dict[int, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for e in evs:
        if e.kind == "r":
            polls[(e.process, epoch(e.process, e.key, e.op), e.key)][e.op].append(e)
    for (process, _, key), by_op in polls.items():
        prev = None
        for op in sorted(by_op):
            es = sorted(by_op[op], key=lambda e: e.pos)
            if prev is not None:
                prev_op, a = prev
                b = es[0].offset
                if b <= a:
                    found.add("nonmonotonic-poll", {"process": process, "key": key, "prev_offset": a,
                                                    "next_offset": b, "ops": [prev_op, op]}, prev_op, b)
                elif b - a > 1:
                    skipped, n = _skip_fields(log, key, a, b)
                    if n:
                        found.add("poll-skip", {"process": process, "key": key, "prev_offset": a,
                                                "next_offset": b, "skipped": skipped, "skipped_count": n,
                                                "ops": [prev_op, op]}, prev_op, a)
            if op not in rolled_back:
                prev = (op, es[-1].offset)
    # A process's sends to a key, by its ok and info operations in order, are compared by their
    # positions in the version order (Jepsen's nonmonotonic-send-cases): the earlier operation's
    # last send against the later one's first. An unknown position compares with nothing.
    sends: dict[tuple, dict[int, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for e in evs:
        if e.kind == "s" and e.type in ("ok", "info"):
            sends[(e.process, e.key)][e.op].append(e)
    for (process, key), by_op in sends.items():
        prev = None
        for op in sorted(by_op):
            es = sorted(by_op[op], key=lambda e: e.pos)
            first, last = es[0], es[-1]
            a = _send_position(prev[1], pos) if prev is not None else None
            b = _send_position(first, pos)
            if a is not None and b is not None and b <= a:
                found.add("nonmonotonic-send", {"process": process, "key": key, "prev_offset": a,
                                                "next_offset": b, "prev_value": prev[1].value,
                                                "next_value": first.value, "ops": [prev[0], op]},
                          prev[0], b)
            prev = (op, last)


def _within_operations(evs: list[Event], ops: list[Operation], log: Log, pos: dict[tuple, int],
                       found: Found) -> None:
    """The int-* types and precommitted-read: facts inside one operation, of any outcome."""
    rebalanced = {o.op: o.rebalanced for o in ops if o.rebalanced}
    reads: dict[tuple, list[Event]] = defaultdict(list)
    sends: dict[tuple, list[Event]] = defaultdict(list)
    sent_by_op: dict[int, set[tuple]] = defaultdict(set)
    for e in evs:
        if e.kind == "r":
            reads[(e.op, e.key)].append(e)
        else:
            sent_by_op[e.op].add((e.key, e.value))
            sends[(e.op, e.key)].append(e)
    for (op, key), es in reads.items():
        es.sort(key=lambda e: e.pos)
        # A rebalance during the operation may have moved the consumer on this key (Jepsen's
        # int-poll-skip+nonmonotonic-cases).
        if key not in rebalanced.get(op, ()):
            for prev, e in zip(es, es[1:]):
                a, b = prev.offset, e.offset
                if b <= a:
                    found.add("int-nonmonotonic-poll", {"process": e.process, "key": key, "op": op,
                                                        "prev_offset": a, "next_offset": b, "ops": [op]}, op, b)
                elif b - a > 1:
                    skipped, n = _skip_fields(log, key, a, b)
                    if n:
                        found.add("int-poll-skip", {"process": e.process, "key": key, "op": op, "prev_offset": a,
                                                    "next_offset": b, "skipped": skipped, "skipped_count": n,
                                                    "ops": [op]}, op, a)
        # Jepsen's precommitted-read-cases, over operations of any outcome.
        own = sent_by_op.get(op, set())
        for e in es:
            if (e.key, e.value) in own:
                found.add("precommitted-read", {"process": e.process, "key": key, "op": op, "value": e.value,
                                                "offset": e.offset, "ops": [op]}, op, e.offset)
    # Consecutive sends of one operation to a key, by their positions in the version order (Jepsen's
    # int-send-skip+nonmonotonic-cases); a send whose position is unknown breaks the pair.
    for (op, key), es in sends.items():
        es.sort(key=lambda e: e.pos)
        for prev, e in zip(es, es[1:]):
            a, b = _send_position(prev, pos), _send_position(e, pos)
            if a is None or b is None:
                continue
            fields = {"process": e.process, "key": key, "op": op, "prev_offset": a, "next_offset": b,
                      "prev_value": prev.value, "next_value": e.value}
            if b <= a:
                found.add("int-nonmonotonic-send", {**fields, "ops": [op]}, op, b)
            elif b - a > 1:
                skipped, n = _skip_fields(log, key, a, b)
                if n:
                    found.add("int-send-skip", {**fields, "skipped": skipped, "skipped_count": n, "ops": [op]},
                              op, a)


def _consumption(ops: list[Operation], facts: dict[tuple, int], found: Found) -> None:
    """duplicate-consumption (a record that ok process operations processed twice or more) and
    lost-consumption (a record of the log below the highest offset an ok commit or committed
    operation gave its key, that no ok or info process operation processed)."""
    processed: dict[tuple[str, int], dict[int, tuple]] = defaultdict(dict)  # (key, offset) -> op -> (process, value)
    maybe: set[tuple[str, int]] = set()
    for o in ops:
        if o.f == "process" and o.type in ("ok", "info"):
            for r in o.processed or []:
                maybe.add((r["key"], r["offset"]))
                if o.type == "ok":
                    processed[(r["key"], r["offset"])].setdefault(o.op, (o.process, r["value"]))
    for (key, offset), by_op in processed.items():
        if len(by_op) > 1:
            ops_ = sorted(by_op)
            found.add("duplicate-consumption", {"key": key, "offset": offset, "value": by_op[ops_[0]][1],
                                                "processes": [by_op[op][0] for op in ops_], "ops": ops_},
                      ops_[0], offset)
    committed: dict[str, tuple[int, int]] = {}  # key -> (highest offset committed, the earliest op that did)
    for o in ops:
        if o.f in ("commit", "committed") and o.type == "ok":
            for key, offset in (o.offsets or {}).items():
                if key not in committed or (offset, -o.op) > (committed[key][0], -committed[key][1]):
                    committed[key] = (offset, o.op)
    for key, offset, value in facts:
        if key in committed and offset < committed[key][0] and (key, offset) not in maybe:
            upto, op = committed[key]
            found.add("lost-consumption", {"key": key, "offset": offset, "value": value, "committed": upto,
                                           "committed_op": op, "ops": [op]}, op, offset)


def _ownership(ops: list[Operation], found: Found) -> None:
    """ownership-overlap (history_analysis/ownership.py), from the client operations' rebalance logs."""
    calls = [Call(o.op, o.invoke, o.process, o.rebalance) for o in ops if o.rebalance]
    holders = {c.process for c in calls}
    ends: dict[Any, End] = {}
    for o in ops:
        if o.process in holders and (o.process not in ends or o.op > ends[o.process].op):
            ends[o.process] = End(o.op, o.invoke, o.type == "info")
    for s1, key, s3, witness in overlaps(calls, ends):
        found.add(OWNERSHIP, witness, s1, s3)


def _final_logs(evs: list[Event], ops: list[Operation], seeks: list[tuple[str, Operation]]) -> dict[str, FinalLog]:
    """result.FINAL_READS: each key's final log, as its last final read saw it."""
    start: dict[str, Operation] = {}
    for key, o in seeks:
        if key not in start or o.op > start[key].op:
            start[key] = o
    # key -> (op, end offset) of the latest assign that names it: of the chain's process from its
    # assign on, or of any process for a key without a chain.
    ends: dict[str, tuple[int, int]] = {}
    for o in ops:
        for key, end in (o.end_offsets or {}).items():
            s = start.get(key)
            if s is not None and (o.process != s.process or o.op < s.op):
                continue
            if key not in ends or o.op > ends[key][0]:
                ends[key] = (o.op, end)
    known: dict[str, int] = {}
    for e in evs:
        if _in_log(e):
            known[e.key] = max(known.get(e.key, -1), e.offset)
    logs = {key: FinalLog(key, s.op, ends[key][1] if key in ends else None, known.get(key, -1) + 1)
            for key, s in start.items()}
    for e in evs:
        s = start.get(e.key)
        if s is not None and e.op > s.op and _in_log(e):
            logs[e.key].late_end = max(logs[e.key].late_end, e.offset + 1)
        if e.kind == "r" and s is not None and e.process == s.process and e.op > s.op:
            log = logs[e.key]
            log.read_to = max(log.read_to, e.offset + 1)
            log.values.setdefault(e.offset, []).append((e.op, e.value))
    # The chain's consumer found the end past records it never returns (transaction markers).
    for o in ops:
        for key, position in (o.positions or {}).items():
            s = start.get(key)
            if s is not None and o.process == s.process and o.op > s.op:
                logs[key].read_to = max(logs[key].read_to, position)
    for key in known:
        logs.setdefault(key, FinalLog(key, None, ends[key][1] if key in ends else None, known[key] + 1))
    told: dict[str, tuple] = {}
    for o in ops:
        for i, record in enumerate(o.final_reads or ()):
            key = record["key"]
            rank = (_informative(record), o.op, i)
            if key not in told or rank > told[key][0]:
                told[key] = (rank, record["outcome"])
    for key, (_, outcome) in told.items():
        logs.setdefault(key, FinalLog(key, None, ends[key][1] if key in ends else None, known.get(key, -1) + 1))
        logs[key].outcome = outcome
    return logs


def _informative(record: dict) -> bool:
    """result.FINAL_READS: whether a final-reads record says anything of the key's log. A reader
    whose time ran out before it learned the key's end or read any of it (its predecessor's crash
    outlasted the final phase) does not."""
    return not (record["outcome"] == "timeout" and record.get("end") is None and record["read_to"] == 0)


def _uncommitted(evs: list[Event], finals: dict[str, FinalLog], found: Found) -> list[str]:
    """uncommitted-read witnesses; returns the keys no final chain covers."""
    first_read: dict[tuple, int] = {}
    ok_keys = set()
    for e in evs:
        if e.kind == "r" and e.type == "ok":
            ok_keys.add(e.key)
            k = (e.key, e.offset, e.value)
            first_read[k] = min(first_read.get(k, e.op), e.op)
    for (key, offset, value), op in first_read.items():
        log = finals.get(key)
        if log is None or log.assign is None or log.read_to == 0:
            continue
        there = log.values.get(offset, [])
        values = {v for _, v in there}
        beyond = log.end is not None and log.complete and offset >= log.end
        if (values and value not in values) or (not values and (log.read_to > offset or beyond)):
            first = min(there) if there else None
            other = first[0] if first else log.assign
            found.add("uncommitted-read", {"key": key, "offset": offset, "value": value,
                                           "final_value": first[1] if first else None,
                                           "final_op": first[0] if first else None,
                                           "final_assign": log.assign, **log.end_fields(),
                                           "ops": [op, other]},
                      min(op, other), offset)
    return sorted(k for k in ok_keys if k not in finals or finals[k].assign is None or finals[k].read_to == 0)


def _dependencies(evs: list[Event], pos: dict[tuple, int],
                  shared: set[tuple]) -> tuple[list[tuple[int, int, str, str]], set[int]]:
    """result.DEPENDENCIES, over the events: the edges, and the operations they join (Jepsen's
    writer-of, readers-of, ww-graph, wr-graph). `shared`: the (key, offset) the log holds two or
    more values at."""
    writer_of: dict[tuple, set[int]] = defaultdict(set)
    acked_at: dict[tuple, set[int]] = defaultdict(set)  # (key, value, offset) -> sends acknowledged there
    position: dict[tuple, int] = {}  # (key, op) -> the lowest position of op's sends to key
    nodes = set()
    for e in evs:
        if e.kind == "s" and e.acked:
            acked_at[(e.key, e.value, e.offset)].add(e.op)
        if e.kind == "s" and (e.key, e.value) in pos:
            writer_of[(e.key, e.value)].add(e.op)
            nodes.add(e.op)
    for e in evs:
        # An unacknowledged send of a value that another operation sent too has no known place:
        # the copy at the value's position may be the other's.
        if e.kind == "s" and (e.key, e.value) in pos and (e.acked or len(writer_of[(e.key, e.value)]) == 1):
            at = _send_position(e, pos)
            position[(e.key, e.op)] = min(position.get((e.key, e.op), at), at)
    # A writer placed at an offset that holds another value too has no place in the order.
    position = {(key, op): at for (key, op), at in position.items() if (key, at) not in shared}
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (key, op), at in position.items():
        by_key[key].append((at, op))
    edges = set()
    for key, ws in by_key.items():
        ws.sort()
        for (_, a), (_, b) in zip(ws, ws[1:]):
            edges.add((a, b, "ww", key))
    for e in evs:
        if e.kind == "r":
            # The sends acknowledged at the offset read, or else the value's one sender: a value
            # sent by two operations, neither acknowledged there, has no known writer of that copy.
            senders = acked_at.get((e.key, e.value, e.offset)) or writer_of.get((e.key, e.value), set())
            for w in senders if len(senders) == 1 or (e.key, e.value, e.offset) in acked_at else ():
                if w != e.op:
                    edges.add((w, e.op, "wr", e.key))
    nodes |= {e.op for e in evs if e.kind == "r"}
    return sorted(edges), nodes


def analyse(path: str | Path, limit: int = 32, full_dir: str | Path | None = None) -> Analysis:
    """Find the anomalies of the history at `path`; see the module docstring."""
    history = read_history(path)
    ops, stats = operations(history.ops, history.lines)
    evs, seeks = events(ops)
    log = Log(e for e in evs if _in_log(e))
    facts: dict[tuple, int] = {}
    for e in evs:
        if _in_log(e):
            k = (e.key, e.offset, e.value)
            facts[k] = min(facts.get(k, e.op), e.op)
    pos: dict[tuple, int] = {}  # the version order: (key, value) -> lowest offset the log holds it at
    held: dict[tuple, set[int]] = defaultdict(set)  # (key, offset) -> the values the log holds there
    for key, offset, value in facts:
        pos[(key, value)] = min(pos.get((key, value), offset), offset)
        held[(key, offset)].add(value)
    found = Found()
    finals = _final_logs(evs, ops, seeks)
    _lost_and_unseen(evs, finals, found)
    _duplicate_and_inconsistent(evs, facts, found)
    _unexpected_and_aborted(evs, found)
    _chains(evs, ops, log, pos, found)
    _within_operations(evs, ops, log, pos, found)
    unjudged = _uncommitted(evs, finals, found)
    _ownership(ops, found)
    _consumption(ops, facts, found)

    notes = list(history.notes)
    if unjudged:
        notes.append(unjudged_note(unjudged, len(unjudged)))
    counts, examples = {}, {}
    for t in TYPES:
        rows = sorted(found.rows.get(t, []))
        if rows:
            counts[t] = sum(w for _, w, _ in rows)
            if limit > 0:
                examples[t] = [json.loads(text) for _, _, text in rows[:limit]]
    if full_dir is not None:
        directory = Path(full_dir)
        directory.mkdir(parents=True, exist_ok=True)
        for t in TYPES:
            tmp = directory / f".{t}.jsonl.tmp"
            tmp.write_text("".join(text + "\n" for _, _, text in sorted(found.rows.get(t, []))))
            tmp.replace(directory / f"{t}.jsonl")
    edges, hubs = _dependencies(evs, pos, {ko for ko, values in held.items() if len(values) > 1})
    hub_rows = sorted((o.op, o.invoke, str(o.process), o.type) for o in ops if o.op in hubs)
    return Analysis(counts=counts, examples=examples, stats=stats, notes=notes, dependencies=edges, hubs=hub_rows,
                    final_reads=[finals[k].summary() for k in sorted(finals)])
