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

The work is split by what it serves: `metadata_watch` (ZooKeeper to roles, and the controller),
`leader` (the leader's duties), `follower` (truncation and the fetcher). `ReplicaManager` holds the
state they share, runs the life cycle, and is the one object the request handlers and the server see.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time

from .change_signal import Signal
from .config import BrokerConfig
from .follower import FollowerFetcher
from .leader import LeaderDuties
from .log import PartitionLog
from .metadata_watch import MetadataWatch
from .replica import LEADER, Replica
from .state import BrokerState

# Every replication module logs under the one name the replica manager always used, so that
# broker logs (and whoever reads them) see the same lines as before the code was split.
log = logging.getLogger("faultline.broker.replica")


class ReplicaManager(MetadataWatch, LeaderDuties, FollowerFetcher):
    """Every partition this broker replicates, and the state the three mixins share."""

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
        try:
            await asyncio.to_thread(self.zk.request_controlled_shutdown, self.me)
        except Exception as exc:  # noqa: BLE001 - e.g. the session expired while this broker was paused
            # Kafka too stops without the controller's help once its controlled-shutdown attempts
            # fail ("proceeding to do an unclean shutdown"): leadership moves when the session ends.
            log.warning("controlled shutdown: cannot ask the controller (%s: %s); stopping without it",
                        type(exc).__name__, exc)
            return
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

    async def _hw_checkpointer(self) -> None:
        interval = self.config["replica.high.watermark.checkpoint.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            self.state.write_hw_checkpoint()

    # -- standalone: without ZooKeeper this broker leads everything it has -------------------

    def _standalone_replica(self, topic: str, index: int, plog: PartitionLog) -> Replica:
        # As a one-broker Kafka 3.9 cluster in ZooKeeper mode: a new partition's leader starts
        # epoch 0 at offset 0 and keeps it across restarts, since the controller that starts with
        # the broker finds the partition's leader alive and elects no one
        # (PartitionStateMachine.initializePartitionState; tests/differential shows it).
        epoch = max(plog.epochs.latest_epoch, plog.leader_epoch, 0)
        plog.leader_epoch = epoch
        plog.epochs.assign(epoch, plog.log_end_offset)
        r = Replica(topic, index, plog, (self.me,), LEADER, self.me, epoch, (self.me,))
        self.replicas[(topic, index)] = r
        return r

    def added_standalone(self, topic: str) -> None:
        """A standalone broker created a topic: it leads every partition."""
        for i, plog in self.state.topics[topic].partitions.items():
            if (topic, i) not in self.replicas:
                self._standalone_replica(topic, i, plog)
