"""A replicated reference-broker cluster on localhost for tests: one real
ZooKeeper and N `faultline broker` processes, with helpers to read the
partition state the controller keeps in ZooKeeper and to kill, pause and
restart brokers.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from faultline.control.wait import wait_until
from tests.conftest import BrokerProcess
from tests.wire import WireClient, partition_metadata


class Cluster:
    def __init__(self, root: Path, zk_connect: str, nodes: int = 3, settings: dict | None = None):
        root.mkdir(parents=True, exist_ok=True)
        self.chroot = f"/t{uuid.uuid4().hex[:10]}"
        self.zk_connect = zk_connect + self.chroot
        base = {"zookeeper.connect": self.zk_connect, "zookeeper.session.timeout.ms": 3000,
                "replica.lag.time.max.ms": 3000, "replica.fetch.backoff.ms": 200}
        base.update(settings or {})
        self.brokers = {i: BrokerProcess(root / f"b{i}", base, node_id=i) for i in range(1, nodes + 1)}
        self.paused: set[int] = set()
        self.zk = KazooClient(hosts=self.zk_connect)
        self.zk.start(10)

    def start(self, *ids: int) -> "Cluster":
        for i in ids or self.brokers:
            self.brokers[i].start()
        self.wait_registered(*(ids or self.brokers))
        return self

    @property
    def bootstrap(self) -> str:
        # A client bootstrapped from a paused broker can wait out its whole timeout on it.
        return ",".join(b.bootstrap for i, b in self.brokers.items() if i not in self.paused)

    def close(self) -> None:
        for b in self.brokers.values():
            if b.alive():
                try:
                    os.kill(b.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            b.kill()
        self.zk.stop()
        self.zk.close()

    # -- what ZooKeeper says ------------------------------------------------------------

    def registered(self) -> set[int]:
        return {int(c) for c in self.zk.get_children("/brokers/ids")} if self.zk.exists("/brokers/ids") else set()

    def wait_registered(self, *ids: int, timeout: float = 30) -> None:
        def missing() -> str:
            # What each missing broker last said: whether it died, and where its start stopped.
            lines = []
            for i in sorted(set(ids) - self.registered()):
                b = self.brokers[i]
                status = ("not started" if b.proc is None else "running" if b.alive()
                          else f"exited with status {b.proc.returncode}")
                tail = "\n    ".join(b.log_text().splitlines()[-5:]) or "(no log)"
                lines.append(f"broker {i} ({status}), its log ends:\n    {tail}")
            return (f"brokers {sorted(ids)} did not register in ZooKeeper {self.zk_connect}; "
                    + "; ".join(lines))

        wait_until(lambda: set(ids) <= self.registered(), timeout, missing)

    def controller(self) -> int | None:
        if not self.zk.exists("/controller"):
            return None
        return json.loads(self.zk.get("/controller")[0])["brokerid"]

    def state(self, topic: str, partition: int) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])

    def assignment(self, topic: str) -> dict[int, list[int]]:
        raw = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])
        return {int(p): r for p, r in raw["partitions"].items()}

    def wait_state(self, topic: str, partition: int, predicate, what: str, timeout: float = 30) -> dict:
        found = {}

        def ok() -> bool:
            found.update(self.state(topic, partition))
            return predicate(found)

        wait_until(ok, timeout, lambda: f"{topic}-{partition} never reached {what}; last state {found}")
        return found

    # -- clients -------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, replication_factor: int) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for fut in admin.create_topics([NewTopic(name, partitions, replication_factor)],
                                       operation_timeout=10).values():
            fut.result(20)
        for p in range(partitions):
            state = self.wait_state(name, p, lambda s: s["leader"] >= 0 and len(s["isr"]) == replication_factor,
                                    "a leader and a full ISR")
            # ZooKeeper says so before each broker's metadata does: a request sent to the leader
            # straight away could find a partition it does not know yet.
            for b in self.assignment(name)[p]:
                self.wait_knows(b, name, p, state["leader"])

    def wait_knows(self, broker: int, topic: str, partition: int, leader: int) -> None:
        """Wait until `broker`'s own metadata names `leader` as the partition's."""
        said: list = [None]

        def knows() -> bool:
            with WireClient("127.0.0.1", self.brokers[broker].port) as client:
                try:
                    said[0] = partition_metadata(client, topic, partition).leader_id
                except StopIteration:  # the topic is not in its metadata yet
                    said[0] = "no such partition"
            return said[0] == leader
        wait_until(knows, 30, lambda: f"broker {broker} never named {leader} the leader of {topic}-{partition} "
                                      f"(last: {said[0]})")

    def producer(self, **conf) -> Producer:
        base = {"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                "linger.ms": 2, "message.timeout.ms": 30000}
        base.update(conf)
        return Producer(base)

    # -- faults --------------------------------------------------------------------------

    def kill(self, i: int) -> None:
        self.brokers[i].kill()

    def pause(self, i: int) -> None:
        os.kill(self.brokers[i].proc.pid, signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        os.kill(self.brokers[i].proc.pid, signal.SIGCONT)
        self.paused.discard(i)


def produce(producer: Producer, topic: str, partition: int, values: list[str]) -> list[tuple]:
    """Send values and wait; returns [(value, offset or None, error name or None)] in send order."""
    results: dict[str, tuple] = {}

    def done(err, msg):
        v = msg.value().decode()
        results[v] = (v, None if err else msg.offset(), err.name() if err else None)

    for v in values:
        producer.produce(topic, v.encode(), partition=partition, on_delivery=done)
    producer.flush(60)
    return [results[v] for v in values]
