"""What an analysis engine hands the checker, whichever engine it is.

In: nothing (definitions only; no Spark import, so the plain-Python engine
and the checker can use them without starting a JVM).
Out: `TYPES`, the anomaly types the engines find, in report order;
`Analysis`, their result (counts, example witnesses, stats, notes); and
`witness_order`, the order in which both engines list witnesses, so that
their examples and their `anomalies/<type>.jsonl` files agree line for line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..models.anomaly_types import ENGINE, names

# The types the engines find, in report order: the registry's (models/anomaly_types.py).
TYPES = names(ENGINE)
UNEXPECTED_OPS = 16
UNSEEN_VALUES = 8
SKIPPED_SHOWN = 5
UNJUDGED_SHOWN = 8


@dataclass
class Analysis:
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Sorted (src op, dst op, 'ww' | 'wr', key): the dependency graph the checker
    # searches for G0 and G1c cycles (see DEPENDENCIES).
    dependencies: list[tuple[int, int, str, str]] = field(default_factory=list)
    # Sorted (op, invoke index, process, type) of every node of the dependency graph (see
    # DEPENDENCIES): what the process and real-time orders between them are built from.
    hubs: list[tuple[int, int, str, str]] = field(default_factory=list)
    # Per key, sorted by key, what the final reads showed (see FINAL_READS): dicts with key,
    # assign, end, read_to, known_end, late_end, complete, outcome.
    final_reads: list[dict[str, Any]] = field(default_factory=list)


FINAL_READS = """\
A key's final log, as both engines derive it:
- its final chain is the records of that key returned, by polls of any completion type, to the
  process of the last assign with seek_to_beginning that completed ok and named the key, after
  that assign (later assigns of that process that keep the key do not end the chain);
- its end offset is the `end_offsets` entry for the key on the latest ok assign that has one
  (final reads ask the broker for it: history-format.md); absent in histories that do not say;
- the final reads are complete for the key when the chain read up to the end offset (every
  offset below it), or, where there is no end offset, past every offset any send or poll showed;
  and in either case past every offset shown by a send or poll that completed after the assign
  (`late_end`: the log grew after that read began, as when a run stops before its final reads
  and an earlier consumer's rewind is the last one);
  a poll of the chain's process after its assign whose `positions` found the key's end counts as
  reading to there (past transaction markers and aborted records, which no consumer returns);
- once complete, an acknowledged write that the final log does not hold at its offset is a
  lost-write, and a value an ok poll read that the final log does not hold there is an
  uncommitted-read;
- its outcome is what the harness's final reader recorded for the key (the latest `final-reads`
  operation naming it: reached, unavailable or timeout; null when none does), passing over a
  record of a reader that learned nothing of the key (outcome timeout, no end, read_to 0: its
  time ran out before it began, as when its predecessor's crash outlasted the final phase)
  when another record names the key; anything but reached makes the verdict unknown.
Every key that a client sent to or read from needs complete final reads for the verdict to be
valid or invalid on its tail; otherwise it is unknown.
"""

DEPENDENCIES = """\
Dependencies between operations, as both engines derive them (Jepsen's Kafka checker:
`writer-of`, `readers-of`, `ww-graph`, `wr-graph`):
- the version order of a key: each value's position is the lowest offset at which the log of
  the key holds it (the log: what polls of any outcome returned, and acknowledged sends);
- a writer of key k is an operation of any outcome with a send to k whose value has a position;
  a send's place is its acknowledged offset, or else its value's position, but an unacknowledged
  send of a value that another operation sent too (an application's resend) has no place (the
  copy there may be the other's); the writer's position in k is the lowest place of its sends;
- ww: per key, each writer to the next by position (order: position, then operation), leaving
  out a writer whose position is an offset that holds another value too (inconsistent-offsets:
  the log contradicts itself there, and a value that may have been discarded orders nothing;
  Jepsen keeps one of the values, whichever its set yields first);
- wr: a poll of any outcome (Jepsen's readers-of takes every completion) in operation R returned
  (k, v) at offset o, and W wrote that record: from W to R, unless W is R. W wrote it if W's send
  of v to k was acknowledged at o, or else if W is the one operation that sent v to k; a value
  sent by two or more operations (an application's resend), none acknowledged at o, has no known
  writer there (either may have written that copy) and draws no wr edge.
Every operation that writes a value with a position or returned a record is a node (listed in
`hubs` with its invocation's index, its process and its type, so that the checker adds process and
real-time order between them): with order edges any such operation can lie on a cycle, a read from
the future being the shortest (a poll that returned v before v's send was invoked).
"""


def witness_json(witness: dict[str, Any]) -> str:
    """A witness as the engines write it: compact JSON, fields in their documented order."""
    return json.dumps(witness, separators=(",", ":"))


def witness_order(s1: int, key: str, s3: int, text: str) -> tuple:
    """Witnesses sort by (first operation, key, a per-type number, their JSON text)."""
    return (s1, key, s3, text)


def unjudged_note(keys: list[str], count: int) -> str:
    shown = ", ".join(keys[:UNJUDGED_SHOWN]) + (", ..." if count > UNJUDGED_SHOWN else "")
    return (f"uncommitted-read not judged for {count} key(s) ({shown}): no assign with "
            f"seek_to_beginning read them from the beginning")
