"""Partition roles, learned from ZooKeeper.

In: ZooKeeper (`zk.ZkStore`), read by a worker thread that wakes on every watch; topic creations
(CreateTopics, or a topic's first use). Out: cluster snapshots handed to the event loop, where each
partition this broker replicates becomes leader, follower (its fetcher started) or offline at the
leader epoch stored there; on the broker that holds ZooKeeper's controller node, the controller's
decisions (`controller.decide`) written to ZooKeeper first; new topics' replica assignments written
to ZooKeeper.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from kio.schema.errors import ErrorCode

from .controller import assign_replicas, decide
from .replica import FOLLOWER, LEADER, OFFLINE, FollowerProgress, Replica
from .state import BrokerError

# Every replication module logs under the one name the replica manager always used, so that
# broker logs (and whoever reads them) see the same lines as before the code was split.
log = logging.getLogger("faultline.broker.replica")


class MetadataWatch:
    """Part of `ReplicaManager`, which holds the state used here (`config`, `state`, `me`, `replicas`,
    `snapshot`, `zk`, `registration_czxid`, `controller_epoch`, `loop`, `changed`, `_wake`, `_stop`,
    `_rng`); a new role starts the leader's duties (`_advance_hw`) or the fetcher (`_follow`)."""

    # -- the ZooKeeper side (a thread) -------------------------------------------------

    def _zk_worker(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(2.0)  # a watch normally wakes it; the timeout is a safety net
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._zk_round()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper may be unreachable; retry
                log.warning("reading the cluster state from ZooKeeper failed: %s: %s", type(exc).__name__, exc)
                self._stop.wait(0.5)
                self._wake.set()

    def _zk_round(self) -> None:
        zk = self.zk
        if zk.session_lost.is_set() and zk.zk.connected:
            # A new session: the old registration and controller node died with the old one.
            zk.session_lost.clear()
            host, port = self.config.advertised
            self.registration_czxid = zk.register(self.me, host, port, self._stop)
            self.controller_epoch = None
            log.warning("ZooKeeper session expired and was renewed; registered again")
        snap = zk.snapshot()
        if snap.controller is None:
            epoch = zk.try_become_controller(self.me)
            if epoch is not None:
                self.controller_epoch = epoch
                log.info("became the controller (controller epoch %d)", epoch)
                snap = zk.snapshot()
        if snap.controller != self.me and self.controller_epoch is not None:
            log.info("no longer the controller (broker %s is)", snap.controller)
            self.controller_epoch = None
        if self.controller_epoch is not None and snap.controller == self.me:
            changes = decide(snap, self.config["unclean.leader.election.enable"], self.controller_epoch)
            wrote = False
            for ch in changes:
                version = zk.update_state(ch.topic, ch.partition, ch.state, ch.expected_version)
                if version is not None:
                    wrote = True
                    log.info("controller: %s-%d: %s (leader %d, epoch %d, isr %s)", ch.topic, ch.partition,
                             ch.reason, ch.state.leader, ch.state.leader_epoch, list(ch.state.isr))
            if wrote:
                snap = zk.snapshot()
        self.loop.call_soon_threadsafe(self._apply, snap)

    def create_topic(self, name: str, partitions: int, replication_factor: int, auto: bool = False) -> str:
        """Assign replicas over live brokers and write the topic (blocking). CreateTopics must come
        to the controller; a topic created on first use may be written by any broker, as Kafka's
        brokers did through ZooKeeper."""
        from kazoo.exceptions import NodeExistsError

        snap = self.snapshot
        if snap is None or (not auto and (snap.controller != self.me or self.controller_epoch is None)):
            raise BrokerError(ErrorCode.not_controller, f"broker {self.me} is not the controller")
        live = self.zk.live_brokers()  # fresh: the last snapshot may predate a broker's arrival
        if replication_factor > len(live):
            raise BrokerError(ErrorCode.invalid_replication_factor,
                              f"replication factor {replication_factor} is larger than the {len(live)} "
                              f"live brokers {live}")
        assignment = assign_replicas(live, partitions, replication_factor, self._rng)
        topic_id = str(uuid.uuid4())
        try:
            self.zk.create_topic(name, topic_id, assignment, snap.controller_epoch)
        except NodeExistsError:
            raise BrokerError(ErrorCode.topic_already_exists, f"topic {name!r} already exists") from None
        log.info("created topic %s: %s", name,
                 ", ".join(f"{p}:{list(r)}" for p, r in sorted(assignment.items())))
        self._wake.set()
        return topic_id

    # -- the event-loop side --------------------------------------------------------------

    def _apply(self, snap) -> None:
        if self._stop.is_set():
            return
        self.snapshot = snap
        for name, info in snap.topics.items():
            for p, replicas in info.assignment.items():
                if self.me not in replicas:
                    continue
                st = snap.states.get((name, p))
                r = self.replicas.get((name, p))
                if r is None:
                    topic_id = uuid.UUID(info.topic_id) if info.topic_id else uuid.uuid4()
                    plog = self.state.ensure_replica(name, p, topic_id)
                    plog.hw_follows_leo = False
                    r = self.replicas[(name, p)] = Replica(name, p, plog, replicas)
                r.replicas = replicas
                if st is None:
                    continue
                if st.leader == self.me and self.registration_czxid is not None and st.mzxid > self.registration_czxid:
                    if r.role != LEADER or r.leader_epoch != st.leader_epoch:
                        self._become_leader(r, st)
                    elif st.version > r.zk_version:
                        r.isr, r.zk_version = st.isr, st.version
                        self._advance_hw(r)
                elif st.leader not in (-1, self.me):
                    if r.role != FOLLOWER or r.leader != st.leader or r.leader_epoch != st.leader_epoch:
                        self._become_follower(r, st)
                    r.isr = st.isr
                elif r.role != OFFLINE or r.leader_epoch != st.leader_epoch:
                    self._become_offline(r, st)
        self.changed.notify()

    def _stop_fetcher(self, r: Replica) -> None:
        r.generation += 1
        if r.fetcher is not None:
            r.fetcher.cancel()
            r.fetcher = None

    def _become_leader(self, r: Replica, st) -> None:
        self._stop_fetcher(r)
        new_leader = r.role != LEADER
        r.role, r.leader, r.leader_epoch = LEADER, self.me, st.leader_epoch
        r.isr, r.zk_version = st.isr, st.version
        r.log.leader_epoch = st.leader_epoch
        r.log.epochs.assign(st.leader_epoch, r.log.log_end_offset)
        # As Kafka's Replica.resetReplicaState: an in-sync follower counts as caught up now, any
        # other not at all (so it does not hold the high watermark back); a new leader knows no
        # follower's log end yet, a re-elected one keeps what the fetches told it.
        now = time.monotonic()
        followers = {}
        for b in r.replicas:
            if b == self.me:
                continue
            known = r.followers.get(b) if not new_leader else None
            progress = known or FollowerProgress()
            progress.last_caught_up = now if b in st.isr else 0.0
            followers[b] = progress
        r.followers = followers
        log.info("%s: now the leader at epoch %d (isr %s, log end %d, high watermark %d)", r.name,
                 st.leader_epoch, list(st.isr), r.log.log_end_offset, r.log.high_watermark)
        self._advance_hw(r)

    def _become_follower(self, r: Replica, st) -> None:
        self._stop_fetcher(r)
        if r.role == LEADER:
            r.leader_term += 1
        r.role, r.leader, r.leader_epoch = FOLLOWER, st.leader, st.leader_epoch
        r.log.leader_epoch = st.leader_epoch
        r.followers = {}
        log.info("%s: now a follower of broker %d at epoch %d (log end %d, high watermark %d)", r.name,
                 st.leader, st.leader_epoch, r.log.log_end_offset, r.log.high_watermark)
        r.fetcher = asyncio.create_task(self._follow(r, r.generation))

    def _become_offline(self, r: Replica, st) -> None:
        self._stop_fetcher(r)
        was = r.role
        if was == LEADER:
            r.leader_term += 1
        r.role, r.leader, r.leader_epoch = OFFLINE, st.leader, st.leader_epoch
        r.followers = {}
        if was != OFFLINE:
            log.info("%s: no leader usable here (leader %d, epoch %d)", r.name, st.leader, st.leader_epoch)
