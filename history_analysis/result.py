"""What an analysis engine hands the checker, whichever engine it is.

In: nothing (definitions only; no Spark import, so the plain-Python engine
and the checker can use them without starting a JVM).
Out: `TYPES`, the anomaly types the engines find, in report order;
`Analysis`, their result (counts, example witnesses, stats, notes); and
`witness_order`, the order in which both engines list witnesses, so that
their examples and their `anomalies/<type>.jsonl` files agree line for line;
`Columns`, rows of a table that grows with the history (an Analysis's
dependencies and hubs) held as numpy columns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..models.anomaly_types import ENGINE, names

# The types the engines find, in report order: the registry's (models/anomaly_types.py).
TYPES = names(ENGINE)
UNEXPECTED_OPS = 16
UNSEEN_VALUES = 8
SKIPPED_SHOWN = 5
UNJUDGED_SHOWN = 8


class Columns(Sequence):
    """Rows held as columns: per column an int64 array, or for a text column (named in `texts`)
    int32 codes into a tuple of labels. A history of millions of operations has tens of millions
    of dependencies: as Python tuples they took gigabytes and most of a minute to build, as
    columns a few bytes a row, and the cycle search works on the columns (checker/cycles.py).

    In: column names, and per column its array (int) or (codes, labels) (text). Out: a sequence of
    row tuples (ints and strs, as the Python engine's lists hold them; equal to such a list with
    the same rows in the same order), `ints(name)`, `codes(name)`, `take(index)`, `sorted()`.
    """

    def __init__(self, names: tuple[str, ...], columns: list, texts: tuple[str, ...] = ()) -> None:
        self.names, self.texts = tuple(names), tuple(texts)
        self._cols = dict(zip(self.names, columns))
        first = self._cols[self.names[0]]
        self._len = len(first[0] if self.names[0] in self.texts else first)

    @classmethod
    def from_rows(cls, names: tuple[str, ...], rows, texts: tuple[str, ...] = ()) -> "Columns":
        if isinstance(rows, Columns):
            return rows
        rows = list(rows)
        cols = []
        for i, name in enumerate(names):
            values = [r[i] for r in rows]
            if name in texts:
                labels = tuple(dict.fromkeys(values))
                number = {v: n for n, v in enumerate(labels)}
                cols.append((np.fromiter((number[v] for v in values), dtype=np.int32, count=len(values)), labels))
            else:
                cols.append(np.array(values, dtype=np.int64).reshape(len(values)))
        return cls(names, cols, texts)

    def ints(self, name: str) -> np.ndarray:
        return self._cols[name]

    def codes(self, name: str) -> tuple[np.ndarray, tuple]:
        return self._cols[name]

    def take(self, index: np.ndarray) -> "Columns":
        """The rows at `index` (positions, or a boolean mask), in its order."""
        return Columns(self.names, [(c[0][index], c[1]) if n in self.texts else c[index]
                                    for n, c in self._cols.items()], self.texts)

    def sorted(self) -> "Columns":
        """The rows in tuple order (texts by their labels' order); rows alike keep their order."""
        if not self._len:
            return self
        # Neighbouring columns whose spans multiply to under 2^62 are sorted as one number (a row
        # of the dependencies of 1M operations, its four columns in one: one stable sort of 4.8M
        # numbers instead of a lexsort over four columns, a fifth of the time).
        packed: list[np.ndarray] = []
        span = 0
        for name in self.names:
            if name in self.texts:
                codes, labels = self._cols[name]
                rank = np.empty(len(labels), dtype=np.int64)
                rank[sorted(range(len(labels)), key=labels.__getitem__)] = np.arange(len(labels))
                key = rank[codes]
            else:
                key = self._cols[name]
            low, high = int(key.min()), int(key.max())
            if high - low >= 1 << 62:
                # Too wide to shift to zero in 64 bits, let alone to share a number.
                packed.append(key)
                span = 1 << 62
            elif packed and span * (high - low + 1) < 1 << 62:
                packed[-1] = packed[-1] * (high - low + 1) + (key - low)
                span *= high - low + 1
            else:
                packed.append(key - low)
                span = high - low + 1
        order = np.argsort(packed[0], kind="stable") if len(packed) == 1 else np.lexsort(packed[::-1])
        return self.take(order)

    def _column_list(self, name: str, index) -> list:
        if name in self.texts:
            codes, labels = self._cols[name]
            return [labels[c] for c in codes[index].tolist()]
        return self._cols[name][index].tolist()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(zip(*(self._column_list(n, index) for n in self.names)))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        return tuple(self._column_list(n, slice(index, index + 1))[0] for n in self.names)

    def __iter__(self):
        step = 1 << 16
        for start in range(0, self._len, step):
            yield from self[start:start + step]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Columns, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Columns({self.names}, {len(self)} rows)"


DEPENDENCY_COLUMNS = ("src", "dst", "kind", "key")
HUB_COLUMNS = ("op", "invoke", "process", "type")


@dataclass
class Analysis:
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Sorted (src op, dst op, 'ww' | 'wr', key): the dependency graph the checker
    # searches for G0 and G1c cycles (see DEPENDENCIES).
    # Either engine may hold them as Columns (DEPENDENCY_COLUMNS, texts kind and key).
    dependencies: list[tuple[int, int, str, str]] | Columns = field(default_factory=list)
    # Sorted (op, invoke index, process, type) of every node of the dependency graph (see
    # DEPENDENCIES): what the process and real-time orders between them are built from.
    # Or Columns (HUB_COLUMNS, texts process and type).
    hubs: list[tuple[int, int, str, str]] | Columns = field(default_factory=list)
    # Per key, sorted by key, what the final reads showed (see FINAL_READS): dicts with key,
    # assign, end, read_to, known_end, late_end, complete, outcome.
    final_reads: list[dict[str, Any]] = field(default_factory=list)


FINAL_READS = """\
A key's final log, as both engines derive it:
- its final chain is the records of that key returned, by polls of any completion type, to the
  process of the last assign with seek_to_beginning that completed ok and named the key, after
  that assign (later assigns of that process that keep the key do not end the chain);
- its end offset is the `end_offsets` entry for the key on the latest ok assign that has one,
  of the chain's process from its assign on (final reads ask the broker for it:
  history-format.md): where the chain's own reader last heard the log ends, since the log may
  grow past that after it read (a transaction's marker written once its coordinator aborted it)
  and another final reader hear of it; of any process for a key without a final chain; absent
  in histories that do not say;
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
