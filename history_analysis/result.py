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
    # Sorted (op, invoke index, process, type) of every hub (see DEPENDENCIES): what the
    # process and real-time orders between them are built from.
    hubs: list[tuple[int, int, str, str]] = field(default_factory=list)
    # Per key, sorted by key, what the final reads showed (see FINAL_READS): dicts with key,
    # assign, end, read_to, known_end, complete.
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
- once complete, a committed write (an acknowledged send, or an indeterminate one of which a
  value was read) that the final log does not hold at its offset is a lost-write, and a value an
  ok poll read that the final log does not hold there is an uncommitted-read.
Every key that a client sent to or read from needs complete final reads for the verdict to be
valid or invalid on its tail; otherwise it is unknown.
"""

DEPENDENCIES = """\
Dependencies between operations, as both engines derive them:
- a writer of key k is an operation with a send to k, not failed, whose value
  the log of k holds; its position in k is the lowest offset at which the log
  holds any value it sent to k;
- a hub is a writer of two or more keys, or a writer that also read (one of
  its ok polls returned records); only hubs can lie on a cycle (a writer of one key that reads
  nothing is passed through along its key; a poll that writes nothing has
  no dependency out);
- ww: per key, each hub to the next hub by position (order: position, then
  operation): the writes of the first precede the second's in that log;
- wr: an ok poll of hub R returned (k, v) sent by writer W: from W if W is a
  hub, else from the last hub at or before W's position in k (its writes
  precede W's, which R read); none when there is no such hub or it is R.
Each hub is listed with its invocation's index, its process and its type, so
that the checker can add process and real-time order between hubs.
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
