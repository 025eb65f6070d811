"""One partition as this broker replicates it.

In: the partition's log and its replica assignment, then updates from the metadata watcher, the
leader's duties and the follower's fetcher. Out: `Replica`, the record those modules share (role,
leader and leader epoch, ISR and the change of it being written, ZooKeeper version of the partition
state, the leader's view of each follower, the running fetcher); `FollowerProgress`, what a leader
knows of one follower from its fetches; and the role names `LEADER`, `FOLLOWER`, `OFFLINE`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .log import PartitionLog

LEADER, FOLLOWER, OFFLINE = "leader", "follower", "offline"


@dataclass
class FollowerProgress:
    leo: int = -1  # the follower's log end offset, as its last fetch told
    last_caught_up: float = 0.0  # monotonic time; 0: never, as Kafka's lastCaughtUpTimeMs starts
    last_fetch_time: float = 0.0
    last_fetch_leader_leo: int = -1

    def caught_up(self, leader_leo: int, now: float, lag_s: float) -> bool:
        """Kafka's ReplicaState.isCaughtUp: at the leader's log end, or there within the lag."""
        return self.leo == leader_leo or now - self.last_caught_up <= lag_s


@dataclass
class Replica:
    """This broker's view of one partition it replicates."""

    topic: str
    index: int
    log: PartitionLog
    replicas: tuple[int, ...]
    role: str = OFFLINE
    leader: int = -1
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    zk_version: int = -1
    followers: dict[int, FollowerProgress] = field(default_factory=dict)
    generation: int = 0  # bumped at every role change; a fetcher of an older one stops
    fetcher: asyncio.Task | None = None
    # The ISR being written to ZooKeeper, until the write ends (Kafka's pending AlterPartition).
    pending_isr: tuple[int, ...] | None = None
    # Bumped whenever this broker stops leading the partition: an acks=all wait begun in an
    # earlier term fails, one that saw only leader-epoch bumps with this broker leading goes on.
    leader_term: int = 0

    @property
    def isr_update_pending(self) -> bool:
        return self.pending_isr is not None

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus any replica a pending change adds (KIP-497, Kafka's "maximal
        ISR"): the high watermark and acks=all count a joining replica before ZooKeeper says so."""
        if self.pending_isr is None:
            return self.isr
        return self.isr + tuple(b for b in self.pending_isr if b not in self.isr)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    def effective_min_isr(self, configured: int) -> int:
        """min.insync.replicas as Kafka applies it: capped at the replication factor (Kafka 3.9,
        Partition.scala, effectiveMinIsr), so a setting above it does not refuse every acks=all."""
        return min(configured, max(len(self.replicas), 1))
