"""What this broker does for the partitions it leads.

In: clients' requests naming a partition (and the leader epoch they know), the leader's own appends,
followers' fetches, and the passing of time. Out: the replica a request may use, or the error Kafka
answers instead; the high watermark (Kafka 3.9's rule: the smallest log end offset among the
leader, the ISR with any replica joining it (KIP-497's maximal ISR) and the followers caught up
enough to join, and none while the ISR is below min.insync.replicas); ISR shrinks (a follower
neither at the leader's log end nor caught up within `replica.lag.time.max.ms`, checked every half
of it) and expansions (a follower that reached the high watermark within the current epoch),
written to ZooKeeper only if the partition state there is unchanged; the outcome of each acks=all
produce.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kio.schema.errors import ErrorCode

from .replica import FOLLOWER, LEADER, FollowerProgress, Replica
from .state import BrokerError

# Every replication module logs under the one name the replica manager always used, so that
# broker logs (and whoever reads them) see the same lines as before the code was split.
log = logging.getLogger("faultline.broker.replica")


class LeaderDuties:
    """Part of `ReplicaManager`, which holds the state used here (`config`, `me`, `replicas`,
    `replicated`, `snapshot`, `zk`, `changed`, `_wake`)."""

    def leader_replica(self, topic: str, index: int, client_epoch: int = -1) -> Replica:
        """The replica of a partition this broker leads, or the error Kafka answers."""
        r = self.replicas.get((topic, index))
        if r is None:
            if self.replicated and self.snapshot is not None and topic in self.snapshot.topics \
                    and index in self.snapshot.topics[topic].assignment:
                raise BrokerError(ErrorCode.not_leader_or_follower, f"{topic}-{index} is not replicated here")
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"{topic}-{index} does not exist")
        self.check_epoch(r, client_epoch)
        if r.role != LEADER:
            raise BrokerError(ErrorCode.not_leader_or_follower,
                              f"broker {self.me} does not lead {r.name} (leader {r.leader})")
        return r

    def readable_replica(self, topic: str, index: int, client_epoch: int = -1) -> Replica:
        """The replica of a partition a consumer may read here: the leader's, or a follower's
        (Kafka 3.9 serves fetch v11+ from followers, KIP-392); else the error Kafka answers."""
        r = self.replicas.get((topic, index))
        if r is not None and r.role == FOLLOWER:
            self.check_epoch(r, client_epoch)
            return r
        return self.leader_replica(topic, index, client_epoch)

    def check_epoch(self, r: Replica, client_epoch: int) -> None:
        if client_epoch < 0 or r.leader_epoch < 0:
            return
        if client_epoch < r.leader_epoch:
            raise BrokerError(ErrorCode.fenced_leader_epoch,
                              f"{r.name}: leader epoch {client_epoch} is older than {r.leader_epoch}")
        if client_epoch > r.leader_epoch:
            raise BrokerError(ErrorCode.unknown_leader_epoch,
                              f"{r.name}: leader epoch {client_epoch} is newer than {r.leader_epoch} known here")

    def _advance_hw(self, r: Replica) -> None:
        """Kafka 3.9's Partition.maybeIncrementLeaderHW: the smallest log end offset among the
        leader, the maximal ISR and the followers caught up enough to join it (so that a lagging
        follower outside the ISR can reach the high watermark and rejoin); not at all while the
        committed ISR is smaller than min.insync.replicas (KAFKA-15583, Kafka 3.7), unless
        `faultline.high.watermark.below.min.isr` brings back the older rule."""
        if r.role != LEADER:
            return
        r.log.hw_follows_leo = not self.replicated
        if not self.replicated:
            r.log.high_watermark = r.log.log_end_offset
            return
        if len(r.isr) < r.effective_min_isr(self.config["min.insync.replicas"]) \
                and not self.config["faultline.high.watermark.below.min.isr"]:
            return
        leo = r.log.log_end_offset
        hw = leo
        maximal = r.maximal_isr
        now = time.monotonic()
        lag_s = self.config["replica.lag.time.max.ms"] / 1000
        for b, progress in r.followers.items():
            if progress.leo < hw and (b in maximal or (progress.caught_up(leo, now, lag_s)
                                                       and self._isr_eligible(b))):
                hw = progress.leo
        if hw > r.log.high_watermark:
            r.log.high_watermark = hw
            self.changed.notify()

    def _isr_eligible(self, broker: int) -> bool:
        """Kafka's isReplicaIsrEligible under ZooKeeper: the broker is alive (registered); the
        controller keeps one that is shutting down out."""
        snap = self.snapshot
        return snap is None or (broker in snap.brokers and broker not in snap.shutting_down)

    def appended(self, r: Replica) -> None:
        """A leader appended a batch: followers' long polls and the high watermark move."""
        self._advance_hw(r)
        self.changed.notify()

    def check_follower(self, r: Replica, follower: int, current_epoch: int) -> None:
        """Refuse a fetch from a broker that is not a replica of the partition, as Kafka's
        followerReplicaOrThrow: UNKNOWN_LEADER_EPOCH when the fetch names an epoch (the replica set
        may be newer than this leader knows), NOT_LEADER_OR_FOLLOWER otherwise."""
        if follower == self.me:
            raise BrokerError(ErrorCode.invalid_request, f"broker {follower} fetched {r.name} from itself")
        if follower not in r.replicas:
            raise BrokerError(ErrorCode.unknown_leader_epoch if current_epoch >= 0
                              else ErrorCode.not_leader_or_follower,
                              f"broker {follower} is not a replica of {r.name} (replicas {list(r.replicas)})")

    def follower_fetched(self, r: Replica, follower: int, fetch_offset: int) -> None:
        """A follower's fetch at `fetch_offset`, already answered from the log, tells the leader
        how far its log reaches (Kafka's updateFollowerFetchState, after the read)."""
        progress = r.followers.setdefault(follower, FollowerProgress())
        now = time.monotonic()
        leo = r.log.log_end_offset
        if fetch_offset >= leo:
            progress.last_caught_up = max(progress.last_caught_up, now)
        elif fetch_offset >= progress.last_fetch_leader_leo:
            progress.last_caught_up = max(progress.last_caught_up, progress.last_fetch_time)
        progress.last_fetch_leader_leo = leo
        progress.last_fetch_time = now
        progress.leo = fetch_offset
        if follower not in r.isr and not r.isr_update_pending and self._isr_eligible(follower) \
                and fetch_offset >= r.log.high_watermark:
            if fetch_offset >= (r.log.epochs.start_of(r.leader_epoch) or 0):
                self._change_isr(r, tuple(b for b in r.replicas if b in r.isr or b == follower),
                                 f"broker {follower} caught up (log end {fetch_offset} >= high watermark "
                                 f"{r.log.high_watermark})")
        self._advance_hw(r)

    async def _isr_shrinker(self) -> None:
        # Kafka's isr-expiration task runs every replica.lag.time.max.ms / 2.
        lag_s = self.config["replica.lag.time.max.ms"] / 1000
        while True:
            await asyncio.sleep(max(lag_s / 2, 0.01))
            now = time.monotonic()
            for r in list(self.replicas.values()):
                if r.role != LEADER or r.isr_update_pending:
                    continue
                leo = r.log.log_end_offset
                out = [b for b in r.isr if b != self.me
                       and not r.followers.setdefault(b, FollowerProgress()).caught_up(leo, now, lag_s)]
                if out:
                    self._change_isr(r, tuple(b for b in r.isr if b not in out),
                                     f"brokers {out} have not caught up for replica.lag.time.max.ms="
                                     f"{self.config['replica.lag.time.max.ms']}")

    def _change_isr(self, r: Replica, isr: tuple[int, ...], reason: str) -> None:
        if r.isr_update_pending or isr == r.isr or not self.replicated:
            return
        r.pending_isr = isr
        asyncio.create_task(self._write_isr(r, isr, reason))
        self._advance_hw(r)

    async def _write_isr(self, r: Replica, isr: tuple[int, ...], reason: str) -> None:
        from .zk import PartitionState

        epoch, version = r.leader_epoch, r.zk_version
        cepoch = self.snapshot.controller_epoch if self.snapshot else 0
        try:
            new_version = await asyncio.to_thread(
                self.zk.update_state, r.topic, r.index, PartitionState(self.me, epoch, isr, cepoch), version)
        except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: the ISR stays as it is
            log.warning("%s: cannot write the ISR to ZooKeeper: %s", r.name, exc)
            new_version = None
        finally:
            r.pending_isr = None
        if new_version is None:
            log.info("%s: ISR change to %s not written: the partition state changed in ZooKeeper",
                     r.name, list(isr))
            self._wake.set()
            return
        if r.role == LEADER and r.leader_epoch == epoch:
            old = r.isr
            r.isr, r.zk_version = isr, new_version
            verb = "shrank" if len(isr) < len(old) else "expanded"
            log.info("%s: ISR %s from %s to %s: %s", r.name, verb, list(old), list(isr), reason)
            self._advance_hw(r)
            self.changed.notify()

    async def wait_replicated(self, r: Replica, required: int, term: int, deadline: float) -> ErrorCode:
        """For acks=all, as Kafka's checkEnoughReplicasReachOffset: once the high watermark passes
        `required`, NONE if the maximal ISR still has min.insync.replicas members, else
        NOT_ENOUGH_REPLICAS_AFTER_APPEND; NOT_LEADER_OR_FOLLOWER once this broker stopped leading
        since the append (a new leader epoch with this broker leading changes nothing);
        REQUEST_TIMED_OUT at the deadline (as when the ISR shrank below the minimum and the high
        watermark stopped)."""
        min_isr = r.effective_min_isr(self.config["min.insync.replicas"])
        while True:
            if r.role != LEADER or r.leader_term != term:
                return ErrorCode.not_leader_or_follower
            if r.log.high_watermark >= required:
                return ErrorCode.none if len(r.maximal_isr) >= min_isr else ErrorCode.not_enough_replicas_after_append
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ErrorCode.request_timed_out
            await self.changed.wait(min(remaining, 1.0))
