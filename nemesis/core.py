"""The nemesis interface and the schedule that drives it.

In: a seed, the chosen fault kinds and an interval. Out: a reproducible
sequence of nemesis operations (`{"f": ..., "value": ...}`), alternating a
fault and its repair, that the runner records in the history as process
"nemesis"; and `Nemesis` objects that perform them and report exactly what
they did.

A nemesis is a tiny interface, as in Jepsen: `fs` (the functions it
performs), `invoke(op) -> value` (what was done) and `heal() -> value` (undo
every fault it still holds; always safe to call).

A repair (`heal()`, and the scheduled repairs that call it) tries every node
even when one fails, and its value says per node how it went (`outcomes`:
node -> "healed", or the error naming the node); when a node's repair failed
it raises `RepairFailed` carrying that value, and the node stays on its list
for the next repair to try again. A fault's value names the kind of target it
chose (`target`: random, leader, controller, majority, all).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from ..workloads.generator import PENDING, fill

Op = dict[str, Any]
log = logging.getLogger("faultline.nemesis")

HEALED = "healed"


class RepairFailed(Exception):
    """A repair that did not succeed on every node. `value` is what it did, with each node's
    outcome under "outcomes"; the message names the nodes that failed and why."""

    def __init__(self, value: dict[str, Any]):
        self.value = value
        failed = [o for o in value.get("outcomes", {}).values() if o != HEALED]
        super().__init__("; ".join(failed) or "the repair failed")


def repair_each(nodes: Iterable[str], repair: Callable[[str], Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """`repair(node)` for every node, going on after one raises: (each node's outcome, "healed" or
    the error naming the node; what each repair that succeeded returned)."""
    outcomes: dict[str, str] = {}
    results: dict[str, Any] = {}
    for node in nodes:
        try:
            results[node] = repair(node)
            outcomes[node] = HEALED
        except Exception as exc:  # noqa: BLE001 - recorded per node; the other nodes are still repaired
            log.warning("repairing %s failed: %s: %s", node, type(exc).__name__, exc)
            outcomes[node] = f"{node}: {type(exc).__name__}: {exc}"
    return outcomes, results


def healed(outcomes: dict[str, str]) -> list[str]:
    return [node for node, outcome in outcomes.items() if outcome == HEALED]


def finish(value: dict[str, Any]) -> dict[str, Any]:
    """A repair's value, or RepairFailed carrying it when a node's repair failed."""
    if any(outcome != HEALED for outcome in value.get("outcomes", {}).values()):
        raise RepairFailed(value)
    return value


@dataclass(frozen=True)
class Heal:
    """The heal phase's generator: one `heal` operation (every nemesis undoes every fault it still
    holds), then exhausted. `error` is its completion's: None when every repair succeeded."""

    given: bool = False
    done: bool = False
    error: str | None = None

    def op(self, ctx):
        if self.given:
            return None
        op = fill({"f": "heal"}, ctx)
        return PENDING if op is None else (op, dataclasses.replace(self, given=True))

    def update(self, ctx, event):
        if event.get("f") != "heal" or event["type"] == "invoke":
            return self
        return dataclasses.replace(self, done=True, error=event.get("error"))


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
