"""What the controller decides, as pure functions of a cluster snapshot.

In: a `zk.Snapshot` (live brokers with their registration times, partition
states, brokers asking for a controlled shutdown) and the election policy.
Out: the partition states to write (each conditional on the version it was
computed from), and replica assignments for new topics. The controller
broker applies them to ZooKeeper; nothing here does I/O, so the rules can be
tested on their own.

A replica is *fresh* for a state when its broker is registered and registered
before that state was written: a broker that restarted since may have lost
unflushed data, so, as Kafka's controller treats a bounced broker as failed
and then started, it loses leadership and ISR membership and earns them back.

Rules, per partition:
- a leader that is not fresh, or that asked to shut down while another ISR
  member can take over, is replaced: first the fresh ISR members in
  assignment order (not shutting down), then any live ISR member (a bounced
  sole survivor, as Kafka re-elects it on start-up); with
  `unclean.leader.election.enable`, any live replica; otherwise the partition
  goes offline (leader -1) and keeps its ISR, so that only an in-sync replica
  can lead it again.
- an ISR member that is not fresh, or that is shutting down, leaves the ISR
  (the leader stays, and an offline partition keeps its last ISR);
- a new leader, or an ISR the controller shrinks, bumps the leader epoch (as
  Kafka 3.9's ZooKeeper controller does; a leader's own ISR changes do not).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .zk import NO_LEADER, PartitionState, Snapshot


@dataclass(frozen=True)
class Change:
    topic: str
    partition: int
    state: PartitionState
    expected_version: int
    reason: str


def is_fresh(snap: Snapshot, broker: int, state: PartitionState) -> bool:
    info = snap.brokers.get(broker)
    return info is not None and info.czxid < state.mzxid


def decide(snap: Snapshot, unclean: bool, controller_epoch: int) -> list[Change]:
    changes = []
    for (topic, p), state in sorted(snap.states.items()):
        assignment = snap.topics[topic].assignment.get(p, ())
        change = _decide_partition(snap, assignment, state, unclean)
        if change is not None:
            new, reason = change
            changes.append(Change(topic, p, replace(new, controller_epoch=controller_epoch), state.version, reason))
    return changes


def _decide_partition(snap: Snapshot, assignment: tuple[int, ...], state: PartitionState,
                      unclean: bool) -> tuple[PartitionState, str] | None:
    def fresh(b: int) -> bool:
        return is_fresh(snap, b, state)

    leaving = snap.shutting_down
    isr_kept = tuple(b for b in state.isr if fresh(b) and b not in leaving)
    leader = state.leader
    leader_ok = leader != NO_LEADER and fresh(leader) and leader in state.isr
    if leader_ok and leader in leaving:
        # Controlled shutdown: hand over only if another in-sync replica can lead.
        leader_ok = not any(b != leader for b in isr_kept)
    if leader_ok:
        isr = tuple(b for b in state.isr if b == leader or (fresh(b) and b not in leaving))
        if isr != state.isr:
            gone = sorted(set(state.isr) - set(isr))
            # A new leader epoch too, as Kafka's ZooKeeper controller (doRemoveReplicasFromIsr,
            # LeaderAndIsr.newLeaderAndIsr): followers then ask the leader again where to truncate.
            return (replace(state, isr=isr, leader_epoch=state.leader_epoch + 1),
                    f"brokers {gone} left the ISR (dead, restarted or shutting down)")
        return None
    in_isr = set(state.isr)
    candidates = [b for b in assignment if b in in_isr and fresh(b) and b not in leaving]
    candidates += [b for b in assignment if b in in_isr and b in snap.brokers and b not in candidates]
    if candidates:
        new_leader = candidates[0]
        isr = tuple(b for b in assignment if b == new_leader or b in isr_kept)
        why = "clean election from the ISR"
    elif unclean and any(b in snap.brokers for b in assignment):
        new_leader = next(b for b in assignment if b in snap.brokers)
        isr = (new_leader,)
        why = "UNCLEAN election: no in-sync replica is alive, so an out-of-sync one leads"
    else:
        if state.leader == NO_LEADER:
            return None
        return (replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1),
                f"offline: no in-sync replica of {list(state.isr)} is alive and unclean election is off")
    if new_leader == state.leader and isr == state.isr and fresh(new_leader):
        return None
    return (replace(state, leader=new_leader, leader_epoch=state.leader_epoch + 1, isr=isr),
            f"{why}: leader {state.leader} -> {new_leader}")


def assign_replicas(brokers: list[int], partitions: int, replication_factor: int,
                    rng: random.Random) -> dict[int, tuple[int, ...]]:
    """Kafka's rack-unaware assignment: partition p's preferred leader is broker
    (start + p) mod n, and its followers follow at a shift that grows every n
    partitions, so leaders and followers both spread evenly."""
    ids = sorted(brokers)
    n = len(ids)
    if replication_factor > n:
        raise ValueError(f"replication factor {replication_factor} is larger than the {n} live brokers")
    start = rng.randrange(n)
    shift0 = rng.randrange(n)
    out = {}
    for p in range(partitions):
        first = (start + p) % n
        shift = shift0 + p // n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            # Kafka's replicaIndex: skip over the first replica.
            replicas.append(ids[(first + 1 + (shift + j) % (n - 1)) % n])
        out[p] = tuple(replicas)
    return out
