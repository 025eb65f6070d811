"""The nemesis' operations as they appear in a history: which `f` starts a fault and which ends it.

In: nothing. Out: `ENDS` (the f of a fault's start -> the f that ends it), `WHOLE` (faults done
within one operation), `HEAL` (ends every fault), and `fault_intervals`, which turns a
history's nemesis operations into intervals. The nemesis modules name their operations with
these fs (a test holds them to this table); the report shades the intervals over its plots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

ENDS = {
    "start-partition": "stop-partition",
    "kill": "start",
    "pause": "resume",
    "power-off": "power-on",
    "bump-clock": "reset-clock",
    "kill-follower": "elect-stale",
    "kill-followers": "elect-follower",
    "kill-consumer": "consumers-rejoin",
    "kill-producer": "producers-restart",
}
# Faults that start and end inside one operation.
WHOLE = {"rolling-restart", "strobe-clock"}
HEAL = "heal"


@dataclass(frozen=True)
class Fault:
    """One fault in time: its f, from the invocation of its start to the completion of its end
    (seconds since the history began; end None: never ended), and what the nemesis said it did
    (the start's completion value)."""
    f: str
    start: float
    end: float | None
    value: Any


def fault_intervals(ops: Iterable[tuple[str, str, float, Any]]) -> list[Fault]:
    """`ops`: the nemesis' lines in history order, as (type, f, time in seconds, value). A start's
    fault lasts until the completion of the next operation that ends it (its end f or `heal`); an
    operation of WHOLE lasts from its invocation to its completion."""
    faults: list[Fault] = []
    open_: dict[str, tuple[float, Any]] = {}  # start f -> (invoked at, value)
    invoked: dict[str, float] = {}
    for type_, f, t, value in ops:
        if type_ == "invoke":
            invoked[f] = t
            continue
        if f in ENDS:
            # A repeated start before its end extends the open fault.
            open_.setdefault(f, (invoked.get(f, t), value))
        elif f in WHOLE:
            faults.append(Fault(f, invoked.get(f, t), t, value))
        ends = [s for s in open_ if ENDS[s] == f or f == HEAL]
        for s in ends:
            began, v = open_.pop(s)
            faults.append(Fault(s, began, t, v))
    faults.extend(Fault(s, began, None, v) for s, (began, v) in open_.items())
    return sorted(faults, key=lambda x: (x.start, x.f))
