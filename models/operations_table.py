"""A history's operations as a typed table: the side-car written beside `history.jsonl`.

In: the lines of a history as they are written (`OperationsTable.feed`, the bytes of each line
with its newline, in order; `finish` when the history is complete), or a whole history file
(`build`). Out: the folder `<history>.operations` beside it: Parquet files of one row per
operation, its invocation paired with its completion, in the columns and types the Spark loader
gives the operations (history_analysis/load.py, `operations`: COLUMNS here), and `_stamp.json`
naming the history it was built from (size and SHA-256 of its bytes), the Parquet files (the
size and SHA-256 of each), the history's number of lines, and the notes and client operation
counts the loader reports. The folder is built aside and renamed into place whole.
`stamp_files` writes the stamp of a folder of Parquet files written by other means (the Spark
loader's own).

`fresh(path)`: the side-car of the history at `path` and its stamp when the stamp matches the
file as it is now (and this format), else None.

The side-car is a cache of what the loader computes from the JSON, which stays the contract: a
check reads a fresh side-car instead of parsing, validating and pairing millions of lines, and
reads the JSON as always when there is none or it is stale. Lines are read by the Python
reader's rules (history.LineReader), so a side-car is written only for a history that reader
accepts whole (no torn last line); the first line it refuses, or a value the table cannot hold,
stops the side-car (`problem` says why) and the history is checked from its JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from functools import cache
from pathlib import Path
from typing import Any

from .history import BOM, NEVER_COMPLETED, LineReader, Op, never_completed_note
from .history_schema import COMPLETIONS, spark_field_type

# Bumped whenever the columns, their meaning or the stamp change: a side-car of another format is
# stale. 2: the stamp holds each Parquet file's SHA-256 (a file damaged in place, of the same size,
# was read as operations that never happened).
FORMAT = 2
SUFFIX = ".operations"
STAMP = "_stamp.json"  # Spark's reader skips files whose names start with _ or .
# Operations per row group (and per batch held in memory while writing).
BATCH = 1 << 16

# The operations' columns: (name, the line field whose type it has, or a type of its own).
COLUMNS = [
    ("op", "long"), ("invoke", "long"), ("completed", "boolean"), ("process", "process"), ("type", "type"),
    ("f", "f"), ("mops", "mops"), ("keys", "keys"), ("seek_to_beginning", "seek_to_beginning"),
    ("rebalance_log", "rebalance_log"), ("invoke_time", "time"), ("time", "time"), ("error", "error"),
    ("node", "node"), ("assignment", "long"), ("end_offsets", "end_offsets"), ("positions", "positions"),
    ("processed", "processed"), ("offsets", "offsets"), ("final_reads", "final_reads"), ("final", "final"),
]
# Taken from the invocation when the completion carries none (the loader's coalesce).
_FROM_INVOCATION = ("mops", "keys", "seek_to_beginning", "rebalance_log", "final")
# Only the completion's: an answer is never part of a request.
_ANSWERS = ("error", "node", "end_offsets", "positions", "processed", "offsets", "final_reads")


@cache
def spark_type():
    """The operations' schema as a Spark StructType (the loader's `operations` without `_fid`)."""
    from pyspark.sql import types as T

    own = {"long": T.LongType(), "boolean": T.BooleanType()}
    return T.StructType([T.StructField(name, own[of] if of in own else spark_field_type(of))
                         for name, of in COLUMNS])


def _arrow(t):
    import pyarrow as pa
    from pyspark.sql import types as T
    if isinstance(t, T.StructType):
        return pa.struct([pa.field(f.name, _arrow(f.dataType)) for f in t.fields])
    if isinstance(t, T.ArrayType):
        return pa.list_(_arrow(t.elementType))
    if isinstance(t, T.MapType):
        return pa.map_(_arrow(t.keyType), _arrow(t.valueType))
    return {T.LongType: pa.int64(), T.BooleanType: pa.bool_(), T.StringType: pa.string()}[type(t)]


@cache
def arrow_schema():
    """The operations' schema as an Arrow schema."""
    import pyarrow as pa
    return pa.schema([pa.field(f.name, _arrow(f.dataType)) for f in spark_type().fields])


def path_for(history: str | Path) -> Path:
    """Where the side-car of a history lives."""
    history = Path(history)
    return history.with_name(history.name + SUFFIX)


def _row(inv: Op, done: Op, assignment: int) -> dict[str, Any]:
    row = {name: done.get(name) for name in _ANSWERS}
    for name in _FROM_INVOCATION:
        value = done.get(name)
        row[name] = inv.get(name) if value is None else value
    row.update(op=done["index"], invoke=inv["index"], completed=True, process=str(done["process"]),
               type=done["type"], f=done["f"], invoke_time=inv["time"], time=done["time"], assignment=assignment)
    return row


class OperationsTable:
    """Builds the side-car of one history from its lines as they are written; see the module
    docstring. Not thread-safe: the writer of the history calls it under its own lock."""

    def __init__(self, history: str | Path):
        self.history = Path(history)
        self.target = path_for(self.history)
        self._dir = aside(self.target)
        self.problem: str | None = None
        self._reader = LineReader(self.history)
        self._digest = hashlib.sha256()
        self._size = 0
        self._assignments: dict[Any, int] = {}
        self._rows: list[dict[str, Any]] = []
        self._writer = None
        self._counts = {"client_invokes": 0, **{t: 0 for t in COMPLETIONS}}
        # A side-car left by an earlier history of this name is stale from the first line on.
        shutil.rmtree(self.target, ignore_errors=True)

    def skip(self, data: bytes) -> None:
        """Bytes of the file that are no line (a byte order mark at its start): stamped, not read."""
        self._digest.update(data)
        self._size += len(data)

    def feed(self, data: bytes) -> None:
        """The next line of the history, as written (with its newline)."""
        if self.problem is not None:
            return
        self.skip(data)
        try:
            if not data.endswith(b"\n"):
                raise ValueError("a line without its newline")
            op = self._reader.read(data[:-1])
            self._add(op)
            if len(self._rows) >= BATCH:
                self._flush()
        except Exception as exc:  # noqa: BLE001 - the reader's refusals, pyarrow's: the JSON is checked as always
            self._stop(f"line {self._reader.lines + 1}: {exc}")

    def _add(self, op: Op) -> None:
        process, client = op["process"], op["process"] != "nemesis"
        if op["type"] == "invoke":
            self._counts["client_invokes"] += client
            if op["f"] in ("assign", "subscribe"):
                self._assignments[process] = self._assignments.get(process, 0) + 1
            return
        if client:
            self._counts[op["type"]] += 1
        self._rows.append(_row(self._reader.closed, op, self._assignments.get(process, 0)))

    def finish(self) -> Path | None:
        """Write the side-car (renamed into place whole); its path, or None when `problem` says
        why there is none."""
        if self.problem is not None:
            return None
        try:
            # What the history never completed ends, as far as anyone knows, at its last time.
            t = self._reader.last_time or 0
            still_open = self._reader.open_ops
            for process, inv in sorted(still_open.items(), key=lambda kv: kv[1]["index"]):
                row = _row(inv, {"index": inv["index"], "process": process, "type": "info", "f": inv["f"],
                                 "time": t, "error": NEVER_COMPLETED, "node": inv.get("node")},
                           self._assignments.get(process, 0))
                row["completed"] = False
                self._rows.append(row)
            open_clients = sum(1 for process in still_open if process != "nemesis")
            c = self._counts
            self._flush()
            self._open_writer().close()
            self._writer = None
            stamp_files(self._dir, self.target, size=self._size, sha256=self._digest.hexdigest(),
                        lines=self._reader.lines,
                        notes=[never_completed_note(len(still_open))] if still_open else [],
                        stats={"ops": c["client_invokes"], "ok": c["ok"], "fail": c["fail"],
                               "info": c["info"] + open_clients})
            return self.target
        except Exception as exc:  # noqa: BLE001 - no side-car: the JSON is checked as always
            self._stop(f"writing it: {type(exc).__name__}: {exc}")
            return None

    def _open_writer(self):
        if self._writer is None:
            import pyarrow.parquet as pq
            self._dir.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._dir / "part-0.parquet", arrow_schema(), compression="none")
        return self._writer

    def _flush(self) -> None:
        import pyarrow as pa
        if self._rows:
            self._open_writer().write_table(pa.Table.from_pylist(self._rows, schema=arrow_schema()))
            self._rows = []

    def _stop(self, why: str) -> None:
        self.problem = why
        self._rows = []
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the file is removed anyway
                pass
            self._writer = None
        shutil.rmtree(self._dir, ignore_errors=True)


def build(history: str | Path) -> OperationsTable:
    """The side-car of a whole history file, written when the Python reader accepts it; the
    builder, whose `problem` says why there is none."""
    table = OperationsTable(history)
    with open(history, "rb") as f:
        head = f.read(len(BOM))
        if head == BOM:
            table.skip(head)
        else:
            f.seek(0)
        for line in f:
            table.feed(line)
            if table.problem is not None:
                break
    table.finish()
    return table


def aside(target: Path) -> Path:
    """A folder beside `target` to build its replacement in (hidden, of this process alone)."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def stamp_files(folder: Path, target: Path, *, size: int, sha256: str, lines: int, notes: list[str],
                stats: dict[str, int]) -> None:
    """Stamp a folder of Parquet files holding a history's operations (the history: `size` bytes
    of digest `sha256`) and rename it to `target`, replacing what is there."""
    files = _parquet_files(folder)
    stamp = {"format": FORMAT, "bytes": size, "sha256": sha256, "files": files, "lines": lines, "notes": notes,
             "stats": stats}
    (folder / STAMP).write_text(json.dumps(stamp))
    shutil.rmtree(target, ignore_errors=True)
    folder.replace(target)


def _parquet_sizes(folder: Path) -> dict[str, int]:
    """The data files of a side-car folder (what Spark reads: not its _ or . files), by name: size."""
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if not p.name.startswith(("_", "."))}


def _parquet_files(folder: Path) -> dict[str, dict[str, Any]]:
    """The data files of a side-car folder by name: {"bytes", "sha256"}."""
    return {name: {"bytes": size, "sha256": sha256_of(folder / name)[1]}
            for name, size in _parquet_sizes(folder).items()}


def sha256_of(path: str | Path) -> tuple[int, str]:
    """(size, SHA-256) of a file's bytes."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def fresh(history: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(side-car folder, stamp) of the local history file at `history` when the stamp matches the
    file as it is now (its size and SHA-256), the folder holds the Parquet files it names (of
    their sizes and SHA-256) and no others, and the stamp is of this FORMAT; None otherwise."""
    folder = path_for(history)
    try:
        size = Path(history).stat().st_size
        stamp = json.loads((folder / STAMP).read_text())
        sizes = _parquet_sizes(folder)
        if not (isinstance(stamp, dict) and stamp.get("format") == FORMAT and stamp.get("bytes") == size
                and sizes and {name: f["bytes"] for name, f in stamp["files"].items()} == sizes):
            return None
        # The sizes first: hashing is what costs (a side-car of 1M operations: 86 MB).
        if sha256_of(history)[1] != stamp.get("sha256"):
            return None
        if any(sha256_of(folder / name)[1] != stamp["files"][name]["sha256"] for name in sizes):
            return None
        return folder, stamp
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
