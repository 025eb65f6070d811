"""Anomaly tables: a history file -> counts and witnesses per anomaly type.

In: a SparkSession, the path of a history file, how many example witnesses
to keep per type (`limit`), and optionally a folder for every witness.

Out: an `Analysis`:
- `counts`: anomaly type -> number of anomalies, only for types found: one
  per witness (below), except `unseen`, which counts values (the sum of its
  per-key witnesses' counts);
- `examples`: type -> at most `limit` witnesses, ordered by the smallest op
  index in their `ops`, then key, then offset or value, then the witness
  text (deterministic);
- `stats`: {"ops", "ok", "fail", "info"} over client operations only (the
  nemesis is not counted): `ops` operations invoked, and how they ended (an
  operation the history never completed counts as `info`); `by_f` (when
  there is a client operation): f -> {"invoked", "ok"}, the same counts per
  f; `heal_errors` (when there is one): [{"op" (the invocation's index),
  "error"}] for each `heal` of the nemesis whose completion line carries an
  error, in history order;
- `notes`: what was tolerated or could not be judged;
- `dependencies`, `hubs`: see result.DEPENDENCIES;
- `final_reads`: per key, sorted by key, its final log (result.FINAL_READS):
  {key, assign, end, read_to, known_end, complete}, for every key with a
  final chain or any evidence in its log.
With `full_dir`, every witness of every type computed here is written to
`full_dir/<type>.jsonl`, one JSON object a line, in the same order (an empty
file for a type not found, so a re-check never leaves stale witnesses).

Witnesses are data; `faultline.checker.explain` renders them. In every
witness, `ops` are history indices of the *completion* lines of the
operations that prove it (the invocation line for an operation the history
ends before completing), and `process` is an integer. Fields per type:
- lost-write, when reads passed it: key, value, offset (acknowledged),
  send_op, read_op (the earliest `ok` poll that returned an offset of key
  above `offset`), read_offset (the lowest such offset read_op returned),
  ops = [send_op, read_op];
  when the final log lacks it: key, value, offset, send_op, final_value
  (what the final log holds at offset, null: nothing), final_assign,
  final_end, final_read_to, ops = [send_op, final_assign];
- unseen (one witness per key): key, count, values, offsets, ops (the
  earliest few unseen sends of that key: values[i] at offsets[i] by ops[i]);
- duplicate: key, value, offsets, ops (ops[i] is the first op showing value
  at offsets[i]);
- inconsistent-offsets: key, offset, values, ops (ops[i] is the first poll
  that returned values[i] at offset);
- reused-offset (one per key, offset and acknowledged value): key, offset,
  value, send_op (its first ok send acknowledged there), other_value,
  other_op (the earliest other value at offset, by the first poll that
  returned it, or else its first acknowledgement), ops = [send_op, other_op];
- unexpected (one per key and value): key, value, offset (where the first
  poll returned it), offsets, reads (number of polls that returned it),
  ops (the first 16 of them);
- poll-skip: process, key, prev_offset (last offset of the earlier poll),
  next_offset (first of the later one), skipped (the first few offsets known
  to exist between them), skipped_count, ops = [earlier poll, later poll];
- nonmonotonic-poll: process, key, prev_offset, next_offset, ops;
- nonmonotonic-send: process, key, prev_offset, next_offset, prev_value,
  next_value, ops = [earlier send, later send];
- uncommitted-read (one per key, offset and value read): key, offset,
  value, final_value (null: the final log
  holds nothing there), final_op (the final-chain poll that read the
  offset, null when none did), final_assign (the assign that began the
  final chain), final_end (where the broker said the log ends, null when
  the history does not say), final_read_to (one past the highest offset
  the final chain read), ops = [the first poll that read value at offset,
  final_op or final_assign].

Definitions (shared/anomalies.md, made precise):
- the log of a key: (offset, value) from records of polls of any completion
  type and from `ok` sends carrying an offset;
- committed: values of `ok` sends and txns; and all values of an `info` one
  when any of its values was returned by any poll (then it took effect);
- lost-write: a committed value with a known offset o that no poll returned,
  while some `ok` poll returned an offset > o of its key; or else (once per
  key and value, at its first send) one that the final log of its key,
  complete and with a known end, does not hold at o;
- unseen: values of `ok` sends that no `ok` poll returned;
- duplicate: a value at two or more offsets of a key; inconsistent-offsets:
  an offset of a key at which polls returned two or more values;
  reused-offset: a value acknowledged at an offset where no poll returned
  it, while the log holds another value there (read or acknowledged);
  unexpected: a value a poll returned that no send (of any outcome,
  invocations included) sent to that key;
- poll-skip / nonmonotonic-poll: consecutive polls (of any outcome: the
  records a poll returned moved the consumer past them) of one process that
  returned records of a key, with no assign/subscribe (of any outcome) of
  that process between them; a = last offset of the earlier, b = first of
  the later: nonmonotonic if b <= a, skip if the log holds an offset in (a, b);
- nonmonotonic-send: consecutive `ok` sends of one process to a key with
  offsets: the later one's first offset is below the earlier one's last;
- the final log of a key (result.FINAL_READS): what its final chain returned
  (the last `ok` assign with seek_to_beginning naming it, then that
  process's later polls of it, of any outcome), its end (the latest `ok`
  `end_offsets` entry for it), and whether it is complete;
- uncommitted-read: an `ok` poll's (offset, value) is uncommitted when the
  final log holds other values there, or nothing while the final chain read
  a higher offset, or nothing at or beyond the end of a complete final log.
  A key that an `ok` poll read and no final chain read cannot be judged (a
  note says so).
Within one operation, records are in the order returned (mops, then records).
"""

from __future__ import annotations

import json
import os
from functools import reduce
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .load import History, file_size, load_history
from .result import SKIPPED_SHOWN, TYPES, UNEXPECTED_OPS, UNSEEN_VALUES, Analysis, unjudged_note
from .session import sized_for

__all__ = ["TYPES", "Analysis", "analyse"]

# Small summaries travel with the witnesses under internal types (every row
# kept), so one Spark job yields everything: each key's final log, and the
# operation counts by f and the failed heals of the stats.
_FINAL = "_final"
_BY_F = "_by_f"
_HEAL = "_heal"
_INTERNAL = (_FINAL, _BY_F, _HEAL)


def _events(history: History) -> DataFrame:
    """Every fact about a key, one row each, hash-partitioned by key.

    kind 'r': a record a poll returned; 's': a send micro-operation (of any
    outcome; offset as acknowledged, if any); 'a': an `ok` assign with
    seek_to_beginning naming the key; 'e': an `ok` operation's `end_offsets`
    entry for the key (offset: where the broker said its log ends). Columns:
    key, kind, op, process, assignment, type (of the operation), completed,
    offset, value, pos (order within the operation), mixed (the operation
    both sends and polls).
    Every anomaly below is a per-key question, so after this one shuffle the
    queries run with windows and aggregates inside the partitions: no
    further exchange (Spark accepts a key partitioning for any grouping that
    includes the key).
    """
    ops = history.operations.filter("process != 'nemesis'")
    per_mop = ops.selectExpr("op", "process", "assignment", "type", "completed",
                             "exists(mops, m -> m.f = 'send') AND exists(mops, m -> m.f = 'poll') AS mixed",
                             "posexplode(mops) AS (mpos, mop)")
    mop_events = per_mop.selectExpr("op", "process", "assignment", "type", "completed", "mixed", """explode(
        CASE WHEN mop.f = 'poll'
        THEN transform(coalesce(mop.records, array()), (r, i) -> named_struct(
            'key', r.key, 'kind', 'r', 'offset', r.offset, 'value', r.value,
            'pos', CAST(mpos AS LONG) * 4294967296 + i))
        ELSE array(named_struct('key', mop.key, 'kind', 's', 'offset', mop.offset, 'value', mop.value,
            'pos', CAST(mpos AS LONG)))
        END) AS e""").selectExpr("e.key AS key", "e.kind AS kind", "op", "process", "assignment", "type",
                                 "completed", "e.offset AS offset", "e.value AS value", "e.pos AS pos", "mixed")
    rest = ["op", "process", "assignment", "type", "completed", "CAST(0 AS LONG) AS pos", "false AS mixed"]
    seeks = (ops.filter("type = 'ok' AND f = 'assign' AND seek_to_beginning")
             .selectExpr("explode(array_distinct(keys)) AS key", "'a' AS kind", "CAST(NULL AS LONG) AS offset",
                         "CAST(NULL AS LONG) AS value", *rest))
    ends = (ops.filter("type = 'ok' AND end_offsets IS NOT NULL")
            .selectExpr("explode(end_offsets) AS (key, offset)", "'e' AS kind", "CAST(NULL AS LONG) AS value", *rest))
    # Persisted, so that every query reads the one shuffle (their column
    # pruning differs, which would otherwise give each its own exchange).
    return (mop_events.unionByName(seeks).unionByName(ends).repartition("key")
            .persist(StorageLevel.MEMORY_AND_DISK))


# The log of a key: what polls of any outcome returned, and acknowledged offsets.
_LOG = "kind = 'r' OR (kind = 's' AND type = 'ok' AND offset IS NOT NULL)"


def _witness(kind: str, df: DataFrame, fields: str, s1: str, s3: str, weight: str = "1") -> DataFrame:
    """Pack a type's rows as (type, sort keys, weight, JSON text) so all types share one table."""
    return df.selectExpr(
        f"'{kind}' AS type", f"CAST({s1} AS LONG) AS s1", "CAST(key AS STRING) AS s2", f"CAST({s3} AS LONG) AS s3",
        f"CAST({weight} AS LONG) AS weight",
        f"to_json(named_struct({fields}), map('ignoreNullFields', 'false')) AS json",
    )


def _value_flags(events: DataFrame) -> DataFrame:
    """Sends and reads, each marked with what happened to its (key, value) anywhere in the history."""
    return events.filter("kind IN ('r', 's')").selectExpr(
        "*",
        "max(kind = 's') OVER (PARTITION BY key, value) AS was_sent",
        "max(kind = 'r') OVER (PARTITION BY key, value) AS was_read",
        "max(kind = 'r' AND type = 'ok') OVER (PARTITION BY key, value) AS was_read_ok",
        "max(kind = 's' AND type != 'fail') OVER (PARTITION BY key, value) AS sent_not_failed",
        "min(CASE WHEN kind = 's' THEN op END) OVER (PARTITION BY key, value) AS send_op",
    )


def _aborted_read(flags: DataFrame) -> DataFrame:
    """G1a: values an ok poll returned whose every send failed."""
    rows = (flags.filter("kind = 'r' AND type = 'ok' AND was_sent AND NOT sent_not_failed")
            .groupBy("key", "value")
            .agg(F.min_by("offset", F.struct("op", "pos")).alias("offset"), F.min("op").alias("read_op"),
                 F.size(F.collect_set("op")).alias("reads"), F.first("send_op").alias("send_op")))
    return _witness("G1a", rows,
                    "'key', key, 'value', value, 'offset', offset, 'send_op', send_op, 'read_op', read_op, "
                    "'reads', reads, 'ops', array(send_op, read_op)",
                    "least(send_op, read_op)", "value")


def _precommitted_read(events: DataFrame) -> DataFrame:
    """An ok operation's poll returned a value that the same operation sent."""
    # Only an operation that both sends and polls can; the filter spares the window a sort of every event.
    rows = (events.filter("mixed AND kind IN ('r', 's')")
            .selectExpr("*", "max(kind = 's') OVER (PARTITION BY key, value, op) AS own")
            .filter("kind = 'r' AND type = 'ok' AND own"))
    return _witness("precommitted-read", rows,
                    "'process', CAST(process AS LONG), 'key', key, 'op', op, 'value', value, 'offset', offset, "
                    "'ops', array(op)",
                    "op", "offset")


def _duplicate_and_inconsistent(events: DataFrame) -> list[DataFrame]:
    """duplicate, inconsistent-offsets (polls returned two values at one offset) and reused-offset
    (an offset acknowledged for a value that no poll returned there holds another value)."""
    # One row per fact "offset o of key k held value v", with the first op showing it, the first
    # poll that returned it and the first ok send acknowledged with it.
    facts = (events.filter(_LOG).groupBy("key", "offset", "value")
             .agg(F.min("op").alias("op"), F.min(F.when(F.col("kind") == "r", F.col("op"))).alias("read_op"),
                  F.min(F.when(F.col("kind") == "s", F.col("op"))).alias("send_op")))
    dup = (facts.groupBy("key", "value")
           .agg(F.count(F.lit(1)).alias("n"), F.array_sort(F.collect_list(F.struct("offset", "op"))).alias("e"))
           .filter("n >= 2"))
    inc = (facts.filter("read_op IS NOT NULL").groupBy("key", "offset")
           .agg(F.count(F.lit(1)).alias("n"),
                F.array_sort(F.collect_list(F.struct("value", F.col("read_op").alias("op")))).alias("e"))
           .filter("n >= 2"))
    # What else the offset holds, each value named by the first poll that returned it, or else by
    # its first acknowledgement; the earliest of those other than the acknowledged value itself.
    reused = (facts.selectExpr("*", "array_sort(collect_list(struct(coalesce(read_op, send_op) AS op, value)) "
                                    "OVER (PARTITION BY key, offset)) AS there")
              .filter("send_op IS NOT NULL AND read_op IS NULL")
              .selectExpr("*", "filter(there, x -> x.value != value) AS others")
              .filter("size(others) > 0")
              .selectExpr("*", "others[0] AS other"))
    return [
        _witness("duplicate", dup, "'key', key, 'value', value, 'offsets', e.offset, 'ops', e.op",
                 "array_min(e.op)", "value"),
        _witness("inconsistent-offsets", inc, "'key', key, 'offset', offset, 'values', e.value, 'ops', e.op",
                 "array_min(e.op)", "offset"),
        _witness("reused-offset", reused,
                 "'key', key, 'offset', offset, 'value', value, 'send_op', send_op, 'other_value', other.value, "
                 "'other_op', other.op, 'ops', array(send_op, other.op)",
                 "least(send_op, other.op)", "offset"),
    ]


def _unexpected(flags: DataFrame) -> DataFrame:
    rows = (flags.filter("kind = 'r' AND NOT was_sent")
            .groupBy("key", "value")
            .agg(F.min_by("offset", F.struct("op", "pos")).alias("offset"),
                 F.array_sort(F.collect_set("offset")).alias("offsets"),
                 F.array_sort(F.collect_set("op")).alias("all_ops")))
    return _witness(
        "unexpected", rows,
        f"'key', key, 'value', value, 'offset', offset, 'offsets', offsets, 'reads', size(all_ops), "
        f"'ops', slice(all_ops, 1, {UNEXPECTED_OPS})",
        "all_ops[0]", "value")


def _final_logs(events: DataFrame) -> DataFrame:
    """Every event with its key's final log (result.FINAL_READS) alongside.

    Per key: `start` (op, process) of the last ok assign with seek_to_beginning naming it;
    `final_end` (the latest ok `end_offsets` entry for it, null if none); `known_end` (one past
    the highest offset the log holds, 0 if none); `read_to` (one past the highest offset the
    final chain read, 0 if none); `complete`. Per key and offset: `fvalues` (the values the
    final chain read there) and `ffirst` (the first such read, (op, value)). `final`: the row is a
    record of the final chain.
    """
    per_key = "OVER (PARTITION BY key)"
    per_offset = "OVER (PARTITION BY key, offset)"
    return (
        events.selectExpr(
            "*", f"max(CASE WHEN kind = 'a' THEN struct(op, process) END) {per_key} AS start",
            f"max(CASE WHEN kind = 'e' THEN struct(op, offset) END) {per_key} AS end_at",
            f"max(CASE WHEN {_LOG} THEN offset END) {per_key} AS known")
        .selectExpr("*", "coalesce(kind = 'r' AND process = start.process AND op > start.op, false) AS final")
        .selectExpr("*", f"coalesce(max(CASE WHEN final THEN offset + 1 END) {per_key}, 0) AS read_to",
                    f"collect_set(CASE WHEN final THEN value END) {per_offset} AS fvalues",
                    f"min(CASE WHEN final THEN struct(op, value) END) {per_offset} AS ffirst",
                    "end_at.offset AS final_end", "coalesce(known, -1) + 1 AS known_end")
        .selectExpr("*", "start IS NOT NULL AND read_to >= coalesce(final_end, known_end) AS complete")
    )


def _final_summaries(finals: DataFrame) -> DataFrame:
    """One internal row per key with a final chain or any evidence in its log: what the final
    reads showed (`Analysis.final_reads`), and whether an ok poll read the key (for the note on
    keys uncommitted-read cannot judge)."""
    rows = (finals.groupBy("key")
            .agg(F.max("start").alias("start"), F.max("final_end").alias("final_end"),
                 F.max("read_to").alias("read_to"), F.max("known_end").alias("known_end"),
                 F.max("known").alias("known"), F.max("complete").alias("complete"),
                 F.max(F.expr("kind = 'r' AND type = 'ok'")).alias("ok_read"))
            .filter("start IS NOT NULL OR known IS NOT NULL"))
    return rows.selectExpr(
        f"'{_FINAL}' AS type", "CAST(0 AS LONG) AS s1", "key AS s2", "CAST(0 AS LONG) AS s3",
        "CAST(1 AS LONG) AS weight",
        "to_json(named_struct('key', key, 'assign', start.op, 'end', final_end, 'read_to', read_to, "
        "'known_end', known_end, 'complete', complete, 'ok_read', ok_read), map('ignoreNullFields', 'false')) "
        "AS json")


def _lost_write(finals: DataFrame, flags: DataFrame) -> list[DataFrame]:
    """lost-write: a committed write some ok poll passed without returning it (first rule), or
    one the complete final log, whose end is known, does not hold at its offset (second rule)."""
    # An info operation took effect if any of its values was read; that is a
    # question across keys, answered by a (small) table of operations that
    # is broadcast, so the key partitioning stays.
    took_effect = (flags.filter("kind = 's' AND type = 'info' AND was_read").select("op").distinct()
                   .withColumn("took_effect", F.lit(True)))
    rows = (
        finals.filter("kind IN ('r', 's')")
        .selectExpr("*", "max(kind = 'r') OVER (PARTITION BY key, value) AS was_read")
        .filter("(kind = 'r' AND type = 'ok') OR (kind = 's' AND offset IS NOT NULL AND type IN ('ok', 'info'))")
        .join(F.broadcast(took_effect), "op", "left")
        .filter("kind = 'r' OR type = 'ok' OR took_effect")
        # Descending by offset, a send before the reads at its own offset
        # (they do not pass it): the running minimum over the reads seen so
        # far is the earliest ok poll that returned a higher offset.
        .selectExpr("*", """min(CASE WHEN kind = 'r' THEN struct(op, offset) END) OVER (
            PARTITION BY key ORDER BY offset DESC, kind DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
            AS passed""")
        .selectExpr("*", "kind = 's' AND NOT was_read AND passed IS NOT NULL AS passed_over")
        .selectExpr("*", "max(passed_over) OVER (PARTITION BY key, value) AS flagged")
    )
    # The second rule names each value once: at its first send, in history order.
    missing = (rows.filter("kind = 's' AND NOT flagged AND complete AND final_end IS NOT NULL "
                           "AND NOT array_contains(fvalues, value)")
               .selectExpr("*", "row_number() OVER (PARTITION BY key, value ORDER BY NOT completed, op, pos) AS nth")
               .filter("nth = 1"))
    return [
        _witness("lost-write", rows.filter("passed_over"),
                 "'key', key, 'value', value, 'offset', offset, 'send_op', op, 'read_op', passed.op, "
                 "'read_offset', passed.offset, 'ops', array(op, passed.op)",
                 "least(op, passed.op)", "offset"),
        _witness("lost-write", missing,
                 "'key', key, 'value', value, 'offset', offset, 'send_op', op, 'final_value', ffirst.value, "
                 "'final_assign', start.op, 'final_end', final_end, 'final_read_to', read_to, "
                 "'ops', array(op, start.op)",
                 "least(op, start.op)", "offset"),
    ]


def _unseen(flags: DataFrame) -> DataFrame:
    rows = (flags.filter("kind = 's' AND type = 'ok' AND NOT was_read_ok")
            .selectExpr("*", "row_number() OVER (PARTITION BY key ORDER BY op, pos) AS rn")
            .groupBy("key")
            .agg(F.count(F.lit(1)).alias("n"),
                 F.array_sort(F.collect_list(F.expr(
                     f"CASE WHEN rn <= {UNSEEN_VALUES} THEN struct(op, pos, value, offset) END"))).alias("e")))
    return _witness("unseen", rows, "'key', key, 'count', n, 'values', e.value, 'offsets', e.offset, 'ops', e.op",
                    "e[0].op", "0", weight="n")


def _nonmonotonic_send(events: DataFrame) -> DataFrame:
    rows = (events.filter("kind = 's' AND type = 'ok' AND offset IS NOT NULL")
            .groupBy("process", "key", "op")
            .agg(F.min_by("offset", "pos").alias("first"), F.max_by("offset", "pos").alias("last"),
                 F.min_by("value", "pos").alias("first_value"), F.max_by("value", "pos").alias("last_value"))
            .selectExpr("*", "lag(last) OVER (PARTITION BY process, key ORDER BY op) AS prev_offset",
                        "lag(last_value) OVER (PARTITION BY process, key ORDER BY op) AS prev_value",
                        "lag(op) OVER (PARTITION BY process, key ORDER BY op) AS prev_op")
            .filter("first < prev_offset"))
    return _witness(
        "nonmonotonic-send", rows,
        "'process', CAST(process AS LONG), 'key', key, 'prev_offset', prev_offset, 'next_offset', first, "
        "'prev_value', prev_value, 'next_value', first_value, 'ops', array(prev_op, op)",
        "prev_op", "first")


def _polls(events: DataFrame, persisted: list[DataFrame]) -> list[DataFrame]:
    """poll-skip and nonmonotonic-poll, from consecutive polls of a process and key in one assignment."""
    # Over the log of a key in descending offset order, a running minimum over
    # the higher offsets is the next offset the log holds; applied again, the
    # one after that; the dense rank counts the distinct offsets in between.
    above = "OVER (PARTITION BY key ORDER BY offset DESC RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
    log = events.filter(_LOG).selectExpr(
        "*", "dense_rank() OVER (PARTITION BY key ORDER BY offset DESC) AS rank", f"min(offset) {above} AS next1")
    for i in range(2, SKIPPED_SHOWN + 1):
        log = log.selectExpr("*", f"min(next{i - 1}) {above} AS next{i}")
    nexts = ", ".join(f"next{i}" for i in range(1, SKIPPED_SHOWN + 1))
    # Read twice (across polls, and within one operation): computed once.
    log = log.persist(StorageLevel.MEMORY_AND_DISK)
    persisted.append(log)
    chain = "OVER (PARTITION BY process, assignment, key ORDER BY op)"
    # Polls of any outcome: whatever records a poll returned moved the consumer past them.
    pairs = (log.filter("kind = 'r'")
             .groupBy("process", "assignment", "key", "op")
             .agg(F.min_by("offset", "pos").alias("b"), F.min_by("rank", "pos").alias("rank_b"),
                  F.max_by(F.expr(f"struct(offset, rank, array({nexts}) AS nexts)"), "pos").alias("last"))
             .selectExpr("*", f"lag(last) {chain} AS prev", f"lag(op) {chain} AS prev_op")
             .filter("prev IS NOT NULL")
             .selectExpr("process", "key", "op", "prev_op", "prev.offset AS a", "b",
                         "prev.rank - rank_b - 1 AS skipped_count", "prev.nexts AS nexts"))
    # Within one operation: consecutive records (or acknowledged sends) of a key, in the order returned.
    within = "OVER (PARTITION BY op, key, kind ORDER BY pos)"
    inner = (log.filter("kind = 'r' OR (kind = 's' AND type = 'ok')")
             .selectExpr("*", f"lag(struct(offset, value, rank, array({nexts}) AS nexts)) {within} AS prev")
             .filter("prev IS NOT NULL")
             .selectExpr("kind", "process", "key", "op", "prev.offset AS a", "offset AS b", "prev.value AS va",
                         "value AS vb", "prev.rank - rank - 1 AS skipped_count", "prev.nexts AS nexts"))
    skip = "b > a + 1 AND skipped_count > 0"
    skipped = "'skipped', filter(nexts, x -> x IS NOT NULL AND x < b), 'skipped_count', skipped_count, "
    head = "'process', CAST(process AS LONG), 'key', key, 'op', op, 'prev_offset', a, 'next_offset', b, "
    values = "'prev_value', va, 'next_value', vb, "
    return [
        _witness("int-poll-skip", inner.filter(f"kind = 'r' AND {skip}"), head + skipped + "'ops', array(op)",
                 "op", "a"),
        _witness("int-nonmonotonic-poll", inner.filter("kind = 'r' AND b <= a"), head + "'ops', array(op)",
                 "op", "b"),
        _witness("int-send-skip", inner.filter(f"kind = 's' AND {skip}"),
                 head + values + skipped + "'ops', array(op)", "op", "a"),
        _witness("int-nonmonotonic-send", inner.filter("kind = 's' AND b <= a"),
                 head + values + "'ops', array(op)", "op", "b"),
        _witness("poll-skip", pairs.filter("b > a + 1 AND skipped_count > 0"),
                 "'process', CAST(process AS LONG), 'key', key, 'prev_offset', a, 'next_offset', b, "
                 "'skipped', filter(nexts, x -> x IS NOT NULL AND x < b), 'skipped_count', skipped_count, "
                 "'ops', array(prev_op, op)",
                 "prev_op", "a"),
        _witness("nonmonotonic-poll", pairs.filter("b <= a"),
                 "'process', CAST(process AS LONG), 'key', key, 'prev_offset', a, 'next_offset', b, "
                 "'ops', array(prev_op, op)",
                 "prev_op", "b"),
    ]


def _uncommitted_read(finals: DataFrame) -> DataFrame:
    """uncommitted-read: an ok poll's (offset, value) that the final log does not hold."""
    # The final chain takes a poll's records whatever its outcome (a poll that
    # reported an error may still have returned records, and the consumer's
    # position moved past them); only `ok` polls are judged against it.
    rows = (finals.filter("kind = 'r' AND type = 'ok'")
            .groupBy("key", "offset", "value")
            .agg(F.min("op").alias("op"), *[F.first(c).alias(c) for c in (
                "fvalues", "ffirst", "start", "final_end", "read_to", "complete")])
            .filter("start IS NOT NULL AND read_to > 0 AND ((size(fvalues) > 0 AND NOT array_contains(fvalues, value)) "
                    "OR (size(fvalues) = 0 AND (read_to > offset "
                    "OR (final_end IS NOT NULL AND complete AND offset >= final_end))))"))
    return _witness(
        "uncommitted-read", rows,
        "'key', key, 'offset', offset, 'value', value, 'final_value', ffirst.value, 'final_op', ffirst.op, "
        "'final_assign', start.op, 'final_end', final_end, 'final_read_to', read_to, "
        "'ops', array(op, coalesce(ffirst.op, start.op))",
        "least(op, coalesce(ffirst.op, start.op))", "offset")


def _operation_stats(history: History) -> list[DataFrame]:
    """Internal rows for the stats: per f, how many client operations were invoked and how many
    completed ok (ordered as first completed, then those the history never completed, by index);
    and every `heal` of the nemesis that completed with an error (by completion)."""
    by_f = (history.operations.filter("process != 'nemesis'").groupBy("f")
            .agg(F.count(F.lit(1)).alias("invoked"), F.count_if(F.expr("type = 'ok'")).alias("ok"),
                 F.min(F.expr("struct(NOT completed AS late, op)")).alias("first")))
    heals = history.operations.filter("process = 'nemesis' AND f = 'heal' AND completed AND error IS NOT NULL")
    return [
        by_f.selectExpr(f"'{_BY_F}' AS type", "CAST(first.late AS LONG) AS s1", "'' AS s2", "first.op AS s3",
                        "CAST(1 AS LONG) AS weight",
                        "to_json(named_struct('f', f, 'invoked', invoked, 'ok', ok)) AS json"),
        heals.selectExpr(f"'{_HEAL}' AS type", "op AS s1", "'' AS s2", "CAST(0 AS LONG) AS s3",
                         "CAST(1 AS LONG) AS weight", "to_json(named_struct('op', invoke, 'error', error)) AS json"),
    ]


def _dependencies(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The write-write and write-read dependencies between operations that can lie on a cycle,
    and those operations (the hubs).

    Edges: columns src, dst (operations), kind ('ww' or 'wr') and key; hubs: column op. See
    result.py for the definition the Python engine shares."""
    at = events.filter(_LOG).groupBy("key", "value").agg(F.min("offset").alias("at"))
    writes = (events.filter("kind = 's' AND type != 'fail'").select("key", "value", "op")
              .join(at, ["key", "value"]))
    writers = writes.groupBy("key", "op").agg(F.min("at").alias("at"))
    readers = events.filter("kind = 'r' AND type = 'ok'").select("key", "value", F.col("op").alias("reader"))
    hubs = (writers.groupBy("op").agg(F.count(F.lit(1)).alias("keys"))
            .join(readers.select(F.col("reader").alias("op")).distinct().withColumn("reads", F.lit(True)),
                  "op", "left")
            .filter("keys >= 2 OR reads").select("op", F.lit(True).alias("hub")))
    chain = (writers.join(hubs, "op", "left")
             .selectExpr("*", "last(CASE WHEN hub THEN op END, true) OVER (PARTITION BY key ORDER BY at, op "
                              "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS via"))
    ww = (chain.filter("hub")
          .selectExpr("op AS src", "lead(op) OVER (PARTITION BY key ORDER BY at, op) AS dst", "'ww' AS kind", "key")
          .filter("dst IS NOT NULL AND src != dst"))
    hub_readers = readers.join(hubs.select(F.col("op").alias("reader")), "reader")
    wr = (hub_readers.join(writes.select("key", "value", "op"), ["key", "value"])
          .join(chain.select("key", "op", "via"), ["key", "op"])
          .selectExpr("via AS src", "reader AS dst", "'wr' AS kind", "key")
          .filter("src IS NOT NULL AND src != dst"))
    return ww.unionByName(wr).distinct(), hubs.select("op")


def analyse(spark: SparkSession, path: str | os.PathLike, limit: int = 32, full_dir: str | os.PathLike | None = None
            ) -> Analysis:
    """Find the anomalies of the history at `path`; see the module docstring."""
    with sized_for(spark, file_size(str(path))):
        return _analyse(spark, str(path), limit, full_dir)


def _analyse(spark: SparkSession, path: str, limit: int, full_dir: str | os.PathLike | None) -> Analysis:
    history = load_history(spark, path)
    witnesses = events = None
    persisted: list[DataFrame] = []
    try:
        events = _events(history)
        flags = _value_flags(events)
        finals = _final_logs(events)
        parts = [*_lost_write(finals, flags), _unseen(flags), *_duplicate_and_inconsistent(events), _unexpected(flags),
                 *_polls(events, persisted), _nonmonotonic_send(events), _uncommitted_read(finals),
                 _aborted_read(flags), _precommitted_read(events), _final_summaries(finals),
                 *_operation_stats(history)]
        witnesses = reduce(DataFrame.union, parts).persist(StorageLevel.MEMORY_AND_DISK)
        # Counts and the first `limit` witnesses of each type in one job.
        by_type = Window.partitionBy("type")
        ordered = by_type.orderBy("s1", "s2", "s3", "json")
        keep = max(limit, 1)
        rows = (witnesses
                .select("type", "json", F.row_number().over(ordered).alias("rn"),
                        F.count(F.lit(1)).over(by_type).alias("rows"),
                        F.sum("weight").over(by_type).alias("total"))
                .filter(f"rn <= {keep} OR type IN ({', '.join(repr(t) for t in _INTERNAL)})")
                .collect())
        counts: dict[str, int] = {}
        row_counts: dict[str, int] = {}
        texts: dict[str, list[str]] = {}
        for r in sorted(rows, key=lambda r: (r["type"], r["rn"])):
            counts[r["type"]] = int(r["total"])
            row_counts[r["type"]] = int(r["rows"])
            texts.setdefault(r["type"], []).append(r["json"])

        internal = {t: [json.loads(j) for j in texts.pop(t, [])] for t in _INTERNAL}
        for t in _INTERNAL:
            counts.pop(t, None)
            row_counts.pop(t, None)
        finals = sorted(internal[_FINAL], key=lambda r: r["key"])
        stats: dict = dict(history.stats)
        if internal[_BY_F]:
            stats["by_f"] = {r["f"]: {"invoked": r["invoked"], "ok": r["ok"]} for r in internal[_BY_F]}
        if internal[_HEAL]:
            stats["heal_errors"] = internal[_HEAL]
        notes = list(history.notes)
        # Keys an ok poll read that no final chain read: uncommitted-read cannot judge them.
        unjudged = [r["key"] for r in finals if r["ok_read"] and (r["assign"] is None or r["read_to"] == 0)]
        if unjudged:
            notes.append(unjudged_note(unjudged, len(unjudged)))
        if full_dir is not None:
            _write_full(witnesses, Path(full_dir), row_counts, texts, limit)
        edges, hubs = _dependencies(events)
        dependencies = sorted((r["src"], r["dst"], r["kind"], r["key"]) for r in edges.toLocalIterator())
        hub_rows = sorted((r["op"], r["invoke"], str(r["process"]), r["type"]) for r in
                          hubs.join(history.operations.select("op", "invoke", "process", "type"), "op")
                          .toLocalIterator())
        return Analysis(
            counts={t: counts[t] for t in TYPES if t in counts},
            examples={t: [json.loads(j) for j in texts[t][:limit]] for t in TYPES if t in texts and limit > 0},
            stats=stats,
            notes=notes,
            dependencies=dependencies,
            hubs=hub_rows,
            final_reads=[{k: r[k] for k in ("key", "assign", "end", "read_to", "known_end", "complete")}
                         for r in finals],
        )
    finally:
        for df in (witnesses, events, *persisted):
            if df is not None:
                df.unpersist()
        history.unpersist()


def _write_full(witnesses: DataFrame, directory: Path, row_counts: dict[str, int],
                texts: dict[str, list[str]], limit: int) -> None:
    """Every witness of every type to directory/<type>.jsonl, written aside and renamed into place."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = {t: directory / f".{t}.jsonl.tmp" for t in TYPES}
    files = {t: open(p, "w") for t, p in tmp.items()}
    try:
        big = [t for t in TYPES if row_counts.get(t, 0) > max(limit, 1)]
        for t in TYPES:
            if t not in big:
                for text in texts.get(t, []):
                    files[t].write(text + "\n")
        if big:
            # Streamed partition by partition, so a huge table never sits in the driver.
            rows = (witnesses.filter(F.col("type").isin(*big))
                    .orderBy("type", "s1", "s2", "s3", "json").select("type", "json"))
            for r in rows.toLocalIterator():
                files[r["type"]].write(r["json"] + "\n")
    finally:
        for f in files.values():
            f.close()
    for t, p in tmp.items():
        p.replace(directory / f"{t}.jsonl")
