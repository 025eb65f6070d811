"""The report's timeline with Spark, for histories of any size: history file -> Timeline.

In: a Spark session, a history file (one the checker accepted: it is loaded and validated by
history_analysis.load, as for the analysis), and the operations whose timelines the report
draws (witnesses). Out: the `Timeline` that history_analysis.timeline.read_timeline builds in
plain Python, with the same figures (the tests hold the two to each other): Spark computes the
throughput, the latency quantiles, Jepsen's realtime lag and the unseen counts, chooses the
operations to draw (timeline.drawn_ops) and thins long series (timeline.bin_lags, bin_unseen),
so that only what the plots show reaches Python.
"""

from __future__ import annotations

import json
import math
import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..models.faults import fault_intervals
from .load import load_history
from .timeline import MAX_POINTS, QUANTILES, SLOWEST, SPREAD, Lag, Op, Timeline, bin_width

# An operation's records, one row each (column r), from the poll micro-operations of its mops.
_RECORDS = ("explode(flatten(transform(filter(coalesce(mops, array()), m -> m.f = 'poll'), "
            "m -> coalesce(m.records, array())))) AS r")
_ORDER = "PARTITION BY process, key ORDER BY op, ord ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"


def _op(r) -> Op:
    return Op(r["op"], r["process"], r["f"], r["type"], r["t0"], r["t1"])


def _throughput(done: DataFrame, end: float) -> dict[str, list[tuple[int, int]]]:
    seconds = int(math.ceil(end)) or 1
    counts = {t: [0] * seconds for t in ("ok", "fail", "info")}
    for r in (done.groupBy(F.expr(f"least(CAST(floor(t1) AS INT), {seconds - 1})").alias("s"), "type")
              .count().collect()):
        counts[r["type"]][r["s"]] += r["count"]
    return {t: list(enumerate(c)) for t, c in counts.items()}


def _quantiles(done: DataFrame) -> list[tuple[int, dict[float, float]]]:
    # The nearest rank, as timeline.quantiles_of: the ceil(q * n)-th smallest latency of the second.
    ranked = done.selectExpr("CAST(floor(t0) AS LONG) AS s", "t1 - t0 AS lat").selectExpr(
        "s", "lat", "row_number() OVER (PARTITION BY s ORDER BY lat) AS rn", "count(1) OVER (PARTITION BY s) AS n")
    rows = ranked.groupBy("s").agg(*[
        F.expr(f"max(CASE WHEN rn = greatest(1, CAST(ceil({q!r} * n) AS LONG)) THEN lat END)").alias(f"q{i}")
        for i, q in enumerate(QUANTILES)]).collect()
    return [(r["s"], {q: r[f"q{i}"] for i, q in enumerate(QUANTILES)}) for r in sorted(rows, key=lambda r: r["s"])]


def _drawn(done: DataFrame, completed: int) -> list[Op]:
    if completed <= MAX_POINTS:
        return sorted(map(_op, done.collect()), key=lambda o: o.op)
    slowest = {r["op"] for r in done.selectExpr("op", "t1 - t0 AS lat").orderBy(F.desc("lat"), "op")
               .limit(SLOWEST).collect()}
    others = done.filter("type != 'ok'").count() <= MAX_POINTS // 4
    stride = math.ceil(completed / (MAX_POINTS - SLOWEST))
    ops_in = ", ".join(map(str, sorted(slowest))) or "NULL"
    where = (f"op IN ({ops_in}) OR pmod(op * {SPREAD}, 4294967296) * {stride} < 4294967296"
             + (" OR type != 'ok'" if others else ""))
    return sorted(map(_op, done.filter(where).collect()), key=lambda o: o.op)


def _lags(spark: SparkSession, done: DataFrame, known: DataFrame, end: float) -> list[Lag]:
    """Jepsen's realtime lag (timeline._lags), as windows: per process and key, a position that
    a poll's records raise and an assign or subscribe resets, read at each ok poll or txn;
    then, per key, the earliest time an offset at or above the next one was known to exist."""
    ok = done.filter("type = 'ok'")
    reads = (ok.filter("f IN ('poll', 'txn')")
             .selectExpr("op", "process", _RECORDS)
             .selectExpr("op", "process", "r.key AS key", "r.offset AS offset"))
    keys = [r["key"] for r in reads.select("key").union(
        ok.filter("f = 'assign'").selectExpr("explode(keys) AS key")).distinct().collect()]
    if not keys:
        return []
    universe = spark.createDataFrame([(k,) for k in keys], "key STRING")
    # Per process and key, in history order: resets (0), the records of a poll (1), the poll's
    # question (2). An assign that names the key without rewinding it keeps its position.
    resets = (ok.filter("f IN ('assign', 'subscribe')").crossJoin(F.broadcast(universe))
              .selectExpr("process", "key", "op", "0 AS ord",
                          "f = 'subscribe' OR NOT coalesce(array_contains(keys, key), false) "
                          "OR coalesce(seek_to_beginning, false) AS breaks",
                          "f = 'assign' AND coalesce(array_contains(keys, key), false) AS member",
                          "CAST(NULL AS LONG) AS offset", "CAST(NULL AS DOUBLE) AS t0"))
    records = reads.selectExpr("process", "key", "op", "1 AS ord", "false AS breaks", "CAST(NULL AS BOOLEAN) AS member",
                               "offset", "CAST(NULL AS DOUBLE) AS t0")
    asks = (ok.filter("f IN ('poll', 'txn')").crossJoin(F.broadcast(universe))
            .selectExpr("process", "key", "op", "2 AS ord", "false AS breaks", "CAST(NULL AS BOOLEAN) AS member",
                        "CAST(NULL AS LONG) AS offset", "t0"))
    state = (resets.unionByName(records).unionByName(asks)
             .selectExpr("*", f"sum(CASE WHEN breaks THEN 1 ELSE 0 END) OVER ({_ORDER}) AS seg",
                         f"last(member, true) OVER ({_ORDER}) AS assigned")
             .selectExpr("*", "max(offset) OVER (PARTITION BY process, key, seg ORDER BY op, ord "
                              "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS pos")
             .filter("ord = 2 AND (coalesce(assigned, false) OR pos IS NOT NULL)")
             .selectExpr("key", "coalesce(pos, -1) + 1 AS offset", "1 AS kind", "t0", "CAST(NULL AS DOUBLE) AS t",
                         "process", "op"))
    events = known.selectExpr("key", "offset", "0 AS kind", "CAST(NULL AS DOUBLE) AS t0", "t",
                              "CAST(NULL AS LONG) AS process", "CAST(NULL AS LONG) AS op")
    lags = (events.unionByName(state)
            .selectExpr("*", "min(t) OVER (PARTITION BY key ORDER BY offset DESC, kind "
                             "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS expired")
            .filter("kind = 1")
            .selectExpr("t0 AS time", "process", "key", "op",
                        "CASE WHEN expired IS NULL THEN 0.0 ELSE greatest(0.0, t0 - expired) END AS lag")
            .persist())
    try:
        if lags.count() > MAX_POINTS:
            w = bin_width(end)
            # timeline.bin_lags: per key and bin the worst, the earliest of equals.
            rows = (lags.groupBy("key", F.expr(f"CAST(floor(time / {w!r}) AS LONG)").alias("b"))
                    .agg(F.expr("max_by(struct(time, process), struct(lag, -time)) AS at"), F.max("lag").alias("lag"))
                    .selectExpr("at.time AS time", "at.process AS process", "key", "lag").collect())
            return sorted((Lag(r["time"], r["process"], r["key"], r["lag"]) for r in rows),
                          key=lambda x: (x.time, x.key))
        rows = lags.orderBy("op", "key").collect()
        return [Lag(r["time"], r["process"], r["key"], r["lag"]) for r in rows]
    finally:
        lags.unpersist()


def _unseen(done: DataFrame, sent: DataFrame, end: float) -> dict[str, list[tuple[float, int]]]:
    acked = sent.groupBy("key", "value").agg(F.min("t").alias("t"))
    seen = (done.filter("type = 'ok'")
            .selectExpr("t1 AS t", _RECORDS)
            .groupBy("r.key", "r.value").agg(F.min("t").alias("seen")))
    steps = (acked.join(seen, ["key", "value"], "left")
             .selectExpr("key", "explode(array(named_struct('t', t, 'd', 1), "
                         "CASE WHEN seen IS NOT NULL THEN named_struct('t', greatest(seen, t), 'd', -1) END)) AS e")
             .filter("e IS NOT NULL").groupBy("key", "e.t").agg(F.sum("e.d").alias("d"))
             .selectExpr("key", "t", "CAST(sum(d) OVER (PARTITION BY key ORDER BY t "
                                     "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS INT) AS c")
             .persist())
    try:
        n_keys = steps.select("key").distinct().count()
        if steps.count() + n_keys > MAX_POINTS:
            w = bin_width(end)
            rows = (steps.groupBy("key", F.expr(f"CAST(floor(t / {w!r}) AS LONG)").alias("b"))
                    .agg(F.max("c").alias("c")).collect())
            binned: dict[str, dict[int, int]] = {}
            for r in rows:
                binned.setdefault(r["key"], {0: 0})
                binned[r["key"]][r["b"]] = max(binned[r["key"]].get(r["b"], 0), r["c"])
            return {k: [(b * w, c) for b, c in sorted(v.items())] for k, v in sorted(binned.items())}
        out: dict[str, list[tuple[float, int]]] = {}
        for r in steps.orderBy("key", "t").collect():
            series = out.setdefault(r["key"], [(0.0, 0)])
            if series[-1][0] == r["t"]:
                series[-1] = (r["t"], r["c"])
            else:
                series.append((r["t"], r["c"]))
        return out
    finally:
        steps.unpersist()


def _faults(spark: SparkSession, path: str):
    # The nemesis' lines, with their values (which the loaded operations do not keep): few, so
    # the file is scanned for them and they are parsed here.
    lines = spark.read.text(path).filter(F.col("value").contains('"nemesis"')).collect()
    ops = []
    for r in lines:
        try:
            line = json.loads(r["value"])
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("process") == "nemesis":
            ops.append((line["index"], line.get("type"), line.get("f"), line["time"] / 1e9, line.get("value")))
    return fault_intervals([op[1:] for op in sorted(ops, key=lambda op: op[0])])


def spark_timeline(spark: SparkSession, path: str | os.PathLike, witness_ops: list[int]) -> Timeline:
    """The Timeline of the history at `path`; `known` holds the operations of `witness_ops`."""
    path = str(path)
    history = load_history(spark, path)
    try:
        ops = history.operations
        end = (ops.agg(F.max("time")).first()[0] or 0) / 1e9
        client = ops.filter("process != 'nemesis'").selectExpr(
            "op", "CAST(process AS LONG) AS process", "f", "type", "invoke_time / 1e9 AS t0",
            "CASE WHEN completed THEN time / 1e9 END AS t1", "completed", "mops", "keys", "seek_to_beginning")
        done = client.filter("completed")
        counts = client.groupBy("completed").count().collect()
        completed = sum(r["count"] for r in counts if r["completed"])
        never = sum(r["count"] for r in counts if not r["completed"])
        sent = (done.filter("type IN ('ok', 'info')")
                .selectExpr("t1 AS t", "explode(filter(coalesce(mops, array()), "
                            "m -> m.f = 'send' AND m.offset IS NOT NULL)) AS m")
                .selectExpr("m.key AS key", "m.offset AS offset", "m.value AS value", "t"))
        records = (done.selectExpr("t1 AS t", _RECORDS)
                   .selectExpr("r.key AS key", "r.offset AS offset", "t"))
        known = sent.select("key", "offset", "t").unionByName(records)
        wanted = ", ".join(map(str, sorted(set(witness_ops)))) or "NULL"
        asked = {o.op: o for o in map(_op, client.filter(f"op IN ({wanted})").collect())}
        return Timeline(end, _drawn(done, completed), completed, never, _faults(spark, path),
                        _throughput(done, end), _quantiles(done), _lags(spark, done, known, end),
                        _unseen(done, sent, end), asked)
    finally:
        history.unpersist()

