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
    fault ends by itself (a rolling restart) has no stop f."""

    def __init__(self, seed: int, pairs: list[tuple[str, str]], interval: float):
        self.rng = random.Random(f"{seed}/nemesis")
        self.pairs = pairs
        self.interval = interval
        self._pending_stop: str | None = None

    def next_op(self) -> Op:
        if self._pending_stop is not None:
            f, self._pending_stop = self._pending_stop, None
            return {"f": f}
        start, stop = self.rng.choice(self.pairs)  # stop is None for a fault that repairs itself
        self._pending_stop = stop
        return {"f": start, "seed": self.rng.randrange(2**31)}

    def delay(self) -> float:
        return self.interval * self.rng.uniform(0.5, 1.5)


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
