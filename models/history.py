"""The history: reading and writing `history.jsonl` (see shared/history-format.md).

In (reading): a path to a JSON Lines history written by any harness.
Out: a list of `Op` dicts, validated, in file order, plus notes about what
was repaired (a torn last line, invocations never completed); or a
`HistoryError` naming the file, the line number and what is wrong.

In (writing): operations as the interpreter invokes and completes them.
Out: one JSON object per line, flushed line by line, with `index` and `time`
assigned here, so a crash of the harness loses nothing already recorded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

TYPES = ("invoke", "ok", "fail", "info")
COMPLETIONS = ("ok", "fail", "info")
MOP_FUNCTIONS = ("send", "poll", "txn")
KEY_FUNCTIONS = ("assign", "subscribe")

Op = dict[str, Any]


class HistoryError(ValueError):
    """A history line that cannot be accepted."""

    def __init__(self, path: str | Path, line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem


@dataclass
class ReadResult:
    ops: list[Op]
    notes: list[str] = field(default_factory=list)
    # How many of `ops` are lines of the file; the rest are `info` completions
    # made up for invocations the history never completed.
    lines: int = 0


def _check_mops(op: Op, fail) -> None:
    mops = op.get("mops")
    if not isinstance(mops, list):
        fail(f"a {op['f']} operation needs a list 'mops'")
    for i, mop in enumerate(mops):
        if not isinstance(mop, dict) or mop.get("f") not in ("send", "poll"):
            fail(f"mops[{i}] must be an object with f 'send' or 'poll'")
        if mop["f"] == "send":
            if not isinstance(mop.get("key"), str):
                fail(f"mops[{i}] is a send without a string 'key'")
            if not isinstance(mop.get("value"), int) or isinstance(mop.get("value"), bool):
                fail(f"mops[{i}] is a send without an integer 'value'")
            offset = mop.get("offset")
            if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
                fail(f"mops[{i}] has a non-integer offset {offset!r}")
        else:
            records = mop.get("records")
            if records is None:
                continue
            if not isinstance(records, list):
                fail(f"mops[{i}].records must be a list")
            for j, rec in enumerate(records):
                if (not isinstance(rec, dict) or not isinstance(rec.get("key"), str)
                        or not isinstance(rec.get("offset"), int) or not isinstance(rec.get("value"), int)):
                    fail(f"mops[{i}].records[{j}] needs a string key and integer offset and value")


def validate_line(op: Any, fail) -> None:
    """Check one parsed line against the history format; `fail(msg)` raises."""
    if not isinstance(op, dict):
        fail("a history line must be a JSON object")
    for name in ("index", "time", "process", "type", "f"):
        if name not in op:
            fail(f"missing required field {name!r}")
    if not isinstance(op["index"], int) or isinstance(op["index"], bool):
        fail(f"index {op['index']!r} is not an integer")
    if not isinstance(op["time"], int) or isinstance(op["time"], bool):
        fail(f"time {op['time']!r} is not an integer (nanoseconds)")
    process = op["process"]
    if not (process == "nemesis" or (isinstance(process, int) and not isinstance(process, bool))):
        fail(f"process {process!r} is neither an integer nor \"nemesis\"")
    if op["type"] not in TYPES:
        fail(f"type {op['type']!r} is not one of {', '.join(TYPES)}")
    if not isinstance(op["f"], str):
        fail(f"f {op['f']!r} is not a string")
    if op["f"] in MOP_FUNCTIONS and process != "nemesis":
        _check_mops(op, fail)
    if op["f"] in KEY_FUNCTIONS:
        keys = op.get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            fail(f"an {op['f']} operation needs 'keys', a list of strings")
    ends = op.get("end_offsets")
    if ends is not None:
        if not isinstance(ends, dict):
            fail(f"end_offsets {ends!r} is not an object of key -> end offset")
        for key, end in ends.items():
            if not isinstance(end, int) or isinstance(end, bool) or end < 0:
                fail(f"end_offsets[{key!r}] is {end!r}, not a non-negative integer "
                     f"(the offset where the key's log ends)")
    finals = op.get("final_reads")
    if finals is not None:
        if not isinstance(finals, list):
            fail("final_reads must be a list of {key, end, read_to, outcome}")
        for i, r in enumerate(finals):
            def nat(v):
                return isinstance(v, int) and not isinstance(v, bool) and v >= 0
            if (not isinstance(r, dict) or not isinstance(r.get("key"), str)
                    or not (r.get("end") is None or nat(r.get("end"))) or not nat(r.get("read_to"))
                    or r.get("outcome") not in ("reached", "unavailable", "timeout")):
                fail(f"final_reads[{i}] needs a string key, end (a non-negative integer or null), "
                     f"read_to (a non-negative integer) and outcome reached, unavailable or timeout")


def read_history(path: str | Path) -> ReadResult:
    """Read and validate a history; see the module docstring."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise HistoryError(path, None, f"cannot read: {exc.strerror}") from None
    notes: list[str] = []
    lines = raw.split(b"\n")
    torn_tail = lines[-1] != b""
    if not torn_tail:
        lines.pop()
    ops: list[Op] = []
    open_ops: dict[Any, Op] = {}
    last_time = None
    for lineno, line in enumerate(lines, 1):
        is_last = lineno == len(lines)

        def fail(problem: str, lineno=lineno) -> None:
            raise HistoryError(path, lineno, problem + "; fix or remove this line")

        if not line.strip():
            fail("empty line")
        try:
            op = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if is_last and torn_tail:
                notes.append(f"{path}:{lineno}: the last line is cut short (no newline, bad JSON) and was "
                             f"ignored: the harness stopped while writing it")
                break
            fail(f"bad JSON: {exc}")
        validate_line(op, fail)
        if op["index"] != len(ops):
            fail(f"index {op['index']} where {len(ops)} was expected (indices run 0, 1, 2, ... with no gaps)")
        if last_time is not None and op["time"] < last_time:
            fail(f"time {op['time']} is earlier than the previous line's {last_time}")
        last_time = op["time"]
        process = op["process"]
        if op["type"] == "invoke":
            if process in open_ops:
                fail(f"process {process} invokes while its operation at index "
                     f"{open_ops[process]['index']} has not completed (one operation at a time)")
            open_ops[process] = op
        else:
            inv = open_ops.pop(process, None)
            if inv is None:
                fail(f"a {op['type']} completion of process {process} with no invocation before it")
            if inv["f"] != op["f"]:
                fail(f"completion f {op['f']!r} does not match its invocation's {inv['f']!r} "
                     f"(index {inv['index']})")
        ops.append(op)
    lines_read = len(ops)
    if open_ops:
        t = last_time or 0
        for process, inv in sorted(open_ops.items(), key=lambda kv: kv[1]["index"]):
            done = {k: v for k, v in inv.items() if k not in ("index", "time", "type")}
            done.update(index=len(ops), time=t, type="info", error="never completed: the history ends first")
            ops.append(done)
        notes.append(f"{len(open_ops)} invocation(s) never completed; counted as info")
    return ReadResult(ops, notes, lines_read)


class HistoryWriter:
    """Appends operations to history.jsonl, one flushed line each; thread-safe."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()
        self._index = 0
        self._start = time.monotonic_ns()
        self.counts = {t: 0 for t in TYPES}

    def append(self, op: Op) -> Op:
        with self._lock:
            record = {"index": self._index, "time": time.monotonic_ns() - self._start}
            record.update(op)
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._index += 1
            self.counts[record["type"]] = self.counts.get(record["type"], 0) + 1
            return record

    def fsync(self) -> None:
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


def write_history(path: str | Path, ops: Iterable[Op]) -> None:
    """Write complete ops (index and time given) as a history file; for tests and tools."""
    with open(path, "w") as f:
        for op in ops:
            f.write(json.dumps(op, separators=(",", ":")) + "\n")


def completions(ops: list[Op]) -> dict[int, Op]:
    """Map each invocation's index to its completion op."""
    open_ops: dict[Any, int] = {}
    pairs: dict[int, Op] = {}
    for op in ops:
        if op["type"] == "invoke":
            open_ops[op["process"]] = op["index"]
        else:
            inv = open_ops.pop(op["process"], None)
            if inv is not None:
                pairs[inv] = op
    return pairs
