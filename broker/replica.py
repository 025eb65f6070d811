"""Each partition's replication role on this broker: leader, follower or neither.

In: the broker's `BrokerState` (its logs) and, in a replicated cluster, the
cluster metadata from ZooKeeper (`zk.ZkStore`), read by a worker thread that
wakes on every watch and hands snapshots to the event loop. Out: for every
partition, who leads it at which leader epoch, the in-sync replica set (ISR)
and the high watermark, kept as Kafka documents them:

- the leader takes produce and fetch requests; others answer
  NOT_LEADER_OR_FOLLOWER so that clients refresh their metadata;
- followers fetch from the leader (`replica_id` set), append the leader's
  batches unchanged, and learn the high watermark from its responses;
- the leader's high watermark is the smallest log end offset in the ISR;
  consumers read only below it;
- a follower that has not caught up within `replica.lag.time.max.ms` leaves
  the ISR, and rejoins once it reaches the high watermark; both changes are
  written to ZooKeeper only if the partition state is unchanged there (same
  znode version, so same leader epoch);
- `acks=all` completes once the high watermark passes the batch; with an ISR
  smaller than `min.insync.replicas` then, NOT_ENOUGH_REPLICAS_AFTER_APPEND;
- a replica that becomes a follower first truncates its log: by leader epoch
  (OffsetForLeaderEpoch, KIP-101) or to its own high watermark
  (`faultline.truncation=high-watermark`, the older behaviour);
- the broker that holds ZooKeeper's controller node also runs the
  controller's rules (`controller.decide`) on every snapshot.

Without `zookeeper.connect` the broker is standalone: it leads every
partition it has, with an ISR of itself.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchRequest
from kio.schema.list_offsets.v7.request import ListOffsetsRequest
from kio.schema.offset_for_leader_epoch.v4.request import OffsetForLeaderEpochRequest

from .config import BrokerConfig
from .controller import assign_replicas, decide
from .log import PartitionLog
from .peer import PeerConnection, PeerError
from .records import iter_headers
from .state import BrokerError, BrokerState

log = logging.getLogger("faultline.broker.replica")

LEADER, FOLLOWER, OFFLINE = "leader", "follower", "offline"


class Signal:
    """Wakes every waiter (long-polling fetches, acks=all produces) on any change."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future] = set()

    def notify(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def wait(self, timeout: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            # asyncio.wait, not wait_for: Python 3.11's wait_for can swallow a cancellation that
            # races with the future's completion, and a shutdown must be able to cancel every waiter.
            await asyncio.wait([fut], timeout=max(timeout, 0))
        finally:
            self._waiters.discard(fut)


@dataclass
class FollowerProgress:
    leo: int = -1  # the follower's log end offset, as its last fetch told
    last_caught_up: float = field(default_factory=time.monotonic)
    last_fetch_time: float = 0.0
    last_fetch_leader_leo: int = -1


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
    isr_update_pending: bool = False

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"


class ReplicaManager:
    def __init__(self, config: BrokerConfig, state: BrokerState):
        self.config = config
        self.state = state
        self.me = config.node_id
        self.changed = Signal()
        self.replicas: dict[tuple[str, int], Replica] = {}
        self.replicated = config["zookeeper.connect"] is not None
        self.snapshot = None
        self.zk = None
        self.registration_czxid: int | None = None
        self.controller_epoch: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random()
        if not self.replicated:
            for t in state.topics.values():
                for i, plog in t.partitions.items():
                    self._standalone_replica(t.name, i, plog)

    # -- life cycle ---------------------------------------------------------------

    async def connect(self) -> None:
        """Connect to ZooKeeper and take the cluster's id, before the broker answers anyone: a
        Metadata answer with this broker's own proposal would name another cluster (Kafka, too,
        reads the id before it opens its socket server)."""
        if not self.replicated or self.zk is not None:
            return
        from .zk import ZkStore

        self.zk = ZkStore(self.config["zookeeper.connect"], self.config["zookeeper.session.timeout.ms"],
                          self._wake.set)
        await asyncio.to_thread(self.zk.start, max(10.0, self.config["zookeeper.session.timeout.ms"] / 1000))
        self.state.adopt_cluster_id(await asyncio.to_thread(self.zk.cluster_id, self.state.cluster_id))

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if not self.replicated:
            return
        hws = self.state.read_hw_checkpoint()
        for t in self.state.topics.values():
            for i, plog in t.partitions.items():
                plog.hw_follows_leo = False
                plog.high_watermark = min(hws.get((t.name, i), 0), plog.log_end_offset)
        await self.connect()
        host, port = self.config.advertised
        self.registration_czxid = await asyncio.to_thread(self.zk.register, self.me, host, port, self._stop)
        self._thread = threading.Thread(target=self._zk_worker, name="zookeeper", daemon=True)
        self._thread.start()
        self._tasks.append(asyncio.create_task(self._isr_shrinker()))
        self._tasks.append(asyncio.create_task(self._hw_checkpointer()))
        # Serve only once the cluster's state is known, so no request sees an empty cluster.
        deadline = time.monotonic() + 30
        while self.snapshot is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def controlled_shutdown(self) -> None:
        """Ask the controller to move leadership away, and wait until it has (or give up)."""
        if not self.replicated or not self.config["controlled.shutdown.enable"]:
            return
        await asyncio.to_thread(self.zk.request_controlled_shutdown, self.me)
        self._wake.set()
        attempts = self.config["controlled.shutdown.max.retries"] + 1
        wait_s = self.config["controlled.shutdown.retry.backoff.ms"] / 1000
        deadline = time.monotonic() + attempts * wait_s
        while time.monotonic() < deadline:
            movable = [r.name for r in self.replicas.values()
                       if r.role == LEADER and any(b != self.me for b in r.isr)]
            if not movable:
                log.info("controlled shutdown: this broker leads no partition that another replica could lead")
                return
            await self.changed.wait(0.2)
        log.warning("controlled shutdown: still leading %s after %.0f s; stopping anyway",
                    movable, attempts * wait_s)

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for r in self.replicas.values():
            r.generation += 1
            if r.fetcher is not None:
                r.fetcher.cancel()
        for task in self._tasks:
            task.cancel()
        tasks = self._tasks + [r.fetcher for r in self.replicas.values() if r.fetcher is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._thread is not None:
            deadline = time.monotonic() + 5
            while self._thread.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if self.zk is not None:
            # A thread of its own: the shared executor may be full of calls waiting on ZooKeeper.
            closer = threading.Thread(target=self.zk.close, name="zookeeper-close", daemon=True)
            closer.start()
            while closer.is_alive():
                await asyncio.sleep(0.05)

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

    def _standalone_replica(self, topic: str, index: int, plog: PartitionLog) -> Replica:
        r = Replica(topic, index, plog, (self.me,), LEADER, self.me, plog.leader_epoch, (self.me,))
        self.replicas[(topic, index)] = r
        return r

    def added_standalone(self, topic: str) -> None:
        """A standalone broker created a topic: it leads every partition."""
        for i, plog in self.state.topics[topic].partitions.items():
            if (topic, i) not in self.replicas:
                self._standalone_replica(topic, i, plog)

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
        r.role, r.leader, r.leader_epoch = LEADER, self.me, st.leader_epoch
        r.isr, r.zk_version = st.isr, st.version
        r.log.leader_epoch = st.leader_epoch
        r.log.epochs.assign(st.leader_epoch, r.log.log_end_offset)
        now = time.monotonic()
        r.followers = {b: FollowerProgress(last_caught_up=now) for b in r.replicas if b != self.me}
        log.info("%s: now the leader at epoch %d (isr %s, log end %d, high watermark %d)", r.name,
                 st.leader_epoch, list(st.isr), r.log.log_end_offset, r.log.high_watermark)
        self._advance_hw(r)

    def _become_follower(self, r: Replica, st) -> None:
        self._stop_fetcher(r)
        r.role, r.leader, r.leader_epoch = FOLLOWER, st.leader, st.leader_epoch
        r.log.leader_epoch = st.leader_epoch
        r.followers = {}
        log.info("%s: now a follower of broker %d at epoch %d (log end %d, high watermark %d)", r.name,
                 st.leader, st.leader_epoch, r.log.log_end_offset, r.log.high_watermark)
        r.fetcher = asyncio.create_task(self._follow(r, r.generation))

    def _become_offline(self, r: Replica, st) -> None:
        self._stop_fetcher(r)
        was = r.role
        r.role, r.leader, r.leader_epoch = OFFLINE, st.leader, st.leader_epoch
        r.followers = {}
        if was != OFFLINE:
            log.info("%s: no leader usable here (leader %d, epoch %d)", r.name, st.leader, st.leader_epoch)

    # -- leader duties -----------------------------------------------------------------

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
        min_isr = self.config["min.insync.replicas"]
        while True:
            if r.role != LEADER or r.leader_epoch != epoch:
                return ErrorCode.not_leader_or_follower
            if r.log.high_watermark >= required:
                return ErrorCode.none if len(r.isr) >= min_isr else ErrorCode.not_enough_replicas_after_append
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ErrorCode.request_timed_out
            await self.changed.wait(min(remaining, 1.0))

    async def _hw_checkpointer(self) -> None:
        interval = self.config["replica.high.watermark.checkpoint.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            self.state.write_hw_checkpoint()

    # -- follower duties ---------------------------------------------------------------

    def _peer(self, broker: int) -> PeerConnection | None:
        info = self.snapshot.brokers.get(broker) if self.snapshot else None
        if info is None:
            return None
        return PeerConnection(info.host, info.port, f"broker-{self.me}-replica-fetcher")

    async def _follow(self, r: Replica, generation: int) -> None:
        backoff = self.config["replica.fetch.backoff.ms"] / 1000
        conn: PeerConnection | None = None
        truncated = False
        try:
            while r.generation == generation:
                if conn is None:
                    conn = self._peer(r.leader)
                    if conn is None:
                        await asyncio.sleep(backoff)
                        continue
                try:
                    if not truncated:
                        await self._truncate(r, conn)
                        truncated = True
                    await self._fetch_once(r, conn, generation)
                except PeerError as exc:
                    log.info("%s: fetching from broker %d failed: %s", r.name, r.leader, exc)
                    conn.close()
                    conn = None
                    await asyncio.sleep(backoff)
                except BrokerError as exc:
                    # The leader does not (yet) agree it leads this epoch: wait for the metadata to settle.
                    log.info("%s: broker %d refused the fetch: %s: %s", r.name, r.leader, exc.code.name, exc)
                    await asyncio.sleep(min(backoff, 0.2))
                except Exception:  # noqa: BLE001 - a fetcher must not die silently
                    log.exception("%s: the replica fetcher failed; retrying", r.name)
                    if conn is not None:
                        conn.close()
                        conn = None
                    await asyncio.sleep(backoff)
        finally:
            if conn is not None:
                conn.close()

    async def _truncate(self, r: Replica, conn: PeerConnection) -> None:
        plog = r.log
        before = plog.log_end_offset
        if self.config["faultline.truncation"] == "high-watermark":
            target, how = plog.high_watermark, f"to its high watermark {plog.high_watermark}"
        else:
            asked = plog.epochs.latest_epoch
            if asked < 0:
                return
            resp = await conn.request(OffsetForLeaderEpochRequest, {
                "replica_id": self.me,
                "topics": [{"topic": r.topic, "partitions": [
                    {"partition": r.index, "current_leader_epoch": r.leader_epoch, "leader_epoch": asked}]}],
            }, timeout=10)
            answer = resp.topics[0].partitions[0]
            if answer.error_code != ErrorCode.none:
                raise BrokerError(answer.error_code, f"OffsetForLeaderEpoch for epoch {asked}")
            if answer.end_offset < 0:
                # The leader knows no epoch this old: Kafka falls back to the high watermark.
                target, how = plog.high_watermark, f"to its high watermark {plog.high_watermark} (leader knows no epoch <= {asked})"
            elif answer.leader_epoch == asked:
                target, how = answer.end_offset, f"by leader epoch: epoch {asked} ends at {answer.end_offset} on the leader"
            else:
                own_end = plog.epochs.end_offset_for(answer.leader_epoch, plog.log_end_offset)[1]
                target = min(answer.end_offset, own_end)
                how = (f"by leader epoch: the leader's last epoch <= {asked} is {answer.leader_epoch}, "
                       f"ending at {answer.end_offset}; here it ends at {own_end}")
        if target < before:
            plog.truncate_to(target)
            log.warning("%s: truncated from %d to %d %s", r.name, before, plog.log_end_offset, how)
        else:
            log.info("%s: no truncation needed (log end %d; %s)", r.name, before, how)

    async def _fetch_once(self, r: Replica, conn: PeerConnection, generation: int) -> None:
        plog = r.log
        wait_ms = self.config["replica.fetch.wait.max.ms"]
        resp = await conn.request(FetchRequest, {
            "replica_id": self.me, "max_wait": wait_ms, "min_bytes": self.config["replica.fetch.min.bytes"],
            "max_bytes": self.config["replica.fetch.max.bytes"], "isolation_level": 0,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": r.topic, "partitions": [{
                "partition": r.index, "current_leader_epoch": r.leader_epoch,
                "fetch_offset": plog.log_end_offset, "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": self.config["replica.fetch.max.bytes"]}]}],
            "forgotten_topics_data": [], "rack_id": "",
        }, timeout=wait_ms / 1000 + 10)
        if r.generation != generation:
            return
        if resp.error_code != ErrorCode.none:
            raise BrokerError(resp.error_code, "fetch refused")
        part = resp.responses[0].partitions[0]
        if part.error_code == ErrorCode.offset_out_of_range:
            await self._handle_out_of_range(r, conn)
            return
        if part.error_code != ErrorCode.none:
            raise BrokerError(part.error_code, "partition fetch refused")
        data = part.records or b""
        end = 0
        for pos, header in iter_headers(data):
            if header.base_offset != plog.log_end_offset:
                # Batch boundaries differ from the leader's: the logs have diverged (what truncating
                # to the high watermark can do). As Kafka's fetcher marks such a partition failed,
                # this replica stops fetching it rather than append out of order.
                log.error("%s: DIVERGED: the leader's batch covers offsets %d..%d, but this replica's log ends "
                          "at %d; it stops fetching this partition", r.name, header.base_offset,
                          header.last_offset, plog.log_end_offset)
                r.generation += 1
                break
            plog.append(data[pos:pos + header.size], header)
            plog.epochs.assign(header.leader_epoch, header.base_offset)
            end = pos + header.size
        plog.high_watermark = min(part.high_watermark, plog.log_end_offset)
        if end:
            self.changed.notify()

    async def _handle_out_of_range(self, r: Replica, conn: PeerConnection) -> None:
        """The leader's log ends below this replica's: cut back to the leader's end (as Kafka does)."""
        resp = await conn.request(ListOffsetsRequest, {
            "replica_id": self.me, "isolation_level": 0,
            "topics": [{"name": r.topic, "partitions": [
                {"partition_index": r.index, "current_leader_epoch": r.leader_epoch, "timestamp": -1}]}],
        }, timeout=10)
        answer = resp.topics[0].partitions[0]
        if answer.error_code != ErrorCode.none:
            raise BrokerError(answer.error_code, "ListOffsets for the leader's log end")
        before = r.log.log_end_offset
        if answer.offset < before:
            r.log.truncate_to(answer.offset)
            log.warning("%s: the leader's log ends at %d, below ours at %d: truncated to %d", r.name,
                        answer.offset, before, r.log.log_end_offset)
