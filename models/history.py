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


def read_history(path: str | Path) -> ReadResult:
    """Read and validate a history; see the module docstring."""
    path = Path(path)
    raw = read_bytes(path)
    notes: list[str] = []
    lines = raw.split(b"\n")
    torn_tail = lines[-1] != b""
    if not torn_tail:
        lines.pop()
    ops: list[Op] = []
    open_ops: dict[Any, Op] = {}
    retired: dict[Any, int] = {}
    last_time = None
    last = len(lines)
    for lineno, line in enumerate(lines, 1):
        try:
            op = parse_line(line)
            check_line(op)
        except LineProblem as exc:
            if exc.syntax and lineno == last and torn_tail:
                notes.append(f"{path}:{lineno}: {TORN}")
                break
            raise line_error(path, lineno, exc) from None
        problem = None
        if op["index"] != len(ops):
            problem = PROBLEMS.index(op["index"], len(ops))
        elif last_time is not None and op["time"] < last_time:
            problem = PROBLEMS.time(op["time"], last_time)
        else:
            process = op["process"]
            if process in retired:
                problem = PROBLEMS.retired(process, retired[process])
            elif op["type"] == "invoke":
                if process in open_ops:
                    problem = PROBLEMS.open(process, open_ops[process]["index"])
                else:
                    open_ops[process] = op
            else:
                inv = open_ops.pop(process, None)
                if inv is None:
                    problem = PROBLEMS.orphan(process, op["type"])
                elif inv["f"] != op["f"]:
                    problem = PROBLEMS.f(op["f"], inv["f"], inv["index"])
                elif op["type"] == "info" and process != "nemesis":
                    retired[process] = op["index"]
        if problem is not None:
            raise state_error(path, lineno, problem)
        last_time = op["time"]
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
