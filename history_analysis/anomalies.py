"""Anomaly tables: a history file -> counts and witnesses per anomaly type.

In: a SparkSession, the path of a history file, how many example witnesses
to keep per type (`limit`), and optionally a folder for every witness.
`analyse_many`: several history files (and a folder for each), analysed in
one plan: per file its `Analysis`, or the HistoryError that refused it.
The histories are loaded with their side-cars (load.load_histories: the
operations read from `history.jsonl.operations/` while it matches the file,
and written there for a large history without one; the JSON again when a
side-car cannot be read midway), unless the environment sets
FAULTLINE_SIDECAR=0.
Every row of that plan carries `_fid`, its history's place in the list, and
every window, grouping and join includes it, so no answer mixes histories.

Out: an `Analysis`:
- `counts`: anomaly type -> number of anomalies, only for types found: one
  per witness (below), except `unseen`, which counts values (the sum of its
  per-key witnesses' counts);
- `examples`: type -> at most `limit` witnesses, ordered by the smallest op
  index in their `ops`, then key, then offset or value, then the witness
  text (deterministic);
- `stats`: {"ops", "ok", "fail", "info", "mixed"} over client operations
  only (the nemesis is not counted): `ops` operations invoked, and how they
  ended (an operation the history never completed counts as `info`);
  `mixed`, the operations whose mops both send and poll; `by_f` (when
  there is a client operation): f -> {"invoked", "ok"}, the same counts per
  f; `heal_errors` (when there is one): [{"op" (the invocation's index),
  "error"}] for each `heal` of the nemesis whose completion line carries an
  error, in history order;
- `notes`: what was tolerated or could not be judged;
- `dependencies`, `hubs`: see result.DEPENDENCIES;
- `final_reads`: per key, sorted by key, its final log (result.FINAL_READS):
  {key, assign, end, read_to, known_end, late_end, complete, outcome}, for every key
  with a final chain, any evidence in its log, or a final-reads record.
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
- duplicate, resent-duplicate: key, value, offsets, ops (ops[i] is the
  first op showing value at offsets[i]), sends (every operation that sent
  the value, of any outcome, by op: op, process, type; a process is one
  producer session);
- inconsistent-offsets: key, offset, values, ops (ops[i] is the first poll
  that returned values[i] at offset);
- reused-offset (one per key, offset and acknowledged value): key, offset,
  value, send_op (its first ok send acknowledged there), other_value,
  other_op (the earliest other value at offset, by the first poll that
  returned it, or else its first acknowledgement), ops = [send_op, other_op];
- unexpected (one per key and value): key, value, offset (where the first
  poll returned it), offsets, reads (number of polls that returned it),
  ops (the first 16 of them);
- int-poll-skip, int-nonmonotonic-poll: process, key, op, prev_offset,
  next_offset (consecutive records of the key in the op), [skipped,
  skipped_count,] ops = [op];
- int-send-skip, int-nonmonotonic-send: process, key, op, prev_offset,
  next_offset (positions in the version order), prev_value, next_value,
  [skipped, skipped_count,] ops = [op];
- G1a: key, value, offset, send_op, read_op, reads, ops = [send_op, read_op];
- precommitted-read: process, key, op, value, offset, ops = [op];
- poll-skip: process, key, prev_offset (last offset of the earlier poll),
  next_offset (first of the later one), skipped (the first few offsets known
  to exist between them), skipped_count, ops = [earlier poll, later poll];
- nonmonotonic-poll: process, key, prev_offset, next_offset, ops;
- nonmonotonic-send: process, key, prev_offset, next_offset (positions in
  the version order), prev_value, next_value, ops = [earlier send, later
  send];
- duplicate-consumption (one per key and offset): key, offset, value,
  processes, ops (the ok process operations that processed it, in order;
  processes[i] ran ops[i]);
- lost-consumption (one per key, offset and value of the log): key, offset,
  value, committed (the highest offset an ok commit or committed operation
  gave the key), committed_op (the earliest that gave it), ops =
  [committed_op];
- ownership-overlap: key, held (two holdings: process, since_op, until_op;
  history_analysis/ownership.py), ops = [the two since_ops];
- uncommitted-read (one per key, offset and value read): key, offset,
  value, final_value (null: the final log
  holds nothing there), final_op (the final-chain poll that read the
  offset, null when none did), final_assign (the assign that began the
  final chain), final_end (where the broker said the log ends, null when
  the history does not say), final_read_to (one past the highest offset
  the final chain read), ops = [the first poll that read value at offset,
  final_op or final_assign].

Definitions (shared/anomalies.md, made precise; reference.py is the oracle):
- acknowledged: a send micro-operation with an offset whose operation is
  `ok`, or `info` with f `send` (a plain send keeps the offsets its records
  got), or `info` and took effect (any of its values was returned by any
  poll); a `fail` operation's offsets are never in the log;
- the log of a key: (offset, value) from records of polls of any completion
  type and from acknowledged sends; the version order: a value's position is
  the lowest offset at which the log of its key holds it (null: nowhere); a
  send's position is its own acknowledged offset, or else its value's;
- lost-write: an acknowledged value that no poll returned, while some `ok`
  poll returned an offset > its offset o; or else (once per key and value,
  at its first send) one that the final log of its key, complete and with a
  known end, does not hold at o;
- unseen: values of acknowledged sends, and of `ok` sends without offset,
  that no `ok` poll returned;
- duplicate: a value at two or more offsets of a key, more offsets than the
  processes (producer sessions) whose sends, of any outcome, sent it;
  resent-duplicate: the same with no more offsets than those sessions
  (each may have written it once: the application sent it again);
  inconsistent-offsets:
  an offset of a key at which polls returned two or more values;
  reused-offset: a value acknowledged at an offset where no poll returned
  it, while the log holds another value there (read or acknowledged);
  unexpected: a value a poll returned that no send (of any outcome,
  invocations included) sent to that key;
- G1a: a value a poll of any outcome returned whose every send failed;
  precommitted-read: an operation of any outcome polled a value it sent;
- poll-skip / nonmonotonic-poll: consecutive polls (of any outcome: the
  records a poll returned moved the consumer past them; but a `txn` that
  failed or whose outcome is unknown is rolled back, consumer and all, so
  it is judged against the chain without moving it) of one process that
  returned records of a key, in one chain epoch: the epoch counts the `ok`
  assign/subscribe operations of the process before the poll that dropped
  the key or (an assign with seek_to_beginning) rewound it; a = last offset
  of the earlier, b = first of the later: nonmonotonic if b <= a, skip if
  the log holds an offset in (a, b);
- int-poll-skip / int-nonmonotonic-poll: the same between consecutive
  records of a key inside one operation, unless a rebalance during the
  operation (its rebalance_log) named the key;
- int-send-skip / int-nonmonotonic-send: consecutive sends of one operation
  (any outcome) to a key that both have a position, a and b:
  nonmonotonic if b <= a, skip if the log holds an offset in (a, b);
- nonmonotonic-send: per process and key, its `ok` and `info` operations
  sending to the key in order: the earlier one's last send and the later
  one's first both have a position, and the later position is not above;
- the final log of a key (result.FINAL_READS): what its final chain returned
  (the last `ok` assign with seek_to_beginning naming it, then that
  process's later polls of it, of any outcome), its end (the latest `ok`
  `end_offsets` entry for it of that process from that assign on; of any
  process when the key has no chain), whether it is complete, and the outcome the
  latest completed `final-reads` operation recorded for it (one that learned
  nothing of the key only when no other names it);
- duplicate-consumption: a record (key, offset) that two or more `ok`
  process operations processed; lost-consumption: an offset of the log of a
  key, below the highest offset `ok` commit or committed operations gave the
  key, that no `ok` or `info` process operation processed;
- uncommitted-read: an `ok` poll's (offset, value) is uncommitted when the
  final log holds other values there, or nothing while the final chain read
  a higher offset, or nothing at or beyond the end of a complete final log.
  A key that an `ok` poll read and no final chain read cannot be judged (a
  note says so).
Within one operation, records are in the order returned (mops, then records).
Offsets are compared without arithmetic that could overflow at the ends of
64 bits; read_to, known_end and late_end, one past an offset, are decimals.
"""

from __future__ import annotations

import gc
import json
import os
from functools import reduce
from pathlib import Path

import numpy as np
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..models import operations_table
from ..models.history import COMPLETIONS, HistoryError
from .load import Histories, file_size, load_histories
from .ownership import TYPE as OWNERSHIP
from .ownership import Call, End, overlaps, typed_entries
from .result import (DEPENDENCY_COLUMNS, HUB_COLUMNS, SKIPPED_SHOWN, TYPES, UNEXPECTED_OPS, UNSEEN_VALUES, Analysis,
                     Columns, unjudged_note, witness_json)
from .session import materialise, release, settings, sized_for

__all__ = ["TYPES", "Analysis", "analyse", "analyse_many"]

# Small summaries travel with the witnesses under internal types (every row
# kept), so one Spark job yields everything: each key's final log, and the
# operation counts by f and the failed heals of the stats.
_FINAL = "_final"
_BY_F = "_by_f"
_HEAL = "_heal"
_INTERNAL = (_FINAL, _BY_F, _HEAL)
# A final-reads record's outcome travels in an event's `value` as its 1-based place here.
_OUTCOMES = ("reached", "unavailable", "timeout")
_OUTCOME_ARRAY = "array(" + ", ".join(f"'{o}'" for o in _OUTCOMES) + ")"
# Its name again; a CASE, as element_at(array, NULL) gives the last element in generated code (Spark 4.3).
_OUTCOME = ("CASE CAST(record.value AS INT) "
            + " ".join(f"WHEN {i} THEN '{o}'" for i, o in enumerate(_OUTCOMES, 1)) + " END")


def _events(history: Histories) -> DataFrame:
    """Every fact about a key, one row each, hash-partitioned by key (not persisted: `_facts`
    reads it once).

    kind 'r': a record a poll returned; 's': a send micro-operation (of any
    outcome; offset as acknowledged, if any); 'a': an `ok` assign with
    seek_to_beginning naming the key; 'e': an `ok` operation's `end_offsets`
    entry for the key (offset: where the broker said its log ends); 'p': a
    poll's `positions` entry (offset: where its consumer found the end); 'q': a
    record an `ok` or `info` process operation processed; 'c': an `ok` commit
    or committed operation's `offsets` entry for the key; 'f': a
    record of a completed `final-reads` operation naming the key (value: the
    1-based place of its outcome in _OUTCOMES; pos: its place in the
    record; offset: 1 when it says anything of the key's log, else 0, as
    reference._informative). Columns: key, kind, op, invoke, process, type (of the
    operation), completed, offset, value, pos (order within the operation),
    plain (the operation's f is `send`), rolled_back (it is a `txn` that
    failed or whose outcome is unknown), mixed (it both sends and polls),
    moved (a record of a key that a rebalance during the operation named).
    Every anomaly below is a per-key question, so after this one shuffle the
    queries run with windows and aggregates inside the partitions: no
    further exchange (Spark accepts a key partitioning for any grouping that
    includes the key).
    """
    ops = history.operations.filter("process != 'nemesis'")
    common = ["_fid", "op", "invoke", "process", "type", "completed"]

    def event(key: str, kind: str, offset: str, value: str, pos: str, moved: str = "false",
              of_mop: bool = False) -> str:
        # Only a micro-operation's events carry what their operation is; the rest are false.
        flags = ", ".join(f"'{flag}', {flag if of_mop else 'false'}" for flag in ("plain", "rolled_back", "mixed"))
        return (f"named_struct('key', {key}, 'kind', '{kind}', 'offset', CAST({offset} AS LONG), "
                f"'value', CAST({value} AS LONG), 'pos', CAST({pos} AS LONG), 'moved', {moved}, {flags})")

    def when(condition: str, elements: str) -> str:
        return f"CASE WHEN {condition} THEN {elements} ELSE array() END"

    # Every event of an operation in one array, exploded once: each kind asked of the operations
    # apart scanned all of them again (a scan of 1M operations: 0.4 s, six of them).
    arrays = [
        "flatten(transform(coalesce(mops, array()), (mop, mpos) -> CASE WHEN mop.f = 'poll' "
        "THEN transform(coalesce(mop.records, array()), (r, i) -> "
        + event("r.key", "r", "r.offset", "r.value", "CAST(mpos AS LONG) * 4294967296 + i",
                "coalesce(array_contains(moved_keys, r.key), false)", of_mop=True)
        + ") ELSE array(" + event("mop.key", "s", "mop.offset", "mop.value", "mpos", of_mop=True) + ") END))",
        when("type = 'ok' AND f = 'assign' AND seek_to_beginning",
             "transform(array_distinct(keys), k -> " + event("k", "a", "NULL", "NULL", "0") + ")"),
        when("type = 'ok' AND end_offsets IS NOT NULL",
             "transform(map_entries(end_offsets), e -> " + event("e.key", "e", "e.value", "NULL", "0") + ")"),
        when("positions IS NOT NULL",
             "transform(map_entries(positions), e -> " + event("e.key", "p", "e.value", "NULL", "0") + ")"),
        when("f = 'process' AND type IN ('ok', 'info') AND processed IS NOT NULL",
             "transform(processed, (r, i) -> " + event("r.key", "q", "r.offset", "r.value", "i") + ")"),
        when("f IN ('commit', 'committed') AND type = 'ok' AND offsets IS NOT NULL",
             "transform(map_entries(offsets), e -> " + event("e.key", "c", "e.value", "NULL", "0") + ")"),
    ]
    if "final_reads" in history.operations.columns:
        arrays.append(when(
            "f = 'final-reads' AND completed AND final_reads IS NOT NULL",
            "transform(final_reads, (r, i) -> "
            + event("r.key", "f", "NOT (r.outcome = 'timeout' AND r.`end` IS NULL AND r.read_to = 0)",
                    f"array_position({_OUTCOME_ARRAY}, r.outcome)", "i") + ")"))
    per_op = ops.selectExpr(
        *common, "f = 'send' AS plain", "f = 'txn' AND type IN ('fail', 'info') AS rolled_back",
        "coalesce(exists(mops, m -> m.f = 'send') AND exists(mops, m -> m.f = 'poll'), false) AS mixed",
        "flatten(transform(coalesce(rebalance_log, array()), e -> coalesce(e.keys, array()))) AS moved_keys", "*")
    return (per_op.selectExpr(*common, f"explode(concat({', '.join(arrays)})) AS e")
            .selectExpr("e.key AS key", "e.kind AS kind", *common, "e.offset AS offset", "e.value AS value",
                        "e.pos AS pos", "e.plain AS plain", "e.rolled_back AS rolled_back", "e.mixed AS mixed",
                        "e.moved AS moved")
            .repartition("_fid", "key"))


def _took_effect(history: Histories) -> DataFrame | None:
    """The `info` operations, other than plain sends, that sent a value with an offset and took
    effect (a poll returned one of their values): column op, small enough to broadcast; None when
    no operation is a candidate (no `info` operation but plain sends sent with an offset: most
    histories without transactions), so that the records of every poll are not read for none.

    Asked of the operations (not the events, so that the events are shuffled once): the few
    candidates are broadcast, and the records of every poll are looked up in them."""
    # Without a client operation that ended `info` (the loaded stats count them) there is none.
    if not any(stats.get("info") for stats in history.stats):
        return None
    ops = history.operations.filter("process != 'nemesis'")
    candidates = (ops.filter("type = 'info' AND f != 'send' "
                             "AND exists(mops, m -> m.f = 'send' AND m.offset IS NOT NULL)")
                  .selectExpr("_fid", "op AS writer", "explode(filter(mops, m -> m.f = 'send')) AS m")
                  .selectExpr("_fid", "writer", "m.key AS key", "m.value AS value"))
    if candidates.isEmpty():
        return None
    records = (ops.filter("exists(mops, m -> m.f = 'poll')")
               .selectExpr("_fid", "explode(flatten(transform(filter(mops, m -> m.f = 'poll'), "
                           "m -> coalesce(m.records, array())))) AS r")
               .selectExpr("_fid", "r.key AS key", "r.value AS value"))
    return (records.join(F.broadcast(candidates), ["_fid", "key", "value"]).selectExpr("_fid", "writer AS op")
            .distinct().selectExpr("_fid", "op", "true AS took_effect"))


# The log of a key: what polls of any outcome returned, and acknowledged sends.
_LOG = "(kind = 'r' OR acked)"
# One past the highest offset the final chain read (0 if none), and past every offset the log
# holds: decimals, since one past the highest long is not a long.
_READ_TO = "greatest(CAST(read_max AS DECIMAL(20, 0)) + 1, 0)"
_KNOWN_END = "(coalesce(CAST(known AS DECIMAL(20, 0)), -1) + 1)"
# One past the highest offset shown by operations that completed after the final assign.
_LATE_END = "(coalesce(CAST(late AS DECIMAL(20, 0)), -1) + 1)"


# What a key's row in the keys table (`_facts`) holds besides _PRESENT and `complete`.
_KEY_COLUMNS = ("_fid", "key", "start", "known", "late", "read_max", "final_end", "ok_read")
# The facts join each event to its offset's row (a row per offset of a key's log) in a hash table
# built per partition, while no partition's keys span more offsets than this: a sort-merge join
# sorted every event by offset for the join alone (1M operations, 50k offsets a key: 1.5-2 s),
# but it spills where a hash table must fit in memory (a row of the offsets takes a few hundred
# bytes; a key of 10M offsets would not fit the default 4 GB).
_HASHED_OFFSETS = 1 << 20
# Which kinds of event a key has, each a column of the keys table: a witness query that needs a
# kind no key has is not asked (a correct history of sends and polls has no `q`, `c` or mixed
# operation, and few failed sends), sparing a scan of every event each.
_PRESENT = {"has_processed": "kind = 'q'", "has_commit": "kind = 'c'", "has_final_record": "kind = 'f'",
            "has_mixed": "mixed", "has_failed_send": "kind = 's' AND type = 'fail'"}


def _facts(history: Histories) -> tuple[DataFrame, DataFrame, dict]:
    """The events (`_events`), each with what the rules ask of its key, offset and value, and
    the keys: a row per key of what the rules ask of the key alone (`_KEY_COLUMNS`), which
    kinds of event it has (`_PRESENT`) and `span` (how many offsets its log can hold); both
    materialised (session.materialise: free them with session.release); and what `_present`
    found in the keys.

    Added columns: `acked` (an acknowledged send), `lo` (the offset, for a row in the log); per
    key: `known` (the highest offset of the log), `start` ((op, process) of the last ok assign with
    seek_to_beginning naming it), `late` (the highest offset of the log shown by an operation that
    completed after that assign), `final_end` (the latest ok `end_offsets` entry for it of the
    chain's process from that assign on; of any process without a chain), `read_max` (the highest
    offset the final chain read), `complete`; per row of the log: `rank` (of its offset among the
    log's distinct offsets, highest first: the offsets between two are counted by their ranks, and
    the few a witness lists are looked up by rank afterwards, `_skipped_listed`); `final` (a record
    of the final chain); per key and offset: `fvalues`, `ffirst` (the values the final chain read
    there, and its first read (op, value)), `omin`, `omax` (the least and greatest value the log
    holds there); per key and value: `was_sent`, `was_read`, `was_read_ok`, `sent_not_failed`,
    `send_op`, `last_send_op` (its first and last sender), `vmin`, `vmax` (the lowest and highest
    offset the log holds it at), on a send `at` (offset, rank, shared: whether the log holds
    another value at that offset too) of the send's place in the version order (its acknowledged
    offset, or else its value's position; null: unknown), on a record `senders` (the operations
    that sent its value, each with the offset it was acknowledged at); for lost-write, `passed` (on
    an acknowledged send: (op, offset) of the earliest ok poll that returned a higher offset). The
    facts keep the columns of `_NARROW` on every row, and the rest (but `known`, `late` and
    `final`, which nothing reads) in one struct, `detail`, only on a row that meets a rule of
    `_SUSPECTS` (null elsewhere: few rows of a correct history), which `_all_witnesses` unpacks.

    No window spans a key's events: a window holds each of its groups whole in one buffer, and a
    key of a long history has millions of events, which spilled in thousands of pieces that
    could not be read back within the heap (10M operations, 20 keys: out of memory). What is per
    key is an aggregate joined back (broadcast: a row per key); what is per offset of the log
    is an aggregate, then windows over those narrow rows (one per distinct offset), joined back
    by (key, offset), a hash join on the offsets. Both joins and every aggregate keep the events'
    partitioning by key: the events are sorted once, by value, inside the key partitions (the
    offsets, a row per offset, once by offset).
    """
    keyed = ["_fid", "key"]
    events, took_effect = _events(history), _took_effect(history)
    events = (events.join(F.broadcast(took_effect), ["_fid", "op"], "left") if took_effect is not None
              else events.selectExpr("*", "CAST(NULL AS BOOLEAN) AS took_effect"))
    events = (events
              .selectExpr("*", "kind = 's' AND offset IS NOT NULL AND (type = 'ok' OR (type = 'info' "
                               "AND (plain OR coalesce(took_effect, false)))) AS acked")
              .drop("took_effect", "plain")
              .selectExpr("*", f"CASE WHEN {_LOG} THEN offset END AS lo"))
    # Read by four queries below; each would otherwise explode and shuffle the operations again.
    events = base = materialise(events)
    per_key = (events.groupBy(*keyed)
               .agg(F.expr("max(lo) AS known"),
                    # At most this many offsets in the key's log (see _HASHED_OFFSETS).
                    F.expr("CAST(max(lo) AS DECIMAL(20, 0)) - min(lo) + 1 AS span"),
                    F.expr("max(CASE WHEN kind = 'a' THEN op END) AS start_op"),
                    F.expr("max_by(CASE WHEN kind = 'a' THEN CAST(process AS LONG) END, "
                           "CASE WHEN kind = 'a' THEN op END) AS start_process"),
                    F.expr("max_by(CASE WHEN kind = 'e' THEN offset END, CASE WHEN kind = 'e' THEN op END) AS any_end"),
                    *[F.expr(f"max({where}) AS {name}") for name, where in _PRESENT.items()])
               .selectExpr(*keyed, "known", "span",
                           "CASE WHEN start_op IS NOT NULL THEN struct(start_op AS op, "
                           "CAST(start_process AS STRING) AS process) END AS start", "any_end", *_PRESENT))
    # A row per key, computed once: each query below that joins it would otherwise aggregate
    # every event again. Maxima of longs (max_by), not of structs: a hash aggregate, where a
    # struct's maximum is a sort aggregate, a sort of every event by key.
    per_key = materialise(per_key)
    small = [per_key]
    events = (events.join(F.broadcast(per_key.drop("span", *_PRESENT)), keyed)
              .selectExpr("*", "coalesce(kind = 'r' AND process = start.process AND op > start.op, false) AS final"))
    own = "kind = 'e' AND process = start.process AND op >= start.op"
    chain = (events.groupBy(*keyed)
             .agg(F.expr("max(CASE WHEN lo IS NOT NULL AND op > start.op THEN lo END) AS late"),
                  # The chain's consumer found the end past records it never returns (markers).
                  F.expr("max(CASE WHEN final THEN offset WHEN kind = 'p' AND process = start.process "
                         "AND op > start.op THEN offset - 1 END) AS read_max"),
                  # Where the chain's own reader last heard the log ends: another final reader may
                  # have heard a later end (a transaction marker written after the first had read).
                  F.expr(f"max_by(CASE WHEN {own} THEN offset END, CASE WHEN {own} THEN op END) AS own_end"),
                  F.expr("max(kind = 'r' AND type = 'ok') AS ok_read")))
    # What is per key is computed here once, not on each of the key's events (the decimals of
    # `complete` are objects, not longs).
    keys = materialise(
        chain.join(per_key, keyed)
        .selectExpr(*keyed, "late", "read_max", "start", "known", "ok_read", "span", *_PRESENT,
                    "CASE WHEN start IS NULL THEN any_end ELSE own_end END AS final_end")
        .selectExpr(*_KEY_COLUMNS, "span", *_PRESENT,
                    f"start IS NOT NULL AND {_READ_TO} >= coalesce(final_end, {_KNOWN_END}) "
                    f"AND {_READ_TO} >= {_LATE_END} AS complete"))
    present = _present(keys)
    chain = keys.select(*keyed, "late", "read_max", "final_end", "complete")
    desc = "PARTITION BY _fid, key ORDER BY lo DESC"
    # The final chain's records are in the log: per offset, they share a rank.
    # Per (offset, value) first, in a hash aggregate of longs: the aggregate of sets and structs
    # below (a sort aggregate, in effect) then reads a row per pair, not each of its events.
    pairs = (events.filter("lo IS NOT NULL").groupBy(*keyed, "lo", "value")
             .agg(F.expr("min(CASE WHEN final THEN op END) AS final_op"),
                  F.expr("min(CASE WHEN kind = 'r' AND type = 'ok' THEN op END) AS polled_op")))
    offsets = (pairs.groupBy(*keyed, "lo")
               .agg(F.expr("collect_set(CASE WHEN final_op IS NOT NULL THEN value END) AS fvalues"),
                    F.expr("min(CASE WHEN final_op IS NOT NULL THEN struct(final_op AS op, value) END) AS ffirst"),
                    # Only an offset holding two values can be inconsistent or reused.
                    F.expr("min(value) AS omin"), F.expr("max(value) AS omax"),
                    # A record's offset is its `lo`.
                    F.expr("min(CASE WHEN polled_op IS NOT NULL THEN struct(polled_op AS op, lo AS offset) END) "
                           "AS polled"))
               .selectExpr(*keyed, "lo", "fvalues", "ffirst", "omin", "omax",
                           f"dense_rank() OVER ({desc}) AS rank",
                           # lost-write: the earliest ok poll that returned a higher offset.
                           f"min(polled) OVER ({desc} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS passed"))
    # The value first: a window sorts its rows by its partition's columns in the order written, and
    # a sort compares rows by the 8-byte prefix of its first column alone before comparing them
    # whole; _fid, the same on every row of one history, made every comparison a whole one.
    by_value = "OVER (PARTITION BY value, _fid, key)"
    facts = (
        events.join(F.broadcast(chain), keyed)
        .join(offsets.hint("shuffle_hash") if present["widest"] <= _HASHED_OFFSETS else offsets, [*keyed, "lo"], "left")
        .selectExpr(*[c for c in events.columns if c != "any_end"], "late", "read_max", "final_end", "rank",
                    "CASE WHEN acked THEN passed END AS passed",
                    "coalesce(fvalues, CAST(array() AS ARRAY<BIGINT>)) AS fvalues", "ffirst", "omin", "omax",
                    "complete")
        .selectExpr(
            "*",
            f"max(kind = 's') {by_value} AS was_sent",
            f"max(kind = 'r') {by_value} AS was_read",
            f"max(kind = 'r' AND type = 'ok') {by_value} AS was_read_ok",
            f"max(kind = 's' AND type != 'fail') {by_value} AS sent_not_failed",
            f"min(CASE WHEN kind = 's' THEN op END) {by_value} AS send_op",
            f"max(CASE WHEN kind = 's' THEN op END) {by_value} AS last_send_op",
            # Only a value at two offsets of the log is a duplicate.
            f"min(lo) {by_value} AS vmin", f"max(lo) {by_value} AS vmax",
            # A send's place in the version order: its own acknowledged offset (the log holds its
            # value there) or else its value's position. A value sent again by a later operation
            # (an application's resend) is placed where that operation wrote it, not where the
            # earlier one did.
            "CASE WHEN kind = 's' THEN coalesce(CASE WHEN lo IS NOT NULL THEN struct(lo AS offset, rank, "
            "omin != omax AS shared) END, min(CASE WHEN lo IS NOT NULL THEN struct(lo AS offset, rank, "
            f"omin != omax AS shared) END) {by_value}) END AS at",
            # Write-read dependencies: on a record, the operations that sent its value, with the
            # offsets they were acknowledged at.
            f"CASE WHEN kind = 'r' THEN collect_set(CASE WHEN kind = 's' THEN struct(op, CASE WHEN acked THEN offset "
            f"END AS at) END) {by_value} END AS senders")
    )
    # What only the witness queries of _SUSPECTS read is kept on the few rows that meet one of
    # them, in one struct (null on every other row), so the table every later query scans holds
    # the narrow columns alone.
    suspect = " OR ".join(f"({where})" for where in _SUSPECTS.values())
    detail = [c for c in facts.columns if c not in _NARROW and c not in ("known", "late", "final")]
    facts = facts.selectExpr(*_NARROW, f"CASE WHEN {suspect} THEN struct({', '.join(detail)}) END AS detail")
    # The join by (key, offset) keeps the partitioning by key of both sides instead of shuffling
    # them again (the setting applies to the plan of this one query).
    with settings(base.sparkSession, {"spark.sql.requireAllClusterKeysForCoPartition": "false"}):
        facts = materialise(facts)
    for df in (base, *small):
        release(df)
    return facts, keys, present


# A witness's `fill`: where its `skipped` list, null in its JSON text until `_skipped_listed`, is
# looked up: the offsets of the log of `key` ranked rank - 1 down to rank - n.
_FILL = "STRUCT<key: STRING, rank: INT, n: INT>"
_NO_FILL = f"CAST(NULL AS {_FILL}) AS fill"

# The columns of the facts that the queries over every fact read (orders, dependencies,
# consumption, final summaries, skipped offsets); the rest are in `detail`, on suspects alone.
_NARROW = ("_fid", "key", "kind", "op", "invoke", "process", "type", "offset", "value", "pos", "rolled_back", "moved",
           "acked", "lo", "rank", "at", "senders", "send_op", "last_send_op")

# A fact whose value the complete final log of its key, whose end is known, does not hold at its offset.
_FINAL_LACKS = "complete AND final_end IS NOT NULL AND NOT array_contains(fvalues, value)"

# The rows of the facts each of these witness queries reads, by the type it finds (or the first of
# several): few in a correct history. `_all_witnesses` materialises the facts that meet any of
# them once, and these queries read that small table instead of every fact each.
_SUSPECTS = {
    # Every acknowledged send that a poll passed or that the complete final log lacks: what
    # _lost_write asks of a value's sends is asked of these alone.
    "lost-write": f"acked AND ((NOT was_read AND passed IS NOT NULL) OR ({_FINAL_LACKS}))",
    "unseen": "kind = 's' AND (acked OR type = 'ok') AND NOT was_read_ok",
    # and resent-duplicate, inconsistent-offsets, reused-offset: a value at two offsets, or an
    # offset holding two values.
    "duplicate": "vmin != vmax OR omin != omax",
    "unexpected": "kind = 'r' AND NOT was_sent",
    # On every record, read_to > 0 and read_to > offset without read_to's decimals (objects): as
    # read_max >= 0 and read_max >= offset, read_to being read_max + 1 when positive.
    "uncommitted-read": "kind = 'r' AND type = 'ok' AND start IS NOT NULL AND read_max >= 0 "
                        "AND ((size(fvalues) > 0 AND NOT array_contains(fvalues, value)) "
                        "OR (size(fvalues) = 0 AND (read_max >= offset "
                        "OR (final_end IS NOT NULL AND complete AND offset >= final_end))))",
    "G1a": "kind = 'r' AND was_sent AND NOT sent_not_failed",
    # Only an operation that both sends and polls can.
    "precommitted-read": "mixed AND kind IN ('r', 's')",
}
# The kind of event (_PRESENT) without which a query of _SUSPECTS finds nothing: G1a needs a value
# whose every send failed; precommitted-read an operation that sends and polls.
_SUSPECT_NEEDS = {"G1a": "has_failed_send", "precommitted-read": "has_mixed"}


def _witness(kind: str, df: DataFrame, fields: str, s1: str, s3: str, weight: str = "1") -> DataFrame:
    """Pack a type's rows as (type, sort keys, weight, JSON text) so all types share one table."""
    return df.selectExpr(
        "_fid", f"'{kind}' AS type", f"CAST({s1} AS LONG) AS s1", "CAST(key AS STRING) AS s2", f"CAST({s3} AS LONG) AS s3",
        f"CAST({weight} AS LONG) AS weight",
        f"to_json(named_struct({fields}), map('ignoreNullFields', 'false')) AS json", _NO_FILL,
    )


def _witnesses(df: DataFrame, cases: list[tuple[str, ...]]) -> DataFrame:
    """`_witness` for several types (or shapes) from one table, computed once: cases are (type,
    condition, fields, s1, s3[, fill]), their conditions exclusive; `fill`, where the witness's
    `skipped` list is to be looked up (see _FILL)."""
    conds = [f"({c[1]})" for c in cases]

    def case(values: list[str]) -> str:
        return "CASE " + " ".join(f"WHEN {c} THEN {v}" for c, v in zip(conds, values)) + " END"

    return df.filter(" OR ".join(conds)).selectExpr(
        "_fid", f"{case([repr(c[0]) for c in cases])} AS type", f"CAST({case([c[3] for c in cases])} AS LONG) AS s1",
        "CAST(key AS STRING) AS s2", f"CAST({case([c[4] for c in cases])} AS LONG) AS s3", "CAST(1 AS LONG) AS weight",
        case([f"to_json(named_struct({c[2]}), map('ignoreNullFields', 'false'))" for c in cases]) + " AS json",
        f"CAST({case([c[5] if len(c) > 5 else 'NULL' for c in cases])} AS {_FILL}) AS fill",
    )


def _aborted_read(facts: DataFrame) -> DataFrame:
    """G1a: values a poll of any outcome returned whose every send failed."""
    rows = (facts.filter(_SUSPECTS["G1a"])
            .groupBy("_fid", "key", "value")
            .agg(F.min_by("offset", F.struct("op", "pos")).alias("offset"), F.min("op").alias("read_op"),
                 F.size(F.collect_set("op")).alias("reads"), F.first("send_op").alias("send_op")))
    return _witness("G1a", rows,
                    "'key', key, 'value', value, 'offset', offset, 'send_op', send_op, 'read_op', read_op, "
                    "'reads', reads, 'ops', array(send_op, read_op)",
                    "least(send_op, read_op)", "value")


def _precommitted_read(facts: DataFrame) -> DataFrame:
    """An operation of any outcome whose poll returned a value that the same operation sent."""
    # The filter spares the window a sort of every event.
    rows = (facts.filter(_SUSPECTS["precommitted-read"])
            .selectExpr("*", "max(kind = 's') OVER (PARTITION BY _fid, key, value, op) AS own")
            .filter("kind = 'r' AND own"))
    return _witness("precommitted-read", rows,
                    "'process', CAST(process AS LONG), 'key', key, 'op', op, 'value', value, 'offset', offset, "
                    "'ops', array(op)",
                    "op", "offset")


def _duplicate_and_inconsistent(facts: DataFrame) -> list[DataFrame]:
    """duplicate, inconsistent-offsets (polls returned two values at one offset) and reused-offset
    (an offset acknowledged for a value that no poll returned there holds another value)."""

    def held(where: str) -> DataFrame:
        # One row per fact "offset o of key k held value v", with the first op showing it, the first
        # poll that returned it and the first acknowledged send of it there; only of values at two
        # offsets, or of offsets holding two values (few: none in a correct history).
        return (facts.filter(f"{_LOG} AND {where}").groupBy("_fid", "key", "offset", "value")
                .agg(F.min("op").alias("op"), F.min(F.when(F.col("kind") == "r", F.col("op"))).alias("read_op"),
                     F.min(F.when(F.col("kind") == "s", F.col("op"))).alias("send_op")))

    dup = (held("vmin != vmax").groupBy("_fid", "key", "value")
           .agg(F.count(F.lit(1)).alias("n"), F.array_sort(F.collect_list(F.struct("offset", "op"))).alias("e"))
           .filter("n >= 2"))
    # Which operations sent a duplicated value (a producer session each, as a process is one), of any outcome;
    # asked only of values the log holds at two offsets (vmin and vmax are per key and value).
    senders = (facts.filter("kind = 's' AND vmin != vmax").groupBy("_fid", "key", "value")
               .agg(F.array_sort(F.collect_set(F.expr("struct(op, CAST(process AS LONG) AS process, type)")))
                    .alias("sends")))
    dup = (dup.join(senders, ["_fid", "key", "value"], "left").withColumn("sends", F.expr("coalesce(sends, array())"))
           .withColumn("resent", F.expr("n <= size(array_distinct(sends.process))")))
    # What else the offset holds, each value named by the first poll that returned it, or else by
    # its first acknowledgement; the earliest of those other than an acknowledged value itself.
    at_offset = "OVER (PARTITION BY _fid, key, offset)"
    offsets = (held("omin != omax").selectExpr(
        "*", f"array_sort(collect_list(struct(coalesce(read_op, send_op) AS op, value)) {at_offset}) AS there",
        f"array_sort(collect_list(CASE WHEN read_op IS NOT NULL THEN struct(value, read_op AS op) END) {at_offset}) "
        "AS reads",
        # The offset's inconsistency is told by a row a poll returned (never one that is reused).
        f"row_number() {at_offset.replace(')', ' ORDER BY read_op IS NULL, value)')} AS nth")
        .selectExpr("*", "CASE WHEN send_op IS NOT NULL AND read_op IS NULL "
                         "THEN try_element_at(filter(there, x -> x.value != value), 1) END AS other"))
    return [
        _witnesses(dup, [(kind, where, "'key', key, 'value', value, 'offsets', e.offset, 'ops', e.op, 'sends', sends",
                          "array_min(e.op)", "value")
                         for kind, where in (("duplicate", "NOT resent"), ("resent-duplicate", "resent"))]),
        _witnesses(offsets, [
            ("inconsistent-offsets", "nth = 1 AND size(reads) >= 2",
             "'key', key, 'offset', offset, 'values', reads.value, 'ops', reads.op", "array_min(reads.op)", "offset"),
            ("reused-offset", "other IS NOT NULL",
             "'key', key, 'offset', offset, 'value', value, 'send_op', send_op, 'other_value', other.value, "
             "'other_op', other.op, 'ops', array(send_op, other.op)",
             "least(send_op, other.op)", "offset")]),
    ]


def _unexpected(facts: DataFrame) -> DataFrame:
    rows = (facts.filter(_SUSPECTS["unexpected"])
            .groupBy("_fid", "key", "value")
            .agg(F.min_by("offset", F.struct("op", "pos")).alias("offset"),
                 F.array_sort(F.collect_set("offset")).alias("offsets"),
                 F.array_sort(F.collect_set("op")).alias("all_ops")))
    return _witness(
        "unexpected", rows,
        f"'key', key, 'value', value, 'offset', offset, 'offsets', offsets, 'reads', size(all_ops), "
        f"'ops', slice(all_ops, 1, {UNEXPECTED_OPS})",
        "all_ops[0]", "value")


def _consumption(facts: DataFrame, present: dict[str, bool]) -> list[DataFrame]:
    """duplicate-consumption and lost-consumption (see the module docstring); each only when some
    key has the events it needs (processed records; commits)."""
    twice = (facts.filter("kind = 'q' AND type = 'ok'").groupBy("_fid", "key", "offset")
             .agg(F.sort_array(F.collect_set(F.struct("op", "process", "value"))).alias("by"))
             .filter("size(by) > 1"))
    dup = _witness("duplicate-consumption", twice,
                   "'key', key, 'offset', offset, 'value', by[0].value, "
                   "'processes', transform(by, b -> CAST(b.process AS LONG)), 'ops', transform(by, b -> b.op)",
                   "by[0].op", "offset")
    committed = (facts.filter("kind = 'c'").groupBy("_fid", "key")
                 .agg(F.max(F.struct("offset", F.expr("-op").alias("neg"))).alias("c"))
                 .selectExpr("_fid", "key", "c.offset AS upto", "-c.neg AS committed_op"))
    maybe = facts.filter("kind = 'q'").select("_fid", "key", "offset").distinct()
    # The commits are a row per key: the log's rows below them are found without sorting the log.
    lost = (facts.filter("lo IS NOT NULL").selectExpr("_fid", "key", "lo AS offset", "value")
            .join(F.broadcast(committed), ["_fid", "key"]).filter("offset < upto").distinct()
            .join(maybe, ["_fid", "key", "offset"], "left_anti"))
    lost = _witness("lost-consumption", lost,
                    "'key', key, 'offset', offset, 'value', value, 'committed', upto, "
                    "'committed_op', committed_op, 'ops', array(committed_op)", "committed_op", "offset")
    return [df for df, needs in ((dup, "has_processed"), (lost, "has_commit")) if present[needs]]


def _ownership(spark: SparkSession, history: Histories) -> list[DataFrame]:
    """ownership-overlap (history_analysis/ownership.py): the operations with a rebalance log, and
    the last operation of each of their processes, are few (one per rebalance a consumer went
    through): gathered, swept in the driver, and the witnesses made a small table (none when
    there are none)."""
    ops = history.operations.filter("process != 'nemesis'")
    logged = ops.filter("completed AND exists(rebalance_log, e -> e.type IS NOT NULL)").select(
        "_fid", "op", "invoke", "process", "rebalance_log").collect()
    calls: dict[int, list[Call]] = {}
    for r in logged:
        calls.setdefault(r["_fid"], []).append(
            Call(r["op"], r["invoke"], int(r["process"]), typed_entries([e.asDict() for e in r["rebalance_log"]])))
    ends: dict[int, dict] = {fid: {} for fid in calls}
    if calls:
        holders = reduce(lambda x, y: x | y, [
            (F.col("_fid") == fid) & F.col("process").isin(*sorted({str(c.process) for c in cs}))
            for fid, cs in calls.items()])
        for r in (ops.filter(holders).groupBy("_fid", "process")
                  .agg(F.max(F.struct("op", "invoke", "type")).alias("last")).collect()):
            ends[r["_fid"]][int(r["process"])] = End(r["last"]["op"], r["last"]["invoke"], r["last"]["type"] == "info")
    rows = [(fid, OWNERSHIP, s1, key, s3, 1, witness_json(w))
            for fid in sorted(calls) for s1, key, s3, w in overlaps(sorted(calls[fid], key=lambda c: c.op), ends[fid])]
    if not rows:
        return []
    return [spark.createDataFrame(
        rows, "_fid LONG, type STRING, s1 LONG, s2 STRING, s3 LONG, weight LONG, json STRING")]


def _final_summaries(facts: DataFrame, keys: DataFrame, present: dict[str, bool]) -> DataFrame:
    """One internal row per key with a final chain, any evidence in its log, or a final-reads
    record: what the final reads showed (`Analysis.final_reads`), and whether an ok poll read the
    key (for the note on keys uncommitted-read cannot judge)."""
    # The latest completed final-reads operation naming the key (in one record, the last entry),
    # one that says anything of its log (offset 1) first.
    records = (facts.filter("kind = 'f'").groupBy("_fid", "key")
               .agg(F.max(F.expr("struct(offset, op, pos, value)")).alias("record")))
    if present["has_final_record"]:
        rows = keys.join(records, ["_fid", "key"], "left")
    else:
        rows = keys.selectExpr("*", f"CAST(NULL AS {records.schema['record'].dataType.simpleString()}) AS record")
    return rows.filter("start IS NOT NULL OR known IS NOT NULL OR record IS NOT NULL").selectExpr(
        "_fid", f"'{_FINAL}' AS type", "CAST(0 AS LONG) AS s1", "key AS s2", "CAST(0 AS LONG) AS s3",
        "CAST(1 AS LONG) AS weight",
        f"to_json(named_struct('key', key, 'assign', start.op, 'end', final_end, 'read_to', {_READ_TO}, "
        f"'known_end', {_KNOWN_END}, 'late_end', {_LATE_END}, 'complete', complete, "
        f"'outcome', {_OUTCOME}, 'ok_read', ok_read), "
        "map('ignoreNullFields', 'false')) AS json")


def _lost_write(facts: DataFrame) -> DataFrame:
    """lost-write: an acknowledged write some ok poll passed without returning it (first rule), or
    one the complete final log, whose end is known, does not hold at its offset (second rule: once
    per value, at its first acknowledged send in history order, unless the first rule names it).

    Asked of the suspects alone: a value's sends that a poll passed and that it was not read (the
    first rule), and those that the final log lacks (the second), are all among them, so what is
    per value is found there, not in a window over every fact."""
    passed_over = "NOT was_read AND passed IS NOT NULL"
    by_value = "OVER (PARTITION BY _fid, key, value)"
    rows = facts.filter(_SUSPECTS["lost-write"]).selectExpr(
        "*", f"max(acked AND passed IS NOT NULL) {by_value} AS passed_any",
        f"min(CASE WHEN {_FINAL_LACKS} THEN struct(NOT completed AS late, op, pos) END) {by_value} AS first_missing")
    return _witnesses(rows, [
        ("lost-write", passed_over,
         "'key', key, 'value', value, 'offset', offset, 'send_op', op, 'read_op', passed.op, "
         "'read_offset', passed.offset, 'ops', array(op, passed.op)",
         "least(op, passed.op)", "offset"),
        ("lost-write", "NOT (NOT was_read AND passed_any) AND struct(NOT completed AS late, op, pos) = first_missing",
         "'key', key, 'value', value, 'offset', offset, 'send_op', op, 'final_value', ffirst.value, "
         f"'final_assign', start.op, 'final_end', final_end, 'final_read_to', {_READ_TO}, "
         "'ops', array(op, start.op)",
         "least(op, start.op)", "offset")])


def _unseen(facts: DataFrame) -> DataFrame:
    """Acknowledged sends, and ok sends whose offset the client could not learn, that no ok poll returned."""
    rows = (facts.filter(_SUSPECTS["unseen"])
            .selectExpr("*", "row_number() OVER (PARTITION BY _fid, key ORDER BY op, pos) AS rn")
            .groupBy("_fid", "key")
            .agg(F.count(F.lit(1)).alias("n"),
                 F.array_sort(F.collect_list(F.expr(
                     f"CASE WHEN rn <= {UNSEEN_VALUES} THEN struct(op, pos, value, offset) END"))).alias("e")))
    return _witness("unseen", rows, "'key', key, 'count', n, 'values', e.value, 'offsets', e.offset, 'ops', e.op",
                    "e[0].op", "0", weight="n")


def _chain_epochs(history: Histories) -> DataFrame:
    """Per process, its ok assign and subscribe operations (op, keys, rewinds: an assign with
    seek_to_beginning): columns process, assigns. A process has few; the table is broadcast."""
    return (history.operations
            .filter("process != 'nemesis' AND type = 'ok' AND f IN ('assign', 'subscribe')")
            .groupBy("_fid", "process")
            .agg(F.collect_list(F.expr("struct(op, coalesce(keys, array()) AS keys, "
                                       "coalesce(f = 'assign' AND seek_to_beginning, false) AS rewinds)"))
                 .alias("assigns")))


def _skip(a: str, count: str, rank: str) -> tuple[str, str, str]:
    """(condition, witness fields, fill) of a skip from offset column `a`, ranked `rank` in the
    log, to b: b > a + 1 without computing a + 1, over `count` offsets the log holds between
    them, the first SKIPPED_SHOWN of which `_skipped_listed` puts in the witness."""
    return (f"b > {a} AND b - 1 > {a} AND {count} > 0",
            f"'skipped', CAST(NULL AS ARRAY<BIGINT>), 'skipped_count', {count}, ",
            f"named_struct('key', key, 'rank', {rank}, 'n', least({count}, {SKIPPED_SHOWN}))")


def _orders(facts: DataFrame, history: Histories) -> DataFrame:
    """Every order question, from one sort of each process's records and sends of a key, by
    operation and then as returned or sent: between consecutive records of one operation
    (int-poll-skip, int-nonmonotonic-poll; unless a rebalance during the operation named the key),
    of consecutive polls in one chain epoch (poll-skip, nonmonotonic-poll: the last record of the
    earlier, the first of the later), between consecutive sends of one operation by the positions
    of their values (int-send-skip, int-nonmonotonic-send; a send without one breaks the pair),
    and of the process's ok and info operations sending to the key (nonmonotonic-send: the
    earlier one's last value against the later one's first)."""
    # A chain's epoch: the ok assigns/subscribes of the process before the poll that dropped the
    # key or rewound it. Polls of any outcome: whatever records a poll returned moved the consumer.
    # The process first: a sort compares rows by its first column's prefix before comparing them
    # whole, and _fid is the same on every row of one history.
    order = "PARTITION BY process, key, kind, _fid ORDER BY op, pos"
    rows = (facts.filter("kind IN ('r', 's')")
            .join(F.broadcast(_chain_epochs(history)), ["_fid", "process"], "left")
            .selectExpr("*", "CASE WHEN kind = 'r' THEN size(filter(coalesce(assigns, array()), x -> x.op < op "
                             "AND (NOT array_contains(x.keys, key) OR x.rewinds))) END AS epoch",
                        "CASE WHEN kind = 'r' THEN struct(offset, rank, false AS shared) ELSE at END AS here")
            .selectExpr("*", f"lag(struct(op, here, value)) OVER ({order}) AS prev",
                        "last(CASE WHEN type IN ('ok', 'info') THEN struct(op, here.offset AS at, value) END, true) "
                        f"OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS sent",
                        # The chain across polls: the last record of the latest poll that moved the
                        # consumer (a rolled-back transaction is judged, but moves nothing).
                        "last(CASE WHEN kind = 'r' AND NOT rolled_back THEN struct(op, epoch, here) END, true) "
                        f"OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS chain")
            .selectExpr("_fid", "kind", "process", "key", "op", "type", "moved", "epoch", "prev.op AS prev_op",
                        "coalesce(prev.op = op, false) AS inside", "sent",
                        "prev.here.offset AS a", "here.offset AS b", "prev.value AS va", "value AS vb",
                        "prev.here.rank - here.rank - 1 AS skipped_count", "prev.here.rank AS a_rank",
                        "chain.op AS chain_op", "chain.epoch AS chain_epoch", "chain.here.offset AS ca",
                        "chain.here.rank - here.rank - 1 AS chain_skipped", "chain.here.rank AS ca_rank"))
    skip, skipped, fill = _skip("a", "skipped_count", "a_rank")
    chain_skip, chain_skipped, chain_fill = _skip("ca", "chain_skipped", "ca_rank")
    head = "'process', CAST(process AS LONG), 'key', key, 'op', op, 'prev_offset', a, 'next_offset', b, "
    values = "'prev_value', va, 'next_value', vb, "
    chain = "'process', CAST(process AS LONG), 'key', key, 'prev_offset', ca, 'next_offset', b, "
    return _witnesses(rows, [
        ("int-poll-skip", f"kind = 'r' AND inside AND NOT moved AND {skip}", head + skipped + "'ops', array(op)",
         "op", "a", fill),
        ("int-nonmonotonic-poll", "kind = 'r' AND inside AND NOT moved AND b <= a", head + "'ops', array(op)",
         "op", "b"),
        ("int-send-skip", f"kind = 's' AND inside AND {skip}", head + values + skipped + "'ops', array(op)",
         "op", "a", fill),
        ("int-nonmonotonic-send", "kind = 's' AND inside AND b <= a", head + values + "'ops', array(op)",
         "op", "b"),
        ("poll-skip", f"kind = 'r' AND NOT inside AND chain_epoch = epoch AND {chain_skip}",
         chain + chain_skipped + "'ops', array(chain_op, op)", "chain_op", "ca",
         chain_fill),
        ("nonmonotonic-poll", "kind = 'r' AND NOT inside AND chain_epoch = epoch AND b <= ca",
         chain + "'ops', array(chain_op, op)", "chain_op", "b"),
        ("nonmonotonic-send", "kind = 's' AND NOT inside AND type IN ('ok', 'info') AND b <= sent.at",
         "'process', CAST(process AS LONG), 'key', key, 'prev_offset', sent.at, 'next_offset', b, "
         "'prev_value', sent.value, 'next_value', vb, 'ops', array(sent.op, op)",
         "sent.op", "b"),
    ])


def _uncommitted_read(facts: DataFrame) -> DataFrame:
    """uncommitted-read: an ok poll's (offset, value) that the final log does not hold."""
    # The final chain takes a poll's records whatever its outcome (a poll that
    # reported an error may still have returned records, and the consumer's
    # position moved past them); only `ok` polls are judged against it. Every
    # condition is the record's own (its key's, offset's and value's): the few
    # records that meet them are grouped.
    rows = (facts.filter(_SUSPECTS["uncommitted-read"])
            .groupBy("_fid", "key", "offset", "value")
            .agg(F.min("op").alias("op"), *[F.first(c).alias(c) for c in (
                "ffirst", "start", "final_end", "read_max")]))
    return _witness(
        "uncommitted-read", rows,
        "'key', key, 'offset', offset, 'value', value, 'final_value', ffirst.value, 'final_op', ffirst.op, "
        f"'final_assign', start.op, 'final_end', final_end, 'final_read_to', {_READ_TO}, "
        "'ops', array(op, coalesce(ffirst.op, start.op))",
        "least(op, coalesce(ffirst.op, start.op))", "offset")


def _operation_stats(history: Histories, present: dict[str, bool]) -> list[DataFrame]:
    """Internal rows for the stats: per f, how many client operations were invoked, how many
    completed ok, and how many both send and poll (ordered as first completed, then those the
    history never completed, by index); and every `heal` of the nemesis that completed with an
    error (by completion)."""
    # Every send is an event, flagged when its operation also polls: without a flagged event
    # (`present`) no operation does, and the micro-operations, most of what a history holds, are not
    # read again for none.
    mixed = ("coalesce(exists(mops, m -> m.f = 'send') AND exists(mops, m -> m.f = 'poll'), false)"
             if present["has_mixed"] else "false")
    by_f = (history.operations.filter("process != 'nemesis'").groupBy("_fid", "f")
            .agg(F.count(F.lit(1)).alias("invoked"), F.count_if(F.expr("type = 'ok'")).alias("ok"),
                 F.count_if(F.expr(mixed)).alias("mixed"),
                 F.min(F.expr("struct(NOT completed AS late, op)")).alias("first")))
    heals = history.operations.filter("process = 'nemesis' AND f = 'heal' AND completed AND error IS NOT NULL")
    return [
        by_f.selectExpr("_fid", f"'{_BY_F}' AS type", "CAST(first.late AS LONG) AS s1", "'' AS s2", "first.op AS s3",
                        "CAST(1 AS LONG) AS weight",
                        "to_json(named_struct('f', f, 'invoked', invoked, 'ok', ok, 'mixed', mixed)) AS json"),
        heals.selectExpr("_fid", f"'{_HEAL}' AS type", "op AS s1", "'' AS s2", "CAST(0 AS LONG) AS s3",
                         "CAST(1 AS LONG) AS weight", "to_json(named_struct('op', invoke, 'error', error)) AS json"),
    ]


# The dependencies of a key and kind reach Python packed in this many lists (see _collected).
_CHUNKS = 16


def _dependencies(facts: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The write-write and write-read dependencies between operations (result.DEPENDENCIES), and
    the operations that can lie on a cycle (the hubs), as flat tables for collecting as Arrow.

    Edges: rows of _fid, key and kind, and `rows`, a list of (src, dst) structs; hubs: rows of
    _fid and HUB_COLUMNS (process as text). The edges are found inside the key partitions; only
    the hubs, an operation's question across keys, are shuffled (by operation)."""
    # A writer of key k: an operation of any outcome with a send whose position is known (and, if
    # unacknowledged, of a value no other operation sent); its position in k is the lowest of its
    # sends', and none when that offset holds another value too; each to the next (by position,
    # then operation).
    # `shared` is the offset's (every send placed at one offset of a key has the same), so the
    # lowest offset's is taken with it: a hash aggregate of longs, where the minimum of a struct
    # of both was a sort aggregate, a sort of every send.
    writers = (facts.filter("kind = 's' AND at IS NOT NULL AND (acked OR send_op = last_send_op)")
               .groupBy("_fid", "key", "op")
               .agg(F.expr("min(at.offset) AS at"), F.expr("min_by(at.shared, at.offset) AS shared"))
               .filter("NOT shared").select("_fid", "key", "op", "at"))
    ww = (writers.selectExpr("_fid", "key", "op AS src", "lead(op) OVER (PARTITION BY _fid, key ORDER BY at, op) AS dst")
          .filter("dst IS NOT NULL"))
    # To every operation whose poll (any outcome) returned (k, v) at offset o, from its writer: the
    # sends of (k, v) acknowledged at o, or else the one operation that sent it; a value sent by
    # two operations, neither acknowledged at o, has no known writer there. An edge found twice
    # (an operation read two values of one writer) is one.
    wr = (facts.filter("kind = 'r'")
          .selectExpr("_fid", "key", "op AS dst", "filter(senders, s -> s.at = offset).op AS there", "senders.op AS all")
          .selectExpr("_fid", "key", "dst", "explode(CASE WHEN size(there) > 0 THEN there WHEN size(all) = 1 THEN all "
                                    "ELSE array() END) AS src")
          .filter("src != dst").select("_fid", "key", "src", "dst").distinct())
    # An operation's invoke, process and type are its own: taken by the operation alone, as numbers, a
    # hash aggregate of longs (1M operations: 2.4-2.5 s, 2.7-2.9 s as a distinct of all four).
    code = {t: i for i, t in enumerate(COMPLETIONS)}
    as_code = "CASE type " + " ".join(f"WHEN '{t}' THEN {i}" for t, i in code.items()) + " END"
    as_type = "CASE t " + " ".join(f"WHEN {i} THEN '{t}'" for t, i in code.items()) + " END"
    hubs = (facts.filter("kind = 'r' OR (kind = 's' AND at IS NOT NULL)").groupBy("_fid", "op")
            .agg(F.expr("max(invoke) AS invoke"), F.expr("max(CAST(process AS LONG)) AS process"),
                 F.expr(f"max({as_code}) AS t"))
            .selectExpr("_fid", "op", "invoke", "CAST(process AS STRING) AS process", f"{as_type} AS type"))
    edges = (ww.selectExpr("_fid", "key", "'ww' AS kind", "src", "dst")
             .unionByName(wr.selectExpr("_fid", "key", "'wr' AS kind", "src", "dst"))
             .groupBy("_fid", "key", "kind", F.expr(f"pmod(hash(src, dst), {_CHUNKS}) AS chunk"))
             .agg(F.expr("collect_list(struct(src, dst)) AS rows")).drop("chunk"))
    return edges, hubs


def analyse(spark: SparkSession, path: str | os.PathLike, limit: int = 32, full_dir: str | os.PathLike | None = None
            ) -> Analysis:
    """Find the anomalies of the history at `path`; see the module docstring. Raises HistoryError
    for a history that cannot be read."""
    found = analyse_many(spark, [path], limit, [full_dir])[0]
    if isinstance(found, HistoryError):
        raise found
    return found


def analyse_many(spark: SparkSession, paths: list[str | os.PathLike], limit: int = 32,
                 full_dirs: list[str | os.PathLike | None] | None = None) -> list[Analysis | HistoryError]:
    """`analyse` of several histories in one plan: per path (in order), its Analysis, or the
    HistoryError that refused it. Every question is asked of all of them at once, each history
    apart from the others (its number is part of every key, process and operation), so the
    result of each is the one `analyse` gives it alone; what is paid per query (planning, a job,
    a task) is paid once for all. Several paths must be distinct local files."""
    paths = [str(p) for p in paths]
    dirs = list(full_dirs) if full_dirs is not None else [None] * len(paths)
    try:
        sizes = [file_size(p) for p in paths]
        with sized_for(spark, None if None in sizes else sum(s or 0 for s in sizes)):
            return _analyse(spark, paths, limit, dirs)
    finally:
        # The analysis's DataFrames sit in reference cycles, each holding its query plans in the JVM
        # until Python's cycle collector frees the proxy; left to run when it will, they filled a
        # 4 GB driver heap over a few hundred analyses in one session (the tests), which then spent
        # its time in garbage collection.
        gc.collect()


def _present(keys: DataFrame) -> dict:
    """Which kinds of event (_PRESENT) some key of some history has (name -> bool), and `widest`:
    the most offsets the log can hold in one partition of the events (the sum of its keys' spans;
    0 without a log)."""
    rows = keys.selectExpr("spark_partition_id() AS part", "span", *_PRESENT).collect()
    spans: dict[int, int] = {}
    for r in rows:
        spans[r["part"]] = spans.get(r["part"], 0) + int(r["span"] or 0)
    return {**{name: any(r[name] for r in rows) for name in _PRESENT}, "widest": max(spans.values(), default=0)}


def _all_witnesses(spark: SparkSession, history: Histories, facts: DataFrame, keys: DataFrame, present: dict
                   ) -> tuple[DataFrame, DataFrame]:
    """Every witness of every type, and the internal summaries (_INTERNAL), as one table; and the
    suspects it reads (materialised: release it once the table is no longer read). A type whose
    rule needs a kind of event no key has (`present`, see _present) is not asked: it has no witness."""
    asked = [t for t in _SUSPECTS if t not in _SUSPECT_NEEDS or present[_SUSPECT_NEEDS[t]]]
    suspects = materialise(facts.filter("detail IS NOT NULL").select(*_NARROW, "detail.*")
                           .filter(" OR ".join(f"({_SUSPECTS[t]})" for t in asked)))
    try:
        on_suspects = [_lost_write(suspects), _unseen(suspects), *_duplicate_and_inconsistent(suspects),
                       _unexpected(suspects), _uncommitted_read(suspects)]
        if "G1a" in asked:
            on_suspects.append(_aborted_read(suspects))
        if "precommitted-read" in asked:
            on_suspects.append(_precommitted_read(suspects))
        # The suspects are few (none in a correct history): each of their queries runs in as many
        # tasks as the cluster has cores, not one per partition of the events, every one of which
        # cost a task's scheduling (1M operations: 27 partitions, 10 queries, and as many again
        # when the table is read back).
        cores = spark.sparkContext.defaultParallelism
        parts = [*(p.coalesce(cores) for p in on_suspects),
                 _orders(facts, history), _final_summaries(facts, keys, present), *_ownership(spark, history),
                 *_consumption(facts, present), *_operation_stats(history, present)]
        table = reduce(DataFrame.union, [p if "fill" in p.columns else p.selectExpr("*", _NO_FILL) for p in parts])
    except BaseException:
        release(suspects)
        raise
    return table, suspects


def _skipped_listed(witnesses: DataFrame, facts: DataFrame) -> DataFrame | None:
    """The witnesses (persisted) with every skip's `skipped` list filled in from the log's
    offsets by rank, without `fill`; None when no witness has one to fill (every correct history),
    so the log's offsets are not gathered at all. The list is not carried on every event of the
    facts for the few skips: carried there, it cost about 5% of a check of 1M operations."""
    holes = witnesses.filter("fill IS NOT NULL")
    if holes.isEmpty():
        return None
    # A list depends only on its history and fill: looked up once per distinct pair.
    wanted = (holes.select("_fid", "fill").distinct()
              .selectExpr("_fid", "fill", "fill.key AS key", "explode(sequence(1, fill.n)) AS i")
              .selectExpr("_fid", "fill", "key", "i", "fill.rank - i AS rank"))
    offsets = facts.filter("lo IS NOT NULL").select("_fid", "key", "rank", "lo").distinct()
    lists = (wanted.join(offsets, ["_fid", "key", "rank"])
             .groupBy("_fid", "fill").agg(F.expr("array_sort(collect_list(struct(i, lo))).lo AS skipped")))
    columns = [c for c in witnesses.columns if c not in ("json", "fill")]
    filled = (holes.join(lists, ["_fid", "fill"], "left")
              .selectExpr(*columns, "replace(json, '\"skipped\":null', "
                                    "concat('\"skipped\":', to_json(coalesce(skipped, array())))) AS json"))
    return witnesses.filter("fill IS NULL").select(*columns, "json").unionByName(filled)


def _analyse(spark: SparkSession, paths: list[str], limit: int,
             full_dirs: list[str | os.PathLike | None]) -> list[Analysis | HistoryError]:
    history = load_histories(spark, paths, sidecars=os.environ.get("FAULTLINE_SIDECAR", "1") != "0")
    try:
        with settings(spark, history.conf):
            return _analysed(spark, history, limit, full_dirs)
    except Exception as exc:  # noqa: BLE001 - only a side-car Spark could not read is taken back
        if not (history.sidecars and operations_table.SUFFIX + "/" in str(exc)):
            raise
    # Read lazily (load._from_sidecars), a side-car removed or replaced while the analysis ran fails
    # a query midway: it is a cache, and the JSON is the record.
    return _analysed(spark, load_histories(spark, paths), limit, full_dirs)


def _analysed(spark: SparkSession, history: Histories, limit: int,
              full_dirs: list[str | os.PathLike | None]) -> list[Analysis | HistoryError]:
    """The analysis of each of the loaded histories (or its problem); frees what it loaded."""
    out: list[Analysis | HistoryError] = list(history.problems)
    accepted = [fid for fid, problem in enumerate(history.problems) if problem is None]
    if not accepted:
        history.unpersist()
        return out
    raw = witnesses = facts = keys = suspects = None
    try:
        facts, keys, present = _facts(history)
        raw, suspects = _all_witnesses(spark, history, facts, keys, present)
        raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
        listed = _skipped_listed(raw, facts)
        if listed is None:
            witnesses = raw.drop("fill")
        else:
            witnesses = listed.persist(StorageLevel.MEMORY_AND_DISK)
        # Counts and the first `limit` witnesses of each type of each history in one job.
        by_type = Window.partitionBy("_fid", "type")
        ordered = by_type.orderBy("s1", "s2", "s3", "json")
        keep = max(limit, 1)
        rows = (witnesses
                .select("_fid", "type", "json", F.row_number().over(ordered).alias("rn"),
                        F.count(F.lit(1)).over(by_type).alias("rows"),
                        F.sum("weight").over(by_type).alias("total"))
                .filter(f"rn <= {keep} OR type IN ({', '.join(repr(t) for t in _INTERNAL)})")
                .collect())
        found: dict[int, dict[str, tuple[int, int, list[str]]]] = {fid: {} for fid in accepted}
        for r in sorted(rows, key=lambda r: (r["_fid"], r["type"], r["rn"])):
            found[r["_fid"]].setdefault(r["type"], (int(r["total"]), int(r["rows"]), []))[2].append(r["json"])
        edges, hubs = _dependencies(facts)
        dependencies = _collected(edges, DEPENDENCY_COLUMNS, ("kind", "key"), accepted)
        hub_rows = _collected(hubs, HUB_COLUMNS, ("process", "type"), accepted)
        for fid in accepted:
            out[fid] = _analysis(history, fid, found[fid], dependencies[fid], hub_rows[fid], limit)
            if full_dirs[fid] is not None:
                _write_full(witnesses, fid, Path(full_dirs[fid]), found[fid], limit)
        return out
    finally:
        for df in (witnesses, raw):
            if df is not None:
                df.unpersist()
        for df in (facts, keys, suspects):
            if df is not None:
                release(df)
        history.unpersist()


def _collected(df: DataFrame, names: tuple[str, ...], texts: tuple[str, ...], fids: list[int]
               ) -> dict[int, Columns]:
    """A table of `_fid` and `names` brought to Python through Arrow, as sorted Columns per
    history (every one of `fids`, empty where it has no rows): no Python object per row.

    Columns missing from the table are fields of its column `rows`, a list of structs: rows
    packed per row of the table (whose other columns they share), which the driver receives in
    far fewer bytes than a row each (the 48M dependencies of 10M operations: under Spark's 1 GB
    limit on what one job returns, where a row each passed it)."""
    import pyarrow.compute as pc

    table = df.toArrow()
    if "rows" in table.column_names:
        packed = table.column("rows").combine_chunks()
        counts = pc.list_value_length(packed).to_numpy(zero_copy_only=False).astype(np.int64)
        inner = packed.flatten()
    else:
        counts, inner = None, None

    def column(name: str):
        if name in table.column_names:
            return table.column(name), counts
        return inner.field(name), None

    cols = []
    for name in names:
        values, repeats = column(name)
        if name in texts:
            encoded = pc.dictionary_encode(values)
            encoded = encoded.combine_chunks() if hasattr(encoded, "combine_chunks") else encoded
            codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
            cols.append((codes if repeats is None else np.repeat(codes, repeats),
                         tuple(encoded.dictionary.to_pylist())))
        else:
            ints = values.to_numpy().astype(np.int64)
            cols.append(ints if repeats is None else np.repeat(ints, repeats))
    every = Columns(names, cols, texts)
    fid_of, repeats = column("_fid")
    fid_of = fid_of.to_numpy() if repeats is None else np.repeat(fid_of.to_numpy(), repeats)
    if len(fids) == 1 and bool((fid_of == fids[0]).all()):
        return {fids[0]: every.sorted()}  # one history's: no copy of its rows to pick them
    return {fid: every.take(fid_of == fid).sorted() for fid in fids}


def _analysis(history: Histories, fid: int, found: dict[str, tuple[int, int, list[str]]], dependencies: list,
              hubs: list, limit: int) -> Analysis:
    """One history's Analysis from its rows of the witness table: per type (total, rows, the first
    texts)."""
    internal = {t: [json.loads(j) for j in found[t][2]] if t in found else [] for t in _INTERNAL}
    finals = sorted(internal[_FINAL], key=lambda r: r["key"])
    stats: dict = dict(history.stats[fid])
    stats["mixed"] = sum(r["mixed"] for r in internal[_BY_F])
    if internal[_BY_F]:
        stats["by_f"] = {r["f"]: {"invoked": r["invoked"], "ok": r["ok"]} for r in internal[_BY_F]}
    if internal[_HEAL]:
        stats["heal_errors"] = internal[_HEAL]
    notes = list(history.notes[fid])
    # Keys an ok poll read that no final chain read: uncommitted-read cannot judge them.
    unjudged = [r["key"] for r in finals if r["ok_read"] and (r["assign"] is None or r["read_to"] == 0)]
    if unjudged:
        notes.append(unjudged_note(unjudged, len(unjudged)))
    return Analysis(
        counts={t: found[t][0] for t in TYPES if t in found},
        examples={t: [json.loads(j) for j in found[t][2][:limit]] for t in TYPES if t in found and limit > 0},
        stats=stats,
        notes=notes,
        dependencies=dependencies,
        hubs=hubs,
        final_reads=[{k: r[k] for k in ("key", "assign", "end", "read_to", "known_end", "late_end", "complete",
                                        "outcome")}
                     for r in finals],
    )


def _write_full(witnesses: DataFrame, fid: int, directory: Path, found: dict[str, tuple[int, int, list[str]]],
                limit: int) -> None:
    """Every witness of every type of history `fid` to directory/<type>.jsonl, written aside and
    renamed into place; `found`: per type (total, rows, the first texts)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = {t: directory / f".{t}.jsonl.tmp" for t in TYPES}
    files = {t: open(p, "w") for t, p in tmp.items()}
    try:
        big = [t for t in TYPES if t in found and found[t][1] > max(limit, 1)]
        for t in TYPES:
            if t in found and t not in big:
                for text in found[t][2]:
                    files[t].write(text + "\n")
        if big:
            # Streamed partition by partition, so a huge table never sits in the driver.
            rows = (witnesses.filter((F.col("_fid") == fid) & F.col("type").isin(*big))
                    .orderBy("type", "s1", "s2", "s3", "json").select("type", "json"))
            for r in rows.toLocalIterator():
                files[r["type"]].write(r["json"] + "\n")
    finally:
        for f in files.values():
            f.close()
    for t, p in tmp.items():
        p.replace(directory / f"{t}.jsonl")
