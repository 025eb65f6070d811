"""The history: reading and writing `history.jsonl` (see docs/history-format.md).

In (reading): a path to a JSON Lines history written by any harness.
Out: a list of `Op` dicts, validated, in file order, plus notes about what
was repaired (a torn last line, invocations never completed); or a
`HistoryError` naming the file, the line number, the field and what is wrong
(one paragraph). Each line is checked by `history_schema` (the one table of
field rules that the Spark loader is built from too), then across lines:
indices 0, 1, 2, ...; time never decreasing; one operation at a time per
process; a completion's f its invocation's; a process whose operation ended
`info` never used again. A UTF-8 byte order mark at the start of the file is
skipped, and a line may end in CRLF.

In (writing): operations as the interpreter invokes and completes them.
Out: one JSON object per line, flushed line by line, with `index` and `time`
assigned here, so a crash of the harness loses nothing already recorded; and,
once closed, the history's side-car (operations_table.py: its operations,
paired and typed as the Spark loader reads them, for the check to read
instead of the JSON).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .history_schema import (COMPLETIONS, FORMAT, KEY_FUNCTIONS, MOP_FUNCTIONS, PROBLEMS, TYPES, LineProblem,
                             check_line, parse_line)

Op = dict[str, Any]
BOM = b"\xef\xbb\xbf"


class HistoryError(ValueError):
    """A history that cannot be accepted: `path`, `line` (1-based, None for the file as a whole),
    `field` (None for the line as a whole) and `problem` (what was expected and how to fix it).
    Its text is one paragraph: "<path>:<line>: <problem>"."""

    def __init__(self, path: str | Path, line: int | None, problem: str, field: str | None = None):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem
        self.field = field


def one_line(exc: BaseException) -> str:
    """An exception's reason in one line: the first line of its message (for a Java exception from
    Spark, of the Java message), never a stack."""
    java = getattr(exc, "java_exception", None)
    text = str(exc)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # noqa: BLE001 - the JVM may be gone
            pass
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 400 else first[:397] + "..."


def line_error(path: str | Path, line: int, problem: LineProblem) -> HistoryError:
    return HistoryError(path, line, f"{problem.message} (the format: {FORMAT})", problem.field)


def state_error(path: str | Path, line: int, problem: tuple[str, str]) -> HistoryError:
    field_name, message = problem
    return HistoryError(path, line, f"{message} (the format: {FORMAT})", field_name)


@dataclass
class ReadResult:
    ops: list[Op]
    notes: list[str] = field(default_factory=list)
    # How many of `ops` are lines of the file; the rest are `info` completions
    # made up for invocations the history never completed.
    lines: int = 0


def validate_line(op: Any, fail) -> None:
    """Check one parsed line against the history format; `fail(msg)` raises."""
    try:
        check_line(op)
    except LineProblem as exc:
        fail(exc.message)


def read_bytes(path: str | Path) -> bytes:
    """A history file's bytes, without a UTF-8 byte order mark at its start; HistoryError when
    it cannot be read."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise HistoryError(path, None, "is a directory, not a history file: give the history.jsonl inside it, "
                                       "or its store folder") from None
    except FileNotFoundError:
        raise HistoryError(path, None, "no such file: give a store folder holding history.jsonl, or the path "
                                       "of a history file") from None
    except OSError as exc:
        raise HistoryError(path, None, f"cannot read the file ({exc.strerror or exc}): check that it exists "
                                       f"and that this user may read it") from None
    return raw[3:] if raw.startswith(BOM) else raw


TORN = "the last line is cut short (no newline, not JSON) and was ignored: the harness stopped while writing it"


class LineReader:
    """One history's lines, in order, read and checked: each line against the table
    (history_schema), then across lines (index, time, one operation at a time per process, a
    completion's f, a retired process). `read` raises LineProblem for a line the table refuses
    (the caller knows whether it is a torn last line) and HistoryError for a problem across
    lines; `open_ops` holds each process's invocation still open, `closed` the one the last line
    completed; `never_completed` gives the `info` completions made up for what is still open."""

    def __init__(self, path: str | Path):
        self.path = path
        self.lines = 0
        self.last_time: int | None = None
        self.open_ops: dict[Any, Op] = {}
        # The invocation the last line read completed (None when it was an invocation).
        self.closed: Op | None = None
        self._retired: dict[Any, int] = {}

    def read(self, line: bytes) -> Op:
        op = parse_line(line)
        check_line(op)
        problem = None
        self.closed = None
        if op["index"] != self.lines:
            problem = PROBLEMS.index(op["index"], self.lines)
        elif self.last_time is not None and op["time"] < self.last_time:
            problem = PROBLEMS.time(op["time"], self.last_time)
        else:
            process = op["process"]
            if process in self._retired:
                problem = PROBLEMS.retired(process, self._retired[process])
            elif op["type"] == "invoke":
                if process in self.open_ops:
                    problem = PROBLEMS.open(process, self.open_ops[process]["index"])
                else:
                    self.open_ops[process] = op
            else:
                inv = self.closed = self.open_ops.pop(process, None)
                if inv is None:
                    problem = PROBLEMS.orphan(process, op["type"])
                elif inv["f"] != op["f"]:
                    problem = PROBLEMS.f(op["f"], inv["f"], inv["index"])
                elif op["type"] == "info" and process != "nemesis":
                    self._retired[process] = op["index"]
        if problem is not None:
            raise state_error(self.path, self.lines + 1, problem)
        self.last_time = op["time"]
        self.lines += 1
        return op

    def never_completed(self) -> list[Op]:
        """An `info` completion for each invocation still open, in the order invoked, numbered on
        from the last line, at its time."""
        t = self.last_time or 0
        out = []
        for inv in sorted(self.open_ops.values(), key=lambda op: op["index"]):
            done = {k: v for k, v in inv.items() if k not in ("index", "time", "type")}
            done.update(index=self.lines + len(out), time=t, type="info", error=NEVER_COMPLETED)
            out.append(done)
        return out


NEVER_COMPLETED = "never completed: the history ends first"


def never_completed_note(count: int) -> str:
    return f"{count} invocation(s) never completed; counted as info"


def read_history(path: str | Path) -> ReadResult:
    """Read and validate a history; see the module docstring."""
    path = Path(path)
    raw = read_bytes(path)
    notes: list[str] = []
    lines = raw.split(b"\n")
    torn_tail = lines[-1] != b""
    if not torn_tail:
        lines.pop()
    reader = LineReader(path)
    ops: list[Op] = []
    last = len(lines)
    for lineno, line in enumerate(lines, 1):
        try:
            ops.append(reader.read(line))
        except LineProblem as exc:
            if exc.syntax and lineno == last and torn_tail:
                notes.append(f"{path}:{lineno}: {TORN}")
                break
            raise line_error(path, lineno, exc) from None
    lines_read = len(ops)
    made_up = reader.never_completed()
    if made_up:
        ops.extend(made_up)
        notes.append(never_completed_note(len(made_up)))
    return ReadResult(ops, notes, lines_read)


class HistoryWriter:
    """Appends operations to history.jsonl, one flushed line each; thread-safe. A history it
    writes from its first line gets its side-car (operations_table: the operations as the
    check's loader reads them), built as the lines are written and put in place by `close`;
    `sidecar=False` writes none."""

    def __init__(self, path: str | Path, sidecar: bool = True):
        from .operations_table import OperationsTable

        self.path = Path(path)
        self._file = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()
        self._index = 0
        self._start = time.monotonic_ns()
        self.counts = {t: 0 for t in TYPES}
        self._table = OperationsTable(self.path) if sidecar and self._file.tell() == 0 else None

    def append(self, op: Op) -> Op:
        with self._lock:
            record = {"index": self._index, "time": time.monotonic_ns() - self._start}
            record.update(op)
            line = json.dumps(record, separators=(",", ":")) + "\n"
            self._file.write(line)
            if self._table is not None:
                self._table.feed(line.encode())
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
                if self._table is not None:
                    self._table.finish()


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
