"""Cluster metadata in ZooKeeper, laid out as Kafka laid it out before KRaft.

In: `zookeeper.connect` (with an optional chroot) and this broker's id and
address. Out: a `ZkStore` that registers the broker, competes for the
controller node, reads a consistent-enough `Snapshot` of the cluster (setting
one-shot watches on everything it reads, so any change wakes the reader),
creates topics and updates partition states only if their znode version is
unchanged.

    /brokers/ids/<id>                           ephemeral {"host", "port", "endpoints", ...}
    /controller                                 ephemeral {"version":1, "brokerid":N, "timestamp"}
    /controller_epoch                           the controller generation, an integer
    /brokers/topics/<topic>                     {"version":2, "partitions":{"0":[1,2,3]}, "topic_id"}
    /brokers/topics/<topic>/partitions/<p>/state
                                                {"controller_epoch", "leader", "leader_epoch", "isr", "version":1}
    /controlled_shutdown/<id>                   ephemeral: broker <id> asks the controller to move
                                                its leadership away (Kafka sends an RPC instead)

Every method blocks (kazoo is synchronous); the broker calls them from
threads, never from its event loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

log = logging.getLogger("faultline.broker.zk")

BROKERS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
SHUTDOWN = "/controlled_shutdown"
NO_LEADER = -1


@dataclass(frozen=True)
class BrokerInfo:
    id: int
    host: str
    port: int
    czxid: int  # the registration's creation: a restarted broker has a newer one


@dataclass(frozen=True)
class PartitionState:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    version: int = -1  # the znode's version, for conditional updates
    mzxid: int = 0  # when the state was last written

    def to_json(self) -> bytes:
        return json.dumps({"controller_epoch": self.controller_epoch, "leader": self.leader, "version": 1,
                           "leader_epoch": self.leader_epoch, "isr": list(self.isr)}).encode()

    @classmethod
    def parse(cls, data: bytes, version: int, mzxid: int) -> "PartitionState":
        d = json.loads(data)
        return cls(int(d["leader"]), int(d["leader_epoch"]), tuple(int(b) for b in d["isr"]),
                   int(d.get("controller_epoch", 0)), version, mzxid)


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: str | None
    assignment: dict[int, tuple[int, ...]]


@dataclass
class Snapshot:
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    controller: int | None = None
    controller_epoch: int = 0
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    states: dict[tuple[str, int], PartitionState] = field(default_factory=dict)
    shutting_down: frozenset[int] = frozenset()


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


class ZkStore:
    def __init__(self, connect: str, session_timeout_ms: int, on_change: Callable[[], None]):
        self.connect = connect
        self.on_change = on_change
        self.zk = KazooClient(hosts=connect, timeout=session_timeout_ms / 1000)
        self.zk.add_listener(self._state_listener)
        self.session_lost = threading.Event()

    # -- session -------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        try:
            with warnings.catch_warnings():
                # kazoo warns that the chroot does not exist yet; it is created below, as Kafka does.
                warnings.simplefilter("ignore")
                self.zk.start(timeout=timeout)
        except Exception as exc:  # kazoo raises a bare timeout
            raise RuntimeError(
                f"cannot reach ZooKeeper at zookeeper.connect={self.connect} within {timeout:.0f} s "
                f"({type(exc).__name__}): is it running, and is the address right?"
            ) from None
        chroot = self.zk.chroot
        if chroot:
            # Kafka creates its chroot path on first use; kazoo needs it to exist.
            self.zk.chroot = ""
            self.zk.ensure_path(chroot)
            self.zk.chroot = chroot
        for path in (BROKERS, TOPICS, SHUTDOWN):
            self.zk.ensure_path(path)

    def cluster_id(self, proposal: str) -> str:
        """The id in /cluster/id, created from `proposal` by the first broker."""
        try:
            self.zk.create("/cluster/id", json.dumps({"version": "1", "id": proposal}).encode(), makepath=True)
        except NodeExistsError:
            pass
        raw, _ = self.zk.get("/cluster/id")
        return json.loads(raw)["id"]

    def _state_listener(self, state: str) -> None:
        if state == KazooState.LOST:
            self.session_lost.set()
        # Any session change may have cost registrations or watches: look again.
        self.on_change()

    def close(self) -> None:
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass

    @property
    def session_id(self) -> int | None:
        sid = self.zk.client_id
        return sid[0] if sid else None

    def _watch(self, *_args) -> None:
        self.on_change()

    # -- registration and the controller ------------------------------------------------

    def register(self, broker_id: int, host: str, port: int, stop: threading.Event) -> int:
        """Create /brokers/ids/<id>; wait while a previous session of this broker still holds it.
        Returns the registration's czxid."""
        path = f"{BROKERS}/{broker_id}"
        data = json.dumps({"version": 5, "host": host, "port": port, "jmx_port": -1,
                           "endpoints": [f"PLAINTEXT://{host}:{port}"],
                           "timestamp": str(int(time.time() * 1000))}).encode()
        warned = False
        while not stop.is_set():
            try:
                self.zk.create(path, data, ephemeral=True)
                stat = self.zk.exists(path)
                log.info("registered as broker %d in ZooKeeper (czxid %d)", broker_id, stat.czxid)
                return stat.czxid
            except NodeExistsError:
                try:
                    _, stat = self.zk.get(path)
                    if stat.ephemeralOwner == self.session_id:
                        return stat.czxid
                except NoNodeError:
                    continue
                if not warned:
                    log.warning("%s is still held by an earlier session of broker %d; waiting for it to "
                                "expire (zookeeper.session.timeout.ms)", path, broker_id)
                    warned = True
                stop.wait(0.5)
        raise RuntimeError("stopped before registering")

    def try_become_controller(self, broker_id: int) -> int | None:
        """Create /controller if nobody holds it. Returns the new controller epoch, or None."""
        data = json.dumps({"version": 1, "brokerid": broker_id,
                           "timestamp": str(int(time.time() * 1000))}).encode()
        try:
            self.zk.create(CONTROLLER, data, ephemeral=True)
        except NodeExistsError:
            return None
        while True:
            try:
                raw, stat = self.zk.get(CONTROLLER_EPOCH)
                epoch = int(raw) + 1
                self.zk.set(CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
                return epoch
            except NoNodeError:
                try:
                    self.zk.create(CONTROLLER_EPOCH, b"1")
                    return 1
                except NodeExistsError:
                    continue
            except BadVersionError:
                continue

    def holds_controller(self, broker_id: int) -> bool:
        try:
            raw, stat = self.zk.get(CONTROLLER)
        except NoNodeError:
            return False
        return json.loads(raw).get("brokerid") == broker_id and stat.ephemeralOwner == self.session_id

    def request_controlled_shutdown(self, broker_id: int) -> None:
        try:
            self.zk.create(f"{SHUTDOWN}/{broker_id}", b"", ephemeral=True)
        except NodeExistsError:
            pass

    # -- reading -----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Everything, with a one-shot watch on each node read."""
        snap = Snapshot()
        for child in self.zk.get_children(BROKERS, watch=self._watch):
            try:
                raw, stat = self.zk.get(f"{BROKERS}/{child}")
            except NoNodeError:
                continue
            info = json.loads(raw)
            snap.brokers[int(child)] = BrokerInfo(int(child), info["host"], int(info["port"]), stat.czxid)
        try:
            raw, _ = self.zk.get(CONTROLLER, watch=self._watch)
            snap.controller = int(json.loads(raw)["brokerid"])
        except NoNodeError:
            self.zk.exists(CONTROLLER, watch=self._watch)
        try:
            raw, _ = self.zk.get(CONTROLLER_EPOCH)
            snap.controller_epoch = int(raw)
        except NoNodeError:
            pass
        snap.shutting_down = frozenset(int(c) for c in self.zk.get_children(SHUTDOWN, watch=self._watch))
        for name in self.zk.get_children(TOPICS, watch=self._watch):
            try:
                raw, _ = self.zk.get(f"{TOPICS}/{name}")
            except NoNodeError:
                continue
            info = json.loads(raw)
            assignment = {int(p): tuple(int(b) for b in r) for p, r in info["partitions"].items()}
            snap.topics[name] = TopicInfo(name, info.get("topic_id"), assignment)
            for p in assignment:
                try:
                    raw, stat = self.zk.get(state_path(name, p), watch=self._watch)
                except NoNodeError:
                    self.zk.exists(state_path(name, p), watch=self._watch)
                    continue
                snap.states[(name, p)] = PartitionState.parse(raw, stat.version, stat.mzxid)
        return snap

    def producer_id_block(self, broker_id: int, size: int) -> tuple[int, int]:
        """Reserve [start, end) of producer ids for the whole cluster, as Kafka's
        /latest_producer_id_block does, by a conditional update."""
        path = "/latest_producer_id_block"
        while True:
            try:
                raw, stat = self.zk.get(path)
                start = int(json.loads(raw)["block_end"]) + 1
                version = stat.version
            except NoNodeError:
                start, version = 0, None
            end = start + size - 1
            data = json.dumps({"version": 1, "broker": broker_id, "block_start": str(start),
                               "block_end": str(end)}).encode()
            try:
                if version is None:
                    self.zk.create(path, data)
                else:
                    self.zk.set(path, data, version=version)
                return start, end + 1
            except (NodeExistsError, BadVersionError):
                continue

    def live_brokers(self) -> list[int]:
        return sorted(int(c) for c in self.zk.get_children(BROKERS))

    # -- writing ------------------------------------------------------------------------

    def create_topic(self, name: str, topic_id: str, assignment: dict[int, tuple[int, ...]],
                     controller_epoch: int) -> None:
        """Write the assignment and every partition's first state in one transaction.
        Raises NodeExistsError if the topic exists."""
        tx = self.zk.transaction()
        tx.create(f"{TOPICS}/{name}", json.dumps({
            "version": 2, "topic_id": topic_id,
            "partitions": {str(p): list(r) for p, r in sorted(assignment.items())},
            "adding_replicas": {}, "removing_replicas": {}}).encode())
        tx.create(f"{TOPICS}/{name}/partitions")
        for p, replicas in sorted(assignment.items()):
            tx.create(f"{TOPICS}/{name}/partitions/{p}")
            tx.create(state_path(name, p), PartitionState(replicas[0], 0, replicas, controller_epoch).to_json())
        results = tx.commit()
        for r in results:
            if isinstance(r, NodeExistsError):
                raise NodeExistsError(f"topic {name} exists")
            if isinstance(r, Exception):
                raise r

    def update_state(self, topic: str, partition: int, state: PartitionState, expected_version: int) -> int | None:
        """Write `state` only if the znode is still at `expected_version`. The new version, or None
        when someone else changed it first."""
        try:
            stat = self.zk.set(state_path(topic, partition), state.to_json(), version=expected_version)
            return stat.version
        except (BadVersionError, NoNodeError):
            return None
