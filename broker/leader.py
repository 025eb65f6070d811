"""What this broker does for the partitions it leads.

In: clients' requests naming a partition (and the leader epoch they know), the leader's own appends,
followers' fetches, and the passing of time. Out: the replica a request may use, or the error Kafka
answers instead; the high watermark, the smallest log end offset in the ISR; ISR shrinks (a follower
not caught up within `replica.lag.time.max.ms`) and expansions (a follower that reached the high
watermark within the current epoch), written to ZooKeeper only if the partition state there is
unchanged; the outcome of each acks=all produce.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kio.schema.errors import ErrorCode

from .replica import LEADER, FollowerProgress, Replica
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
        if r.role != LEADER:
            return
        leos = [r.log.log_end_offset]
        for b in r.isr:
            if b != self.me:
                progress = r.followers.get(b)
                leos.append(progress.leo if progress is not None else -1)
        hw = min(leos)
        r.log.hw_follows_leo = not self.replicated
        if hw > r.log.high_watermark:
            r.log.high_watermark = hw
            self.changed.notify()

    def appended(self, r: Replica) -> None:
        """A leader appended a batch: followers' long polls and the high watermark move."""
        self._advance_hw(r)
        self.changed.notify()

    def follower_fetched(self, r: Replica, follower: int, fetch_offset: int) -> None:
        """A follower's fetch at `fetch_offset` tells the leader how far its log reaches."""
        if follower not in r.replicas or follower == self.me:
            raise BrokerError(ErrorCode.not_leader_or_follower if follower != self.me else ErrorCode.invalid_request,
                              f"broker {follower} is not a replica of {r.name}")
        progress = r.followers.setdefault(follower, FollowerProgress())
        now = time.monotonic()
        leo = r.log.log_end_offset
        if fetch_offset >= leo:
            progress.last_caught_up = now
        elif fetch_offset >= progress.last_fetch_leader_leo:
            progress.last_caught_up = max(progress.last_caught_up, progress.last_fetch_time)
        progress.last_fetch_leader_leo = leo
        progress.last_fetch_time = now
        progress.leo = fetch_offset
        self._advance_hw(r)
        leaving = self.snapshot.shutting_down if self.snapshot is not None else frozenset()
        if follower not in r.isr and follower not in leaving and fetch_offset >= r.log.high_watermark:
            epoch_start = next((o for e, o in r.log.epochs.entries if e == r.leader_epoch), 0)
            if fetch_offset >= epoch_start:
                self._change_isr(r, tuple(b for b in r.replicas if b in r.isr or b == follower),
                                 f"broker {follower} caught up (log end {fetch_offset} >= high watermark "
                                 f"{r.log.high_watermark})")

    async def _isr_shrinker(self) -> None:
        lag_s = self.config["replica.lag.time.max.ms"] / 1000
        while True:
            await asyncio.sleep(min(max(lag_s / 2, 0.05), 5))
            now = time.monotonic()
            for r in list(self.replicas.values()):
                if r.role != LEADER:
                    continue
                out = [b for b in r.isr if b != self.me
                       and now - r.followers.setdefault(b, FollowerProgress()).last_caught_up > lag_s]
                if out:
                    self._change_isr(r, tuple(b for b in r.isr if b not in out),
                                     f"brokers {out} have not caught up for replica.lag.time.max.ms="
                                     f"{self.config['replica.lag.time.max.ms']}")

    def _change_isr(self, r: Replica, isr: tuple[int, ...], reason: str) -> None:
        if r.isr_update_pending or isr == r.isr or not self.replicated:
            return
        r.isr_update_pending = True
        asyncio.create_task(self._write_isr(r, isr, reason))

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
            r.isr_update_pending = False
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

    async def wait_replicated(self, r: Replica, required: int, epoch: int, deadline: float) -> ErrorCode:
        """For acks=all: wait until every ISR member has everything below `required`."""
        min_isr = r.effective_min_isr(self.config["min.insync.replicas"])
        while True:
            if r.role != LEADER or r.leader_epoch != epoch:
                return ErrorCode.not_leader_or_follower
            if r.log.high_watermark >= required:
                return ErrorCode.none if len(r.isr) >= min_isr else ErrorCode.not_enough_replicas_after_append
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ErrorCode.request_timed_out
            await self.changed.wait(min(remaining, 1.0))
