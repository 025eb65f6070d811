"""ownership-overlap: two consumers of a group that both held one key at once, by their rebalance logs.

In: the client operations whose completion carries a typed `rebalance_log` (history-format.md),
as `Call`s, and how each of their processes ended (`End`). Out: witness rows (s1, key, s3, witness)
in the engines' order, one per overlap found.

A process holds a key for certain from the completion of the call whose log gave it the key (by
then its callback had run) until the invocation of the call whose log took it back or lost it: the
revocation happened during that call, so no earlier. A process that ended (its last operation
`info`: a crash, or an operation whose outcome is unknown, after which its client is closed) holds
nothing past that operation's invocation; one still running when the history ends holds on. Two
processes whose certain holdings of a key intersect held it at once, as their consumers believed:
a group coordinator that expelled one member (a session that expired, a member fenced) while it
went on polling, or that gave a key away before its holder gave it up.

The events are few (one per rebalance a consumer went through), so both engines gather them and
the sweep below runs once, in Python, for either: the engines differ only in how they collect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TYPE = "ownership-overlap"
TAKEN = ("revoked", "lost")


@dataclass(frozen=True)
class Call:
    """A client operation with a rebalance log: its op (completion index), invocation index,
    process, and the log's typed entries in order, as (type, keys)."""

    op: int
    invoke: int
    process: Any
    entries: tuple


@dataclass(frozen=True)
class End:
    """How a process ended: its last operation (op, invocation index) and whether it was `info`."""

    op: int
    invoke: int
    ended: bool


@dataclass(frozen=True)
class Holding:
    process: Any
    key: str
    since_op: int  # the call whose log gave it the key
    since: int  # that call's completion index
    until_op: int | None  # the call that took it away or ended the process; None: held to the end
    until: float  # that call's invocation index; infinity when held to the end


def holdings(calls: list[Call], ends: dict[Any, End]) -> list[Holding]:
    """Every process's certain holdings of keys, by its calls in history order."""
    out: list[Holding] = []
    by_process: dict[Any, list[Call]] = {}
    for c in calls:
        by_process.setdefault(c.process, []).append(c)
    for process, cs in by_process.items():
        held: dict[str, tuple[int, int]] = {}  # key -> (since_op, since)
        for c in sorted(cs, key=lambda c: c.op):
            given: set[str] = set()
            for kind, keys in c.entries:
                for key in keys:
                    if kind == "assigned":
                        given.add(key)
                    elif kind in TAKEN:
                        given.discard(key)
                        if key in held:
                            since_op, since = held.pop(key)
                            out.append(Holding(process, key, since_op, since, c.op, c.invoke))
            for key in given:
                held.setdefault(key, (c.op, c.op))
        end = ends.get(process)
        for key, (since_op, since) in held.items():
            if end is not None and end.ended:
                out.append(Holding(process, key, since_op, since, end.op, end.invoke))
            else:
                out.append(Holding(process, key, since_op, since, None, float("inf")))
    return out


def _side(h: Holding) -> dict:
    return {"process": h.process, "since_op": h.since_op, "until_op": h.until_op}


def overlaps(calls: list[Call], ends: dict[Any, End]) -> list[tuple[int, str, int, dict]]:
    """(s1, key, s3, witness: sorted by its operations) for each holding that began while another process's holding of the
    key, the one of them that lasts longest, had not ended: a sweep over each key's holdings by
    when they began."""
    by_key: dict[str, list[Holding]] = {}
    for h in holdings(calls, ends):
        by_key.setdefault(h.key, []).append(h)
    rows = []
    for key, hs in by_key.items():
        hs.sort(key=lambda h: (h.since, str(h.process)))
        longest: Holding | None = None
        for h in hs:
            if longest is not None and h.since < longest.until and h.process != longest.process:
                witness = {"key": key, "held": [_side(longest), _side(h)],
                           "ops": [longest.since_op, h.since_op]}
                rows.append((longest.since_op, key, h.since_op, witness))
            if longest is None or h.until > longest.until:
                longest = h
    return rows


def typed_entries(rebalance_log) -> tuple:
    """A rebalance log's entries that say their type, as (type, keys); untyped ones say nothing of
    holding."""
    return tuple((e["type"], tuple(e.get("keys") or ())) for e in rebalance_log or () if e.get("type"))
