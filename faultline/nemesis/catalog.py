"""Nemeses by the names `faultline run --nemesis` takes.

In: the kinds asked for, the db, the broker and ZooKeeper nodes, the test's
keys and (for partitions) the `Net`. Out: `({f: nemesis}, [(start f, stop
f)])` for the interpreter and the schedule, or a ValueError naming the
unknown kind and the known ones.
"""

from __future__ import annotations

from typing import Any

from .partition import PartitionNemesis
from .process import KillNemesis, PauseNemesis

KINDS = {
    "kill": "SIGKILL a random broker, then restart it",
    "kill-leader": "SIGKILL the leader of a random partition, then restart it",
    "pause": "SIGSTOP a random broker, then SIGCONT it",
    "pause-leader": "SIGSTOP the leader of a random partition, then SIGCONT it",
    "partition": "cut the network (isolate a broker, a leader or the controller; halves; bridge; "
                 "majorities ring) with iptables, then heal it",
}


def build(kinds: list[str], db, nodes: list[str], keys: list[str], zookeeper_nodes: list[str] | None = None,
          net=None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    by_f: dict[str, Any] = {}
    pairs = []
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown nemesis {kind!r}; known: {', '.join(KINDS)}")
        if kind in ("kill", "kill-leader"):
            nemesis = KillNemesis(db, nodes, keys, "leader" if kind == "kill-leader" else "random")
        elif kind in ("pause", "pause-leader"):
            nemesis = PauseNemesis(db, nodes, keys, "leader" if kind == "pause-leader" else "random")
        else:
            if net is None:
                raise ValueError("the partition nemesis needs the network of the nodes (a Net)")
            nemesis = PartitionNemesis(net, db, nodes, zookeeper_nodes or [], keys)
        clash = [f for f in nemesis.fs if f in by_f]
        if clash:
            raise ValueError(f"nemeses {', '.join(kinds)}: {kind} repeats faults another one already does; "
                             f"choose one of kill/kill-leader and one of pause/pause-leader")
        for f in nemesis.fs:
            by_f[f] = nemesis
        pairs.append(nemesis.fs)
    return by_f, pairs
