"""Loading a history into Spark, validated line by line.

In: a SparkSession and the path of one history file (JSON Lines, see
shared/history-format.md), read with an explicit schema (no inference).

Out: a `History` with
- `ops`: one row per accepted line, in the history's own terms: `line`
  (1-based line number), `index`, `time`, `process` (a string: the integer
  written in decimal, or "nemesis"), `type`, `f`, `mops`, `keys`,
  `seek_to_beginning`, `rebalance_log`, `value` (raw JSON text), `error`, `node`,
  `end_offsets` (key -> offset where the broker said its log ends, on the
  final reads' assigns);
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
  `assignment` (which assignment of its process the operation ran in: how
  many assign/subscribe operations the process had invoked up to and
  including this one, 0 before the first; a consumer's position is only
  meaningful within one assignment. Unrelated to the broker's leader,
  producer and controller epochs);
- `notes`: what was tolerated (a torn last line, operations never completed);
- `lines`: the number of lines accepted; `stats`: operation counts of client
  (non-nemesis) processes: `ops` (operations invoked), `ok`, `fail`, `info`
  (never-completed operations count as `info`).

`History` unpacks as `(ops, notes)`. Its DataFrames are persisted; call
`unpersist()` when done.

A malformed file raises `faultline.models.history.HistoryError` naming the
file, the 1-based line number and the problem, as the Python reader
(`faultline.models.history.read_history`) would for the same file: bad JSON,
a missing or mistyped field, an index that is not the line's position, a
time earlier than the previous line's, a process invoking while its previous
operation is open, a completion with no invocation (or whose `f` differs from
its invocation's), an `end_offsets` that is not an object of key ->
non-negative integer. The last line, when it has no trailing newline and is not
valid JSON, is dropped with a note (the harness died while writing it).

Known leniencies against the Python reader (Spark's JSON reader coerces):
a number where a string is expected (`"key": 5`) is read as its text, a
process written as a string of digits (`"3"`) is read as process 3, and
bytes that are not UTF-8 are read as U+FFFD instead of refused.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..models.history import COMPLETIONS, KEY_FUNCTIONS, MOP_FUNCTIONS, TYPES, HistoryError, validate_line
from .session import sized_for

RECORD = T.StructType([
    T.StructField("key", T.StringType()),
    T.StructField("offset", T.LongType()),
    T.StructField("value", T.LongType()),
])
MOP = T.StructType([
    T.StructField("f", T.StringType()),
    T.StructField("key", T.StringType()),
    T.StructField("value", T.LongType()),
    T.StructField("offset", T.LongType()),
    T.StructField("records", T.ArrayType(RECORD)),
    # Why this record was not acknowledged (a send's own error).
    T.StructField("error", T.StringType()),
])
FINAL_READ = T.StructType([
    T.StructField("key", T.StringType()),
    T.StructField("end", T.LongType()),
    T.StructField("read_to", T.LongType()),
    T.StructField("outcome", T.StringType()),
])
LINE = T.StructType([
    T.StructField("index", T.LongType()),
    T.StructField("time", T.LongType()),
    # An int or "nemesis": a string field keeps both (Spark renders the int as text).
    T.StructField("process", T.StringType()),
    T.StructField("type", T.StringType()),
    T.StructField("f", T.StringType()),
    T.StructField("mops", T.ArrayType(MOP)),
    T.StructField("keys", T.ArrayType(T.StringType())),
    T.StructField("seek_to_beginning", T.BooleanType()),
    T.StructField("rebalance_log", T.ArrayType(T.StructType([T.StructField("keys", T.ArrayType(T.StringType()))]))),
    # Free-form JSON: a string field receives the raw JSON text.
    T.StructField("value", T.StringType()),
    T.StructField("error", T.StringType()),
    T.StructField("node", T.StringType()),
    # On an ok assign of the final reads: where the broker said each key's log ends.
    T.StructField("end_offsets", T.MapType(T.StringType(), T.LongType())),
    # On the completion of a `final-reads` operation: per key, how the final reader ended.
    T.StructField("final_reads", T.ArrayType(FINAL_READ)),
    T.StructField("final", T.BooleanType()),
    T.StructField("warning", T.StringType()),
    T.StructField("_corrupt", T.StringType()),
])
LINE_COLUMNS = ["line", "index", "time", "process", "type", "f", "mops", "keys", "seek_to_beginning",
                "rebalance_log", "value", "error", "node", "end_offsets", "final_reads", "final", "warning"]
REQUIRED = ("index", "time", "process", "type", "f")


@dataclass
class History:
    path: str
    ops: DataFrame
    operations: DataFrame
    notes: list[str] = field(default_factory=list)
    lines: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    _persisted: list[DataFrame] = field(default_factory=list, repr=False)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.ops, self.notes))

    def unpersist(self) -> None:
        for df in self._persisted:
            df.unpersist()
        self._persisted.clear()


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


def _structurally_bad() -> Column:
    """True for a line that does not fit the history format (checked again in Python for the message)."""
    # One SQL expression: built in the JVM with a single call, which matters
    # when many small histories are checked in one session.
    types = ", ".join(f"'{t}'" for t in TYPES)
    mop_fns = ", ".join(f"'{f}'" for f in MOP_FUNCTIONS)
    key_fns = ", ".join(f"'{f}'" for f in KEY_FUNCTIONS)
    required = " OR ".join(f"`{name}` IS NULL" for name in REQUIRED)
    return F.expr(f"""coalesce(
        _corrupt IS NOT NULL
        -- Spark's JSON reader stops after the first object; Python's rejects trailing data.
        OR NOT endswith(rtrim(_text), '}}')
        OR {required}
        OR NOT (process = 'nemesis' OR process RLIKE '^-?[0-9]+$')
        OR NOT type IN ({types})
        OR (f IN ({mop_fns}) AND process != 'nemesis' AND (mops IS NULL OR exists(mops, m ->
              m IS NULL OR NOT m.f IN ('send', 'poll')
              OR (m.f = 'send' AND (m.key IS NULL OR m.value IS NULL))
              OR (m.f = 'poll' AND exists(coalesce(m.records, array()), r ->
                    r IS NULL OR r.key IS NULL OR r.offset IS NULL OR r.value IS NULL)))))
        OR (f IN ({key_fns}) AND (keys IS NULL OR exists(keys, k -> k IS NULL)))
        OR (end_offsets IS NOT NULL AND exists(map_values(end_offsets), e -> e IS NULL OR e < 0))
        OR (final_reads IS NOT NULL AND exists(final_reads, r -> r IS NULL OR r.key IS NULL
              OR (r.end IS NOT NULL AND r.end < 0) OR r.read_to IS NULL OR r.read_to < 0
              OR r.outcome IS NULL OR NOT r.outcome IN ('reached', 'unavailable', 'timeout'))),
        true)""")


class _Problem(Exception):
    pass


def _raise(problem: str) -> None:
    raise _Problem(problem)


def _line_problem(text: str | None) -> str:
    """The problem with one line that Spark flagged, in the Python reader's words."""
    if text is None or not text.strip():
        return "empty line"
    try:
        op = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"bad JSON: {exc}"
    try:
        validate_line(op, _raise)
    except _Problem as exc:
        return str(exc)
    return "a field does not fit the history schema (for example an integer beyond 64 bits)"


def _sql_map(d: dict[int, int | None]) -> str:
    """A SQL literal map from longs to longs."""
    items = ", ".join(f"CAST({k} AS BIGINT), CAST({'NULL' if v is None else v} AS BIGINT)" for k, v in d.items())
    return f"map({items})"


def load_history(spark: SparkSession, path: str | os.PathLike) -> History:
    """Read and validate a history file; see the module docstring."""
    path = str(path)
    with sized_for(spark, file_size(path)):
        return _load(spark, path)


def file_size(path: str) -> int | None:
    """The size of a local file, None when unknown (not local, or absent)."""
    try:
        return _local(path).stat().st_size if _is_local(path) else None
    except OSError:
        return None


def _load(spark: SparkSession, path: str) -> History:
    if _is_local(path):
        p = _local(path)
        if not p.exists():
            raise HistoryError(path, None, "no such file")
        if p.is_dir():
            raise HistoryError(path, None, "is a directory, not a history file")
        # Spark reads a path as a glob pattern: escape a file name's own brackets, stars, ...
        spark_path = re.sub(r"([\\\[\]{}*?])", r"\\\1", str(p.resolve()))
    else:
        spark_path = path
    try:
        text = spark.read.option("lineSep", "\n").text(spark_path)
    except AnalysisException as exc:
        raise HistoryError(path, None, f"cannot read: {exc}") from None

    # Line numbers: rows of one file split come out in file order with
    # consecutive ids, so (split start, id - first id of the split) numbers
    # every line exactly, without funnelling the file through one task.
    parsed = (
        text.select(
            F.monotonically_increasing_id().alias("_mid"),
            F.col("_metadata.file_block_start").alias("_blk"),
            F.col("value").alias("_text"),
            F.from_json("value", LINE, {"columnNameOfCorruptRecord": "_corrupt", "mode": "PERMISSIVE"}).alias("j"),
        )
        .select("_mid", "_blk", "_text", "j.*")
    )
    parsed = (
        parsed.withColumn("_bad", _structurally_bad())
        .withColumn("_raw", F.when(F.col("_bad"), F.col("_text")))
        .drop("_text", "_corrupt")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    persisted = [parsed]
    try:
        return _validate(spark, path, parsed, persisted)
    except BaseException:
        for df in persisted:
            df.unpersist()
        raise


def _validate(spark: SparkSession, path: str, parsed: DataFrame, persisted: list[DataFrame]) -> History:
    # One pass over the file for the splits (to number lines), the first
    # malformed line of each (with its text), the last line (for a torn
    # tail), and the operation counts: in a valid history every completion
    # closes one invocation, so what stays open is the difference.
    blocks = sorted(
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
    shift: dict[int, int] = {}
    first_id: dict[int, int] = {}
    prev_last_time: dict[int, int | None] = {}
    base, last_time = 1, None
    for b in blocks:
        if b["hi"] - b["lo"] + 1 != b["n"]:
            raise RuntimeError(f"cannot number the lines of {path}: split {b['_blk']} was not read in one run")
        shift[b["_blk"]] = base - b["lo"]
        first_id[b["_blk"]] = b["lo"]
        prev_last_time[b["_blk"]] = last_time
        base += b["n"]
        last_time = b["last_time"]
    total = base - 1

    notes: list[str] = []
    dropped = None
    if total and not _ends_with_newline(spark, path):
        last = blocks[-1]["last_line"]
        if last["_bad"] and _line_problem(last["_raw"]).startswith("bad JSON"):
            dropped = total
            notes.append(f"{path}:{total}: the last line is cut short (no newline, bad JSON) and was "
                         f"ignored: the harness stopped while writing it")

    # Every problem as (line, rank, message): the smallest line wins, and on
    # one line the Python reader's order of checks (structure, index, time, process).
    problems: list[tuple[int, int, str]] = []
    bad = sorted((b["first_bad"]["_mid"] + shift[b["_blk"]], b["first_bad"]["_raw"])
                 for b in blocks if b["first_bad"] is not None)
    bad = [(line, raw) for line, raw in bad if line != dropped]
    if bad:
        problems.append((bad[0][0], 0, _line_problem(bad[0][1])))

    lines = parsed.selectExpr("*", f"_mid + element_at({_sql_map(shift)}, _blk) AS line")
    if dropped is not None:
        lines = lines.filter(f"line != {dropped}")

    in_order = lines.selectExpr(
        "line", "index", "time",
        f"""CASE WHEN _mid = element_at({_sql_map(first_id)}, _blk) THEN element_at({_sql_map(prev_last_time)}, _blk)
            ELSE lag(time) OVER (PARTITION BY _blk ORDER BY _mid) END AS prev_time""",
    ).selectExpr(
        "line", "CASE WHEN index != line - 1 THEN 1 WHEN time < prev_time THEN 2 END AS rank",
        "CASE WHEN index != line - 1 THEN 'index' ELSE 'time' END AS code",
        "index AS n1", "time AS n2", "prev_time AS n3",
        "CAST(NULL AS STRING) AS s1", "CAST(NULL AS STRING) AS s2", "CAST(NULL AS STRING) AS s3",
        "CAST(NULL AS STRING) AS s4",
    ).filter("rank IS NOT NULL")

    chain = "OVER (PARTITION BY process ORDER BY line)"
    paired = lines.filter("process IS NOT NULL").selectExpr(
        *LINE_COLUMNS,
        *[f"lag({col}) {chain} AS prev_{name}" for col, name in (
            ("type", "type"), ("f", "f"), ("index", "index"), ("time", "time"),
            ("seek_to_beginning", "seek"))],
        # A completion that carries no mops/keys takes its invocation's.
        *[f"lag({col}) {chain} AS prev_{col}" for col in ("mops", "keys", "rebalance_log")],
        f"lead(type) {chain} AS next_type",
        "CAST(sum(CASE WHEN type = 'invoke' AND f IN ('assign', 'subscribe') THEN 1 ELSE 0 END) OVER ("
        "PARTITION BY process ORDER BY line ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS BIGINT) AS assignment",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    persisted.append(paired)
    one_at_a_time = paired.selectExpr(
        "line", "3 AS rank",
        """CASE WHEN type = 'invoke' AND prev_type = 'invoke' THEN 'open'
                WHEN type != 'invoke' AND (prev_type IS NULL OR prev_type != 'invoke') THEN 'orphan'
                WHEN type != 'invoke' AND f != prev_f THEN 'f' END AS code""",
        "prev_index AS n1", "CAST(NULL AS BIGINT) AS n2", "CAST(NULL AS BIGINT) AS n3",
        "process AS s1", "type AS s2", "f AS s3", "prev_f AS s4",
    ).filter("code IS NOT NULL")
    # Both checks in one job, which also fills the cache of `paired`.
    first = in_order.union(one_at_a_time).orderBy("line", "rank").limit(1).collect()
    if first:
        r = first[0]
        message = {
            "index": lambda: f"index {r['n1']} where {r['line'] - 1} was expected (indices run 0, 1, 2, ... with no gaps)",
            "time": lambda: f"time {r['n2']} is earlier than the previous line's {r['n3']}",
            "open": lambda: f"process {r['s1']} invokes while its operation at index {r['n1']} has not completed "
                            f"(one operation at a time)",
            "orphan": lambda: f"a {r['s2']} completion of process {r['s1']} with no invocation before it",
            "f": lambda: f"completion f {r['s3']!r} does not match its invocation's {r['s4']!r} (index {r['n1']})",
        }[r["code"]]()
        problems.append((r["line"], r["rank"], message))
    if problems:
        line, _, problem = min(problems)
        raise HistoryError(path, line, problem + "; fix or remove this line")

    total_of = lambda name: sum(b[name] or 0 for b in blocks)  # noqa: E731
    never = total_of("invokes") - total_of("completions")
    never_client = total_of("client_invokes") - sum(total_of(t) for t in COMPLETIONS)
    if never:
        notes.append(f"{never} invocation(s) never completed; counted as info")
    stats = {"ops": total_of("client_invokes"), "ok": total_of("ok"), "fail": total_of("fail"),
             "info": total_of("info") + never_client}
    max_time = max((b["max_time"] for b in blocks if b["max_time"] is not None), default=None)
    parsed.unpersist()
    persisted.remove(parsed)

    completed = paired.filter("type != 'invoke'").selectExpr(
        "index AS op", "prev_index AS invoke", "true AS completed", "process", "type", "f",
        "coalesce(mops, prev_mops) AS mops", "coalesce(keys, prev_keys) AS keys",
        "coalesce(seek_to_beginning, prev_seek) AS seek_to_beginning",
        "coalesce(rebalance_log, prev_rebalance_log) AS rebalance_log",
        "prev_time AS invoke_time", "time", "error", "node", "assignment",
        # The completion's own: an end offset is an answer, never part of a request.
        "end_offsets",
        "final_reads",
    )
    open_ops = paired.filter("type = 'invoke' AND next_type IS NULL").selectExpr(
        "index AS op", "index AS invoke", "false AS completed", "process", "'info' AS type", "f",
        "mops", "keys", "seek_to_beginning", "rebalance_log", "time AS invoke_time",
        f"CAST({'NULL' if max_time is None else max_time} AS BIGINT) AS time",
        "'never completed: the history ends first' AS error", "node", "assignment",
        "CAST(NULL AS MAP<STRING, BIGINT>) AS end_offsets",
        "CAST(NULL AS ARRAY<STRUCT<key: STRING, end: BIGINT, read_to: BIGINT, outcome: STRING>>) AS final_reads",
    )
    return History(
        path=path,
        ops=paired.select(*LINE_COLUMNS),
        operations=completed.union(open_ops),
        notes=notes,
        lines=total - (1 if dropped is not None else 0),
        stats=stats,
        _persisted=persisted,
    )
