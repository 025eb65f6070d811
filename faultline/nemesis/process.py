"""Process faults: SIGKILL a node's broker and start it again.

In: the db (start/kill/wait_ready/running by node name) and the node names.
Out: `kill` kills a random node's broker and reports which and its signal;
`start` restarts every broker this nemesis killed and reports which.
"""

from __future__ import annotations

import random
from typing import Any

from .core import Op


class KillNemesis:
    fs = ("kill", "start")

    def __init__(self, db, nodes: list[str]):
        self.db = db
        self.nodes = list(nodes)
        self.killed: list[str] = []

    def invoke(self, op: Op) -> Any:
        if op["f"] == "kill":
            rng = random.Random(op.get("seed", 0))
            live = [n for n in self.nodes if n not in self.killed]
            if not live:
                return {"nodes": [], "note": "every node is already down"}
            target = rng.choice(live)
            self.db.kill(target)
            self.killed.append(target)
            return {"nodes": [target], "signal": "SIGKILL"}
        if op["f"] == "start":
            return self.heal()
        raise ValueError(f"KillNemesis cannot perform {op['f']!r}")

    def heal(self) -> Any:
        started = []
        for node in self.killed:
            if not self.db.running(node):
                self.db.start(node)
            self.db.wait_ready(node)
            started.append(node)
        self.killed = []
        return {"nodes": started}


PAIRS = {"kill": ("kill", "start")}


def build(kinds: list[str], db, nodes: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Nemeses by name -> ({f: nemesis}, [(start f, stop f)])."""
    by_f: dict[str, Any] = {}
    pairs = []
    for kind in kinds:
        if kind == "kill":
            nemesis = KillNemesis(db, nodes)
        else:
            raise ValueError(f"unknown nemesis {kind!r}; known: {', '.join(PAIRS)}")
        for f in nemesis.fs:
            by_f[f] = nemesis
        pairs.append(PAIRS[kind])
    return by_f, pairs
