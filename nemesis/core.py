"""The nemesis interface and the schedule that drives it.

In: a seed, the chosen fault kinds and an interval. Out: a reproducible
sequence of nemesis operations (`{"f": ..., "value": ...}`), alternating a
fault and its repair, that the runner records in the history as process
"nemesis"; and `Nemesis` objects that perform them and report exactly what
they did.

A nemesis is a tiny interface, as in Jepsen: `fs` (the functions it
performs), `invoke(op) -> value` (what was done) and `heal() -> value` (undo
every fault it still holds; always safe to call).
"""

from __future__ import annotations

import random
from typing import Any, Protocol

Op = dict[str, Any]


class Nemesis(Protocol):
    fs: tuple[str, ...]

    def invoke(self, op: Op) -> Any: ...

    def heal(self) -> Any: ...


class Schedule:
    """Fault, repair, fault, repair, ...: each fault kind is a (start, stop) pair of fs; a kind whose
    fault ends by itself (a rolling restart) has no stop f.

    A pure step function over an immutable state, so that the interpreter's generator
    (`Unfold(schedule.step, schedule.start)`) can ask for an op and not take it: `step(state)` ->
    `(op, delay in seconds before it, next state)`."""

    def __init__(self, seed: int, pairs: list[tuple[str, str | None]], interval: float):
        self.pairs = list(pairs)
        self.interval = interval
        # (the random stream's state, the repair owed for the last fault)
        self.start = (random.Random(f"{seed}/nemesis").getstate(), None)

    def step(self, state) -> tuple[Op, float, tuple]:
        rng_state, pending_stop = state
        rng = random.Random()
        rng.setstate(rng_state)
        if pending_stop is not None:
            op, pending_stop = {"f": pending_stop}, None
        else:
            start, pending_stop = rng.choice(self.pairs)  # stop is None for a fault that repairs itself
            op = {"f": start, "seed": rng.randrange(2**31)}
        delay = self.interval * rng.uniform(0.5, 1.5)
        return op, delay, (rng.getstate(), pending_stop)

    def ops(self, n: int) -> list[tuple[Op, float]]:
        """The first `n` (op, delay) pairs: the schedule as a list, to look at."""
        out, state = [], self.start
        for _ in range(n):
            op, delay, state = self.step(state)
            out.append((op, delay))
        return out


def leader_of_random_key(db, keys: list[str], rng: random.Random) -> tuple[str, str | None]:
    """A random key ("topic/partition") and the node that leads it now (None if nobody does)."""
    key = rng.choice(keys)
    topic, _, partition = key.rpartition("/")
    return key, db.leader(topic, int(partition))


def pick_nodes(rng: random.Random, candidates: list[str], total: int, target: str) -> list[str]:
    """Nodes among `candidates` (those still up) for a fault on "all" of them, a "majority" of the
    `total` nodes, or otherwise one at random."""
    if target == "all":
        return sorted(candidates)
    if target == "majority":
        return sorted(rng.sample(candidates, min(len(candidates), total // 2 + 1)))
    return [rng.choice(candidates)]
