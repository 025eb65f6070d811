"""Loading a history into Spark, validated line by line.

In: a SparkSession and the path of one history file (JSON Lines, see
docs/history-format.md), read with an explicit schema (no inference).
`load_histories`: several local files, loaded in one pass (a `Histories`:
the same DataFrames, every row with `_fid`, its file's place in the list,
and per file its problem, notes, lines and stats).
`validate_histories`: several local files, only validated, in one pass.

Out: a `History` with
- `ops`: one row per accepted line, in the history's own terms: `line`
  (1-based line number), `index`, `time`, `process` (a string: the integer
  written in decimal, or "nemesis"), `type`, `f`, `mops`, `keys`,
  `seek_to_beginning`, `rebalance_log`, `value` (raw JSON text), `error`, `node`,
  `warning`, `final`, `end_offsets` (key -> offset where the broker said its
  log ends, on the final reads' assigns), `unavailable` (key -> why),
  `final_reads`: every field of the format's table (schema.FIELD_NAMES), a
  send micro-operation's `error` as a string;
- `operations`: one row per operation, invocation and completion paired:
  `op` (index of the completion line; of the invocation line when the
  history ends before the completion), `invoke` (index of the invocation
  line), `completed`, `process`, `type` (`ok`/`fail`/`info`; `info` for an
  operation never completed), `f`, `mops` (the completion's, or the
  invocation's when the completion carries none), `keys`,
  `seek_to_beginning`, `rebalance_log`, `invoke_time`, `time`, `error`, `node`,
  `end_offsets` (the completion's; null for an operation never completed),
  `final_reads` (the completion's, on a `final-reads` operation: an array of
  struct key, end (null when unknown), read_to, outcome; null otherwise),
  `final` (the completion's, else the invocation's),
  `assignment` (which assignment of its process the operation ran in: how
  many assign/subscribe operations the process had invoked up to and
  including this one, 0 before the first; a consumer's position is only
  meaningful within one assignment. Unrelated to the broker's leader,
  producer and controller epochs);
- `notes`: what was tolerated (a torn last line, operations never completed);
- `lines`: the number of lines accepted; `stats`: operation counts of client
  (non-nemesis) processes: `ops` (operations invoked), `ok`, `fail`, `info`
  (never-completed operations count as `info`).

`History` unpacks as `(ops, notes)`. Its DataFrames are kept in Spark's
storage (`operations` materialised: session.materialise; read from the
side-cars' Parquet files by each query when loaded from those); call
`unpersist()` when done.

A malformed file raises `faultline.models.history.HistoryError` naming the
file, the 1-based line number, the field and the problem, in the words the
Python reader (`faultline.models.history.read_history`) uses for the same
file: both are built from one table of rules (`models/history_schema.py`).
Spark parses each line with a schema generated from it (the fields a JSON
reader would coerce read as variants, which keep their JSON type) and flags,
with one SQL predicate generated from it too, every line the table refuses;
the first flagged line is checked again in Python for the message. The
checks across lines (index, time, one operation at a time, a completion's f,
a crashed process never used again) run as window queries. The last line,
when it has no trailing newline and is not JSON, is dropped with a note (the
harness died while writing it). A UTF-8 byte order mark at the start of the
file is skipped (Hadoop's line reader does), and lines may end in CRLF.
A file Spark cannot read, or a failure of Spark itself while reading it,
raises HistoryError with Spark's one-line reason, never a Java stack.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote, urlparse

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..models import history_schema as schema
from ..models import operations_table
from ..models.history import (COMPLETIONS, NEVER_COMPLETED, TORN, HistoryError, line_error, never_completed_note, one_line,
                              read_bytes, state_error)
from .session import SMALL_INPUT_BYTES, materialise, release, settings, sized_for

LINE_COLUMNS = ["line", *schema.FIELD_NAMES]
FINAL_READS_TYPE = "ARRAY<STRUCT<key: STRING, end: BIGINT, read_to: BIGINT, outcome: STRING>>"
PROCESSED_TYPE = "ARRAY<STRUCT<key: STRING, offset: BIGINT, value: BIGINT>>"


@dataclass
class History:
    path: str
    ops: DataFrame
    operations: DataFrame
    notes: list[str] = field(default_factory=list)
    lines: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    _persisted: list[DataFrame] = field(default_factory=list, repr=False)
    _materialised: list[DataFrame] = field(default_factory=list, repr=False)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.ops, self.notes))

    def unpersist(self) -> None:
        _free(self._persisted, self._materialised)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def _local(path: str) -> Path:
    return Path(path[len("file:"):] if path.startswith("file:") else path)


def _ends_with_newline(spark: SparkSession, path: str) -> bool:
    """Whether the file's last byte is a newline (True for an empty file)."""
    if _is_local(path):
        p = _local(path)
        size = p.stat().st_size
        if size == 0:
            return True
        with open(p, "rb") as f:
            f.seek(size - 1)
            return f.read(1) == b"\n"
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    size = fs.getFileStatus(hpath).getLen()
    if size == 0:
        return True
    stream = fs.open(hpath)
    try:
        stream.seek(size - 1)
        return stream.read() == ord("\n")
    finally:
        stream.close()


def _first_problem(raw: bytes | None) -> schema.LineProblem:
    """The problem of a line Spark flagged, in the Python reader's words."""
    problem = schema.line_problem(raw or b"")
    if problem is None:
        # The two readers disagree: a bug of this loader, not of the history.
        return schema.LineProblem(None, "the Spark reader refused this line, which the Python reader "
                                        "accepts; check it with --engine python, and report it")
    return problem


def spark_failure(exc: BaseException) -> str:
    """Spark's reason for a failure in one line: the first line of its message, no Java stack."""
    return one_line(exc)


def _sql_map(d: dict[int, int | None]) -> str:
    """A SQL literal map from longs to longs."""
    items = ", ".join(f"CAST({k} AS BIGINT), CAST({'NULL' if v is None else v} AS BIGINT)" for k, v in d.items())
    return f"map({items})"


# `_blk`: a history's number * FILE_SHIFT + the start of the split in its file, so one query
# checks several histories at once (load_histories, validate_histories) as it checks one.
FILE_SHIFT = 1 << 40


def load_history(spark: SparkSession, path: str | os.PathLike) -> History:
    """Read and validate a history file; see the module docstring."""
    path = str(path)
    loaded = load_histories(spark, [path])
    if loaded.problems[0] is not None:
        loaded.unpersist()
        raise loaded.problems[0]
    return History(path=path, ops=loaded.ops.drop("_fid"), operations=loaded.operations.drop("_fid"),
                   notes=loaded.notes[0], lines=loaded.lines[0], stats=loaded.stats[0],
                   _persisted=loaded._persisted, _materialised=loaded._materialised)


@dataclass
class Histories:
    """Several histories loaded in one pass: `ops` and `operations` as History's, of every accepted
    history, each row with `_fid`, the history's place in `paths`; per history (lists in the order
    of `paths`): `problems` (its HistoryError, None when accepted: a refused history has no rows),
    `notes`, `lines`, `stats`; `sidecars`: whether `operations` reads the side-cars (see
    `_from_sidecars`); `conf`: the session settings its queries are to run with
    (session.settings). Call `unpersist()` when done."""

    paths: list[str]
    ops: DataFrame | None  # None when no history could be read
    operations: DataFrame | None
    problems: list[HistoryError | None]
    notes: list[list[str]]
    lines: list[int]
    stats: list[dict[str, int]]
    sidecars: bool = False
    _persisted: list[DataFrame] = field(default_factory=list, repr=False)
    _materialised: list[DataFrame] = field(default_factory=list, repr=False)

    @property
    def conf(self) -> dict[str, str]:
        return dict(_SIDECAR_CONF) if self.sidecars else {}

    def unpersist(self) -> None:
        _free(self._persisted, self._materialised)


def _free(persisted: list[DataFrame], materialised: list[DataFrame]) -> None:
    for df in persisted:
        df.unpersist()
    for df in materialised:
        release(df)
    persisted.clear()
    materialised.clear()


def load_histories(spark: SparkSession, paths: list[str | os.PathLike], sidecars: bool = False) -> Histories:
    """Read and validate several history files in one pass, each as load_history would (the same
    checks and words): one plan answers for all of them. Several paths must be local files; one may
    be any path Spark reads. A failure of Spark itself raises HistoryError naming the first path.

    `sidecars`: when every path is a local file with a fresh side-car (models/operations_table.py:
    its operations, written as the history was), the operations are read from those, and `ops`
    is None; otherwise every file is read from its JSON, and each accepted local history of at
    least SIDECAR_MIN_BYTES that had no fresh side-car gets one, written from what was loaded (a
    Spark job each; left out where it cannot be written: it is a cache)."""
    paths = [str(p) for p in paths]
    sizes = [file_size(p) for p in paths]
    with sized_for(spark, None if None in sizes else sum(s or 0 for s in sizes)):
        sums = {}
        if sidecars:
            found = [operations_table.fresh(_local(p)) if _is_local(p) else None for p in paths]
            loaded = _from_sidecars(spark, paths, found) if None not in found else None
            if loaded is not None:
                return loaded
            sums = _digests([p if f is None else None for p, f in zip(paths, found)])
        loaded = _from_json(spark, paths)
        _write_sidecars(loaded, sums)
        return loaded


def _from_json(spark: SparkSession, paths: list[str]) -> Histories:
    problems, readable = _readable(paths)
    if not readable:
        return Histories(paths, None, None, problems=problems, notes=[[] for _ in paths],
                         lines=[0] * len(paths), stats=[{} for _ in paths])
    with _spark_failures(spark, paths[readable[0][0]]):
        parsed = _parse(spark, paths, readable, single=len(paths) == 1)
        persisted = [parsed]
        try:
            states, paired = _check(spark, paths, parsed, persisted)
            for i, problem in enumerate(problems):
                if problem is not None:
                    states[i]["problem"] = problem
            return _histories(paths, states, parsed, paired, persisted)
        except BaseException:
            for df in persisted:
                df.unpersist()
            raise


# A side-car is a file of row groups of 64k operations each (a few MB): splits of this size
# spread a large one over the cores.
_SIDECAR_CONF = {"spark.sql.files.maxPartitionBytes": str(8 << 20)}


def _from_sidecars(spark: SparkSession, paths: list[str], found: list[tuple[Path, dict[str, Any]]]
                   ) -> Histories | None:
    """The operations of every history from its fresh side-car (`found`: operations_table.fresh's,
    by place); None when Spark cannot list them (the JSON is read then, as always).

    The operations are not materialised: each query reads the columns it needs from the Parquet
    files, which is quicker than writing every operation to Spark's storage and reading whole rows
    back (a check of 1M operations: 72.2-73.0 s, 75.1-77.8 s materialised). So the side-cars must
    stay in place until the analysis ends, and one Spark cannot read fails a query of the
    analysis, not this call (anomalies._analyse then reads the JSON)."""
    folders = {str(folder.resolve()): fid for fid, (folder, _) in enumerate(found)}
    if len(folders) < len(found):
        return None  # a history given twice: the JSON reader says so
    try:
        with settings(spark, _SIDECAR_CONF):
            read = spark.read.schema(operations_table.spark_type()).parquet(*[_glob_escaped(f) for f, _ in found])
            fid_of = F.lit(0)
            if len(found) > 1:
                # Spark names each file by its URI: number them by their folder's place in `paths`
                # (a job of its own, which one history does without).
                uris = [r[0] for r in read.select("_metadata.file_path").distinct().collect()]
                fid = {u: folders[str(Path(unquote(urlparse(u).path)).parent)] for u in uris}
                items = ", ".join(f"{schema.sql_str(u)}, CAST({i} AS BIGINT)" for u, i in fid.items())
                fid_of = F.expr(f"element_at(map({items}), _metadata.file_path)") if items else F.lit(0)
            operations = read.select(fid_of.cast("bigint").alias("_fid"), "*")
    except Exception as exc:  # noqa: BLE001 - a side-car Spark cannot read is stale; the JSON stays
        if not _is_spark_failure(exc):
            raise
        return None
    return Histories(paths=paths, ops=None, operations=operations, problems=[None] * len(paths),
                     notes=[list(stamp["notes"]) for _, stamp in found], lines=[stamp["lines"] for _, stamp in found],
                     stats=[dict(stamp["stats"]) for _, stamp in found], sidecars=True)


# The check writes the side-car of a history this large that has none: below, reading its JSON
# takes a few seconds at most, and a side-car beside every small history is clutter.
SIDECAR_MIN_BYTES = SMALL_INPUT_BYTES


def _digests(paths: list[str | None]) -> dict[int, tuple[int, str]]:
    """(size, SHA-256) of each local history of at least SIDECAR_MIN_BYTES (None: none wanted), by
    its place in `paths`: taken before loading them, a side-car `_write_sidecars` stamps with them
    can only be stale (never wrong) if a history changes while it is read."""
    out = {}
    for fid, path in enumerate(paths):
        size = None if path is None else file_size(path)
        if size is not None and size >= SIDECAR_MIN_BYTES:
            try:
                out[fid] = operations_table.sha256_of(_local(path))
            except OSError:
                pass
    return out


def _write_sidecars(history: Histories, digests: dict[int, tuple[int, str]]) -> None:
    """The side-car of each accepted history read from its JSON that `digests` names (and that
    has no torn last line), from its operations as loaded: one Spark job each. A side-car that
    cannot be written (a read-only folder, a full disk) is left out: it is a cache."""
    for fid, (size, sha256) in digests.items():
        if history.ops is None or history.problems[fid] is not None or any(TORN in n for n in history.notes[fid]):
            continue
        target = operations_table.path_for(_local(history.paths[fid]))
        folder = operations_table.aside(target)
        try:
            (history.operations.filter(F.col("_fid") == fid).drop("_fid")
             .write.option("compression", "none").parquet(_glob_escaped(folder)))
            operations_table.stamp_files(folder, target, size=size, sha256=sha256, lines=history.lines[fid],
                                         notes=history.notes[fid], stats=history.stats[fid])
        except Exception as exc:  # noqa: BLE001 - no side-car: the JSON is read next time too
            if not (isinstance(exc, OSError) or _is_spark_failure(exc)):
                raise
            shutil.rmtree(folder, ignore_errors=True)


def validate_histories(spark: SparkSession, paths: list[str | os.PathLike]) -> dict[str, HistoryError | None]:
    """Validate several local history files in one pass, with the same checks and words as
    load_history: for each path, its HistoryError, or None when load_history would accept it."""
    paths = [str(p) for p in paths]
    problems, readable = _readable(paths)
    if readable:
        with _spark_failures(spark, paths[readable[0][0]]):
            parsed = _parse(spark, paths, readable, single=False)
            persisted = [parsed]
            try:
                states, _ = _check(spark, paths, parsed, persisted)
            finally:
                for df in persisted:
                    df.unpersist()
        for fid, _ in readable:
            problems[fid] = states[fid]["problem"]
    return dict(zip(paths, problems))


def _readable(paths: list[str]) -> tuple[list[HistoryError | None], list[tuple[int, str]]]:
    """Per path its HistoryError when it cannot be read (else None), and (place, Spark's path) of
    each readable one."""
    problems: list[HistoryError | None] = [None] * len(paths)
    readable = []
    for i, path in enumerate(paths):
        try:
            readable.append((i, _spark_path(path)))
        except HistoryError as exc:
            problems[i] = exc
    return problems, readable


def file_size(path: str) -> int | None:
    """The size of a local file, None when unknown (not local, or absent)."""
    try:
        return _local(path).stat().st_size if _is_local(path) else None
    except OSError:
        return None


def _spark_path(path: str) -> str:
    """The path to give Spark; HistoryError, in the Python reader's words, for a local file that is
    absent, a directory, or cannot be read (Spark would say "does not exist")."""
    if not _is_local(path):
        return path
    p = _local(path)
    if p.is_dir():
        read_bytes(p)
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError:
        read_bytes(p)  # raises HistoryError with the reason
        raise
    return _glob_escaped(p)


def _glob_escaped(path: Path) -> str:
    # Spark reads a path as a glob pattern: escape a file name's own brackets, stars, ...
    return re.sub(r"([\\\[\]{}*?])", r"\\\1", str(path.resolve()))


def _is_spark_failure(exc: BaseException) -> bool:
    return type(exc).__name__ in ("Py4JJavaError", "Py4JError") or hasattr(exc, "getErrorClass")


@contextmanager
def _spark_failures(spark: SparkSession, path: str) -> Iterator[None]:
    """The JSON reader's settings (schema.SPARK_CONF) meanwhile, and Spark's own failures as a
    HistoryError of one line."""
    with settings(spark, schema.SPARK_CONF):
        try:
            yield
        except HistoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - Spark's own failures, in one line
            if not _is_spark_failure(exc):
                raise
            raise HistoryError(path, None, f"Spark could not read the file: {spark_failure(exc)}") from None


def _parse(spark: SparkSession, paths: list[str], readable: list[tuple[int, str]], single: bool) -> DataFrame:
    """Every line of the readable files ((place in `paths`, Spark's path) each), parsed
    (persisted): `_mid`, `_blk`, `_bad`, `_raw` (the bytes of a flagged line), and the line's
    columns. `single`: one file, of any file system; else local files, each once."""
    spark_paths = [sp for _, sp in readable]
    text = spark.read.option("lineSep", "\n").text(spark_paths if len(spark_paths) > 1 else spark_paths[0])
    if single:
        blk = F.col("_metadata.file_block_start")
    else:
        # Spark names each file by its URI: number them by their place in `paths`.
        uris = [r[0] for r in text.select("_metadata.file_path").distinct().collect()]
        order = {str(_local(paths[i]).resolve()): i for i, _ in readable}
        if len(order) < len(readable):
            raise ValueError("the same history file was given twice; give each once")
        fid = {u: order[str(Path(unquote(urlparse(u).path)))] for u in uris}
        items = ", ".join(f"{schema.sql_str(u)}, CAST({i} AS BIGINT)" for u, i in fid.items())
        blk = F.expr(f"element_at(map({items}), _metadata.file_path) * {FILE_SHIFT} + _metadata.file_block_start")
    # Each line parsed as `[<line>,{"<nonce>":1}]`: a line that is not exactly one JSON object
    # cannot come out as an array of two with the nonce last.
    nonce = "faultline-" + secrets.token_hex(12)
    before, after = schema.spark_wrap(nonce)
    parsed = (
        text.select(
            F.monotonically_increasing_id().alias("_mid"),
            blk.alias("_blk"),
            F.col("value").alias("_text"),
            F.from_json(F.concat(F.lit(before), "value", F.lit(after)), schema.spark_line_type(nonce),
                        schema.JSON_OPTIONS).alias("_arr"),
        )
        .selectExpr("_mid", "_blk", "_text", "_arr", "get(_arr, 0) AS _j")
        .selectExpr("_mid", "_blk", "_text", f"{schema.spark_bad('_arr', '_j', '_text', nonce)} AS _bad",
                    *schema.spark_columns("_j"))
    )
    return (
        parsed.withColumn("_raw", F.when(F.col("_bad"), F.col("_text").cast("binary")))
        .drop("_text")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )


def _check(spark: SparkSession, paths: list[str], parsed: DataFrame,
           persisted: list[DataFrame]) -> tuple[list[dict[str, Any]], DataFrame]:
    """Number the lines of each file and find its first problem: per file (in the order of
    `paths`) a dict of blocks, total, dropped, notes and problem; and `paired`, every accepted
    line with the previous line of its process (persisted)."""
    # One pass over the files for the splits (to number lines), the first
    # malformed line of each (with its text), the last line (for a torn
    # tail), and the operation counts: in a valid history every completion
    # closes one invocation, so what stays open is the difference.
    rows = sorted(
        parsed.groupBy("_blk").agg(*[F.expr(e) for e in (
            "min(_mid) AS lo", "max(_mid) AS hi", "count(1) AS n",
            "max_by(time, _mid) AS last_time", "max(time) AS max_time",
            "min_by(struct(_mid, _raw), CASE WHEN _bad THEN _mid END) AS first_bad",
            "max_by(struct(_bad, _raw), _mid) AS last_line",
            "count_if(type = 'invoke') AS invokes", "count_if(type != 'invoke') AS completions",
            "count_if(process != 'nemesis' AND type = 'invoke') AS client_invokes",
            *[f"count_if(process != 'nemesis' AND type = '{t}') AS {t}" for t in COMPLETIONS],
        )]).collect(),
        key=lambda r: r["_blk"],
    )
    states: list[dict[str, Any]] = [{"blocks": [], "notes": [], "problems": [], "dropped": None} for _ in paths]
    for r in rows:
        states[r["_blk"] // FILE_SHIFT]["blocks"].append(r)
    shift: dict[int, int] = {}
    first_id: dict[int, int] = {}
    prev_last_time: dict[int, int | None] = {}
    for path, state in zip(paths, states):
        blocks = state["blocks"]
        base, last_time = 1, None
        for b in blocks:
            if b["hi"] - b["lo"] + 1 != b["n"]:
                raise RuntimeError(f"cannot number the lines of {path}: split {b['_blk']} was not read in one run")
            shift[b["_blk"]] = base - b["lo"]
            first_id[b["_blk"]] = b["lo"]
            prev_last_time[b["_blk"]] = last_time
            base += b["n"]
            last_time = b["last_time"]
        total = state["total"] = base - 1
        if total and not _ends_with_newline(spark, path):
            last = blocks[-1]["last_line"]
            if last["_bad"] and _first_problem(last["_raw"]).syntax:
                state["dropped"] = total
                state["notes"].append(f"{path}:{total}: {TORN}")
        # Every problem as (line, rank, error): the smallest line wins, and on
        # one line the Python reader's order of checks (structure, index, time, process).
        bad = sorted((b["first_bad"]["_mid"] + shift[b["_blk"]], b["first_bad"]["_raw"])
                     for b in blocks if b["first_bad"] is not None)
        bad = [(line, raw) for line, raw in bad if line != state["dropped"]]
        if bad:
            state["problems"].append((bad[0][0], 0, line_error(path, bad[0][0], _first_problem(bad[0][1]))))

    lines = parsed.selectExpr("*", f"_mid + element_at({_sql_map(shift)}, _blk) AS line",
                              f"_blk DIV {FILE_SHIFT} AS _fid")
    for fid, state in enumerate(states):
        if state["dropped"] is not None:
            lines = lines.filter(f"NOT (_fid = {fid} AND line = {state['dropped']})")

    in_order = lines.selectExpr(
        "_fid", "line", "index", "time",
        f"""CASE WHEN _mid = element_at({_sql_map(first_id)}, _blk) THEN element_at({_sql_map(prev_last_time)}, _blk)
            ELSE lag(time) OVER (PARTITION BY _blk ORDER BY _mid) END AS prev_time""",
    ).selectExpr(
        "_fid", "line", "CASE WHEN index != line - 1 THEN 1 WHEN time < prev_time THEN 2 END AS rank",
        "CASE WHEN index != line - 1 THEN 'index' ELSE 'time' END AS code",
        "index AS n1", "time AS n2", "prev_time AS n3",
        "CAST(NULL AS STRING) AS s1", "CAST(NULL AS STRING) AS s2", "CAST(NULL AS STRING) AS s3",
        "CAST(NULL AS STRING) AS s4",
    ).filter("rank IS NOT NULL")

    chain = "OVER (PARTITION BY _fid, process ORDER BY line)"
    paired = lines.filter("process IS NOT NULL").selectExpr(
        "_fid", *LINE_COLUMNS,
        *[f"lag({col}) {chain} AS prev_{name}" for col, name in (
            ("type", "type"), ("f", "f"), ("index", "index"), ("time", "time"),
            ("seek_to_beginning", "seek"), ("final", "final"))],
        # A completion that carries no mops/keys takes its invocation's (kept only then: most
        # completions carry their own, and a copy of each invocation's would double the cache).
        *[f"CASE WHEN {col} IS NULL THEN lag({col}) {chain} END AS prev_{col}"
          for col in ("mops", "keys", "rebalance_log")],
        f"lead(type) {chain} AS next_type",
        "CAST(sum(CASE WHEN type = 'invoke' AND f IN ('assign', 'subscribe') THEN 1 ELSE 0 END) OVER ("
        "PARTITION BY _fid, process ORDER BY line ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS BIGINT) "
        "AS assignment",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    persisted.append(paired)
    one_at_a_time = paired.selectExpr(
        "_fid", "line", "3 AS rank",
        """CASE WHEN prev_type = 'info' AND process != 'nemesis' THEN 'retired'
                WHEN type = 'invoke' AND prev_type = 'invoke' THEN 'open'
                WHEN type != 'invoke' AND (prev_type IS NULL OR prev_type != 'invoke') THEN 'orphan'
                WHEN type != 'invoke' AND f != prev_f THEN 'f' END AS code""",
        "prev_index AS n1", "CAST(NULL AS BIGINT) AS n2", "CAST(NULL AS BIGINT) AS n3",
        "process AS s1", "type AS s2", "f AS s3", "prev_f AS s4",
    ).filter("code IS NOT NULL")
    # Both checks in one job, which also fills the cache of `paired`: each file's first problem.
    firsts = (in_order.union(one_at_a_time).groupBy("_fid")
              .agg(F.expr("min(struct(line, rank, code, n1, n2, n3, s1, s2, s3, s4)) AS p")).collect())
    P = schema.PROBLEMS
    for f in firsts:
        r, path = f["p"], paths[f["_fid"]]
        problem = {
            "index": lambda: P.index(r["n1"], r["line"] - 1),
            "time": lambda: P.time(r["n2"], r["n3"]),
            "retired": lambda: P.retired(r["s1"], r["n1"]),
            "open": lambda: P.open(r["s1"], r["n1"]),
            "orphan": lambda: P.orphan(r["s1"], r["s2"]),
            "f": lambda: P.f(r["s3"], r["s4"], r["n1"]),
        }[r["code"]]()
        states[f["_fid"]]["problems"].append((r["line"], r["rank"], state_error(path, r["line"], problem)))
    for state in states:
        state["problem"] = min(state["problems"], key=lambda p: p[:2])[2] if state["problems"] else None
    return states, paired


def _histories(paths: list[str], states: list[dict[str, Any]], parsed: DataFrame, paired: DataFrame,
               persisted: list[DataFrame]) -> Histories:
    notes, lines, stats, max_time, accepted = [], [], [], {}, []
    for fid, state in enumerate(states):
        blocks = state["blocks"]
        total_of = lambda name: sum(b[name] or 0 for b in blocks)  # noqa: E731
        never = total_of("invokes") - total_of("completions")
        never_client = total_of("client_invokes") - sum(total_of(t) for t in COMPLETIONS)
        if never:
            state["notes"].append(never_completed_note(never))
        notes.append(state["notes"])
        stats.append({"ops": total_of("client_invokes"), "ok": total_of("ok"), "fail": total_of("fail"),
                      "info": total_of("info") + never_client})
        lines.append(state.get("total", 0) - (1 if state["dropped"] is not None else 0))
        max_time[fid] = max((b["max_time"] for b in blocks if b["max_time"] is not None), default=None)
        if state["problem"] is None:
            accepted.append(fid)
    parsed.unpersist()
    persisted.remove(parsed)
    if len(accepted) < len(states):
        paired = paired.filter(F.col("_fid").isin(accepted)) if accepted else paired.limit(0)

    completed = paired.filter("type != 'invoke'").selectExpr(
        "_fid", "index AS op", "prev_index AS invoke", "true AS completed", "process", "type", "f",
        "coalesce(mops, prev_mops) AS mops", "coalesce(keys, prev_keys) AS keys",
        "coalesce(seek_to_beginning, prev_seek) AS seek_to_beginning",
        "coalesce(rebalance_log, prev_rebalance_log) AS rebalance_log",
        "prev_time AS invoke_time", "time", "error", "node", "assignment",
        # The completion's own: an end offset is an answer, never part of a request.
        "end_offsets",
        "positions",
        "processed",
        "offsets",
        "final_reads",
        "coalesce(final, prev_final) AS final",
    )
    # An operation the history ends before completing ends, as far as anyone knows, at its
    # history's last time.
    open_ops = paired.filter("type = 'invoke' AND next_type IS NULL").selectExpr(
        "_fid", "index AS op", "index AS invoke", "false AS completed", "process", "'info' AS type", "f",
        "mops", "keys", "seek_to_beginning", "rebalance_log", "time AS invoke_time",
        f"element_at({_sql_map(max_time)}, _fid) AS time",
        f"{schema.sql_str(NEVER_COMPLETED)} AS error", "node", "assignment",
        "CAST(NULL AS MAP<STRING, BIGINT>) AS end_offsets",
        "CAST(NULL AS MAP<STRING, BIGINT>) AS positions",
        f"CAST(NULL AS {PROCESSED_TYPE}) AS processed",
        "CAST(NULL AS MAP<STRING, BIGINT>) AS offsets",
        f"CAST(NULL AS {FINAL_READS_TYPE}) AS final_reads",
        "final",
    )
    # Every question of the analysis starts from the operations: computed once, behind a short plan.
    operations = materialise(completed.union(open_ops))
    return Histories(
        paths=paths,
        ops=paired.select("_fid", *LINE_COLUMNS),
        operations=operations,
        problems=[state["problem"] for state in states],
        notes=notes,
        lines=lines,
        stats=stats,
        _persisted=persisted,
        _materialised=[operations],
    )
