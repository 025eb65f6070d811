"""Nemeses by the names `faultline run --nemesis` takes.

In: the kinds asked for, the db, the broker and ZooKeeper nodes, the test's
keys, (for partitions) the `Net` and (for kill-consumer, kill-producer) the folder of the
clients' pid files. Out: `({f: nemesis}, [(start f, stop
f)])` for the interpreter and the schedule, or a ValueError naming the
unknown kind and the known ones.
"""

from __future__ import annotations

from typing import Any

from .clients import KillClientNemesis
from .partition import PartitionNemesis
from .process import (ClockNemesis, KillNemesis, LoneLeaderNemesis, PauseNemesis, PowerLossNemesis,
                      RollingRestartNemesis, StaleElectionNemesis)

KINDS = {
    "kill": "SIGKILL a random broker, then restart it",
    "kill-leader": "SIGKILL the leader of a random partition, then restart it",
    "kill-controller": "SIGKILL the controller, then restart it",
    "kill-majority": "SIGKILL a random majority of the brokers, then restart them",
    "kill-all": "SIGKILL every broker at once, then restart them",
    "pause": "SIGSTOP a random broker, then SIGCONT it",
    "pause-leader": "SIGSTOP the leader of a random partition, then SIGCONT it",
    "rolling-restart": "stop every broker cleanly (SIGTERM) and start it again, one at a time",
    "clock": "step the wall clocks of random brokers by up to a minute either way (libfaketime), then reset "
             "them; or strobe them (flip between a skew and their usual offset every second for 5 s)",
    "power-loss": "cut the power of a random broker: kill it and drop what it wrote without fsync, then "
                  "restart it (its data directory is on a FUSE file system that keeps unsynced writes in memory)",
    "power-loss-majority": "cut the power of a random majority of the brokers at once, then restart them",
    "power-loss-all": "cut the power of every broker at once, then restart them",
    "stale-election": "SIGKILL an in-sync follower of a random partition until it leaves the ISR; then SIGKILL "
                      "the replicas still in sync and start the stale one first (only unclean leader election "
                      "can make it leader), then the rest",
    "lone-leader": "SIGKILL every in-sync follower of a random partition at once, until the ISR is its leader "
                   "alone; then SIGKILL the leader and start a follower first (only unclean leader election can "
                   "make it leader), then the rest",
    "kill-consumer": "SIGKILL a consumer group member's process (consume-* workloads), as an application's, one "
                     "that holds partitions when any does; its worker starts a new member in the same group at its "
                     "next operation",
    "kill-producer": "SIGKILL a producer's process (the resend workload), as an application's, mid-send or between "
                     "sends; its worker starts a new producer session at its next operation",
    "partition": "cut the network (isolate a broker, a leader or the controller; halves; bridge; "
                 "majorities ring) with iptables, then heal it",
}


def build(kinds: list[str], db, nodes: list[str], keys: list[str], zookeeper_nodes: list[str] | None = None,
          net=None, clients_dir=None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    by_f: dict[str, Any] = {}
    pairs = []
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown nemesis {kind!r}; known: {', '.join(KINDS)}")
        if kind in ("kill-consumer", "kill-producer"):
            nemesis = KillClientNemesis(kind.partition("-")[2], clients_dir)
        elif kind == "kill" or kind.startswith("kill-"):
            nemesis = KillNemesis(db, nodes, keys, kind.partition("-")[2] or "random")
        elif kind in ("pause", "pause-leader"):
            nemesis = PauseNemesis(db, nodes, keys, "leader" if kind == "pause-leader" else "random")
        elif kind == "rolling-restart":
            nemesis = RollingRestartNemesis(db, nodes)
        elif kind.startswith("power-loss"):
            nemesis = PowerLossNemesis(db, nodes, kind.rpartition("-")[2] if kind != "power-loss" else "random")
        elif kind == "clock":
            nemesis = ClockNemesis(db, nodes)
        elif kind == "stale-election":
            nemesis = StaleElectionNemesis(db, nodes, keys)
        elif kind == "lone-leader":
            nemesis = LoneLeaderNemesis(db, nodes, keys)
        else:
            if net is None:
                raise ValueError("the partition nemesis needs the network of the nodes (a Net)")
            nemesis = PartitionNemesis(net, db, nodes, zookeeper_nodes or [], keys)
        clash = [f for f in nemesis.fs if f in by_f]
        if clash:
            raise ValueError(f"nemeses {', '.join(kinds)}: {kind} repeats faults another one already does; "
                             f"choose at most one kind each of kill-*, pause-* and power-loss-*")
        for f in nemesis.fs:
            by_f[f] = nemesis
        pairs.extend(getattr(nemesis, "pairs", None) or [(nemesis.fs[0], nemesis.fs[1] if len(nemesis.fs) > 1 else None)])
    return by_f, pairs
