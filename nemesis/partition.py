"""Network partitions: cut links between nodes, then heal them.

In: the `Net` (iptables inside each node), the db (`leader(topic, partition)`,
`controller()`), the broker nodes, the ZooKeeper nodes and the test's keys.
Out: `start-partition` applies a grudge of a shape chosen by the op's seed and
reports the shape, its target and the grudge exactly as applied;
`stop-partition` (and `heal`) removes every rule it added and reports, per
node, whether that worked (a node that failed does not stop the others).

Shapes: isolate a random broker, the leader of a random key, or the
controller (from every other node, ZooKeeper included); random halves and a
bridge over all nodes (ZooKeeper nodes can land on either side); a
majorities ring when there are 5 or more nodes.
"""

from __future__ import annotations

import random
from typing import Any

from . import grudges
from .core import HEALED, Op, finish, healed, leader_of_random_key


class PartitionNemesis:
    fs = ("start-partition", "stop-partition")

    def __init__(self, net, db, nodes: list[str], zookeeper_nodes: list[str], keys: list[str]):
        self.net = net
        self.db = db
        self.nodes = list(nodes)
        self.everyone = list(nodes) + list(zookeeper_nodes)
        self.keys = list(keys)
        self.active = False

    def shapes(self) -> list[str]:
        shapes = ["isolate-random", "isolate-leader", "isolate-controller", "halves"]
        if len(self.everyone) >= 3:
            shapes.append("bridge")
        if len(self.everyone) >= 5:
            shapes.append("majorities-ring")
        return shapes

    def invoke(self, op: Op) -> Any:
        if op["f"] == "stop-partition":
            return self.heal()
        if op["f"] != "start-partition":
            raise ValueError(f"PartitionNemesis cannot perform {op['f']!r}")
        rng = random.Random(op.get("seed", 0))
        shape = rng.choice(self.shapes())
        detail: dict[str, Any] = {"shape": shape}
        if shape.startswith("isolate"):
            if shape == "isolate-leader":
                key, target = leader_of_random_key(self.db, self.keys, rng)
                detail["leader_of"] = key
            elif shape == "isolate-controller":
                target = self.db.controller()
            else:
                target = rng.choice(self.nodes)
            if target is None:
                return {**detail, "grudge": {}, "note": "no such node right now; nothing cut"}
            detail["node"] = target
            grudge = grudges.isolate(self.everyone, target)
        elif shape == "halves":
            grudge = grudges.halves(self.everyone, rng)
        elif shape == "bridge":
            grudge = grudges.bridge(self.everyone, rng)
        else:
            grudge = grudges.majorities_ring(self.everyone, rng)
        applied = self.net.drop(grudge)
        self.active = True
        return {**detail, "grudge": applied}

    def heal(self) -> Any:
        outcomes = self.net.heal()
        self.active = any(outcome != HEALED for outcome in outcomes.values())
        return finish({"healed": healed(outcomes), "outcomes": outcomes})
