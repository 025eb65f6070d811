"""Kafka 3.9 in ZooKeeper mode and the reference broker, side by side, for differential tests.

In: which system (`"kafka"` or `"reference"`), the broker settings both clusters share, and how many
brokers (three by default; one: a standalone reference broker, and Kafka beside a ZooKeeper of its
own). Out: a `Side`: the broker nodes and a ZooKeeper node in network namespaces, set up through the
db layer `faultline run` uses (Kafka 3.9.1 from its jars; `faultline broker`), with what a scripted
scenario needs: the partition state both keep at the same ZooKeeper path, raw Kafka requests to any
broker (`tests.wire`), kills, restarts, pauses (of ZooKeeper too) and links cut between two nodes
(iptables), and the nodes of a partition named by role (`leader`, `f1`, `f2`: followers in
assignment order), so that answers from two clusters, whose brokers lead different partitions,
compare as equals.
"""

from __future__ import annotations

import datetime
import json
import secrets
import shutil
import tempfile
from pathlib import Path

from kazoo.client import KazooClient
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from faultline.control.local_cluster import LocalCluster
from faultline.control.net import Net
from faultline.control.wait import wait_until
from faultline.db.core import create_topics
from faultline.runner import testmap
from faultline.runner.cli import _spec_from_args, build_parser
from tests.wire import EARLIEST, WireClient, list_offset, part_response, partition_metadata, produce_req

KAFKA_VERSION = "3.9.1"
PORT = 9092


class Side:
    """One cluster of one system: three brokers (or as many as asked), with ZooKeeper on a node of
    its own (a standalone reference broker has none)."""

    def __init__(self, system: str, settings: dict[str, str], nodes: int = 3, extra: tuple[str, ...] = ()):
        """`nodes` brokers (one: a standalone reference broker, and Kafka beside a ZooKeeper of its
        own); `extra`: more `faultline run` arguments, such as `--nemesis power-loss` for disks
        that lose what was not fsynced when a node's power is cut."""
        argv = ["run", "--nodes", str(nodes), "--replication-factor", str(min(3, nodes)), *extra]
        if system == "kafka":
            argv += ["--db", "kafka", "--kafka-version", KAFKA_VERSION, "--kafka-mode", "zookeeper"]
            # Kafka's controller moves leadership back to the preferred replica 5 s after it is
            # elected and every 300 s; the reference broker has no such task, and a scenario that
            # names its leader at the start must keep it.
            settings = {**settings, "auto.leader.rebalance.enable": "false"}
        for key, value in settings.items():
            argv += ["--broker-set", f"{key}={value}"]
        self.system = system
        self.spec = _spec_from_args(build_parser().parse_args(argv))
        nodes, support = testmap.node_names(self.spec)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"faultline-diff-{system}-"))
        self.cluster = LocalCluster.create(secrets.token_hex(3), nodes + support, self.workdir)
        try:
            self.db = testmap.db_class(self.spec)(self.spec, self.cluster.remotes, self.workdir)
            self.net = Net(self.cluster.remotes)
            self.db.setup()
            self.zk = None
            if self.db.zookeeper_connect:
                self.zk = KazooClient(hosts=self.db.zookeeper_connect)
                self.zk.start(15)
        except BaseException:
            self.cluster.destroy()
            raise
        self.ids = {node: i + 1 for i, node in enumerate(self.db.nodes)}

    def close(self) -> Path:
        """Stop everything; the nodes' logs are kept in a folder of their own, whose path is returned
        (and printed), for reading after a scenario that failed."""
        logs = Path(tempfile.mkdtemp(prefix=f"faultline-diff-{self.system}-logs-"))
        try:
            self.net.heal()
            if self.db.zookeeper is not None:
                self.resume_zookeeper()
            for node in self.db.nodes:
                if self.db.running(node):
                    self.db.resume(node)
            if self.zk is not None:
                self.zk.stop()
                self.zk.close()
            self.db.teardown(logs)
        finally:
            self.cluster.destroy()
            shutil.rmtree(self.workdir, ignore_errors=True)
            print(f"{self.system}: the nodes' logs are in {logs}")
        return logs

    # -- the partition, from ZooKeeper ---------------------------------------------------------

    def create_topic(self, topic: str, replication_factor: int = 3) -> None:
        create_topics([topic], 1, replication_factor, self.db.bootstrap)
        if self.zk is None:
            return  # a standalone broker: the admin client waited for its leader
        wait_until(lambda: len(self.state(topic)["isr"]) == replication_factor, 30,
                   f"{self.system}: every replica of {topic}-0 in sync")
        self.wait_leading(self.roles(topic)["leader"], topic)

    def create_topic_led_by_controller(self, prefix: str, tries: int = 12) -> str:
        """Create `prefix-0`, `prefix-1`, ... until one is led by the controller, and return its
        name: Kafka's leader asks the controller to change the ISR (AlterPartition), so a scenario
        that cuts the leader from its followers must not cut it from the controller too. Topic
        creation places leaders round-robin from a random broker, so a few tries suffice."""
        for i in range(tries):
            topic = f"{prefix}-{i}"
            self.create_topic(topic)
            if self.state(topic)["leader"] == self.controller():
                return topic
        raise TimeoutError(f"{self.system}: none of {tries} topics {prefix}-* is led by the controller")

    def pause_zookeeper(self) -> None:
        """SIGSTOP ZooKeeper: no ISR change can be recorded until `resume_zookeeper`. Its sessions
        do not expire while it is stopped; keep the pause well under zookeeper.session.timeout.ms
        all the same, since the clients' read timeouts (2/3 of it) run on."""
        for node in self.db.zookeeper.remotes:
            self.db.zookeeper.remotes[node].pause("zookeeper")

    def resume_zookeeper(self) -> None:
        for node in self.db.zookeeper.remotes:
            self.db.zookeeper.remotes[node].resume("zookeeper")

    def wait_leading(self, node: str, topic: str) -> None:
        """ZooKeeper says who leads before that broker has heard it (Kafka's LeaderAndIsr request):
        wait until it serves the partition as its leader."""

        # ListOffsets, not Fetch: a follower serves consumer fetches too (KIP-392, fetch v11+), while
        # only the leader answers a consumer's ListOffsets (the earliest offset even while its high
        # watermark lags the start of its epoch, KIP-207).
        # And its metadata names it leader: Kafka's produce path asks the metadata cache, which
        # the controller's UpdateMetadata fills after the LeaderAndIsr that ListOffsets follows,
        # and answers UNKNOWN_TOPIC_OR_PARTITION in between.
        def serving() -> bool:
            with self.client(node) as client:
                if list_offset(client, topic, EARLIEST)[0] != ErrorCode.none:
                    return False
                try:
                    return partition_metadata(client, topic).leader_id == self.ids[node]
                except StopIteration:  # the topic is not in its metadata yet
                    return False

        wait_until(serving, 30, f"{self.system}: {node} serves {topic}-0 as its leader")

    def state(self, topic: str) -> dict:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/0/state")[0])

    def controller(self) -> int | None:
        if not self.zk.exists("/controller"):
            return None
        return json.loads(self.zk.get("/controller")[0])["brokerid"]

    def roles(self, topic: str) -> dict[str, str]:
        """Role -> node: the leader now, and the other replicas in assignment order."""
        assignment = json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])["partitions"]["0"]
        leader = self.state(topic)["leader"]
        node_of = {i: n for n, i in self.ids.items()}
        followers = [b for b in assignment if b != leader]
        return {"leader": node_of[leader], **{f"f{i + 1}": node_of[b] for i, b in enumerate(followers)}}

    def isr_roles(self, topic: str, roles: dict[str, str]) -> list[str]:
        role_of = {self.ids[node]: role for role, node in roles.items()}
        return sorted(role_of[b] for b in self.state(topic)["isr"])

    def wait_isr(self, topic: str, roles: dict[str, str], expected: list[str], timeout: float = 40) -> None:
        """Wait until ZooKeeper holds the expected ISR and the leader has heard it. Kafka's
        controller writes ZooKeeper before it tells the leader (LeaderAndIsr, then UpdateMetadata,
        in that order on one connection): a request sent in between would still meet the old ISR."""
        wait_until(lambda: self.isr_roles(topic, roles) == sorted(expected), timeout,
                   f"{self.system}: the ISR of {topic}-0 did not become {sorted(expected)} "
                   f"(it is {self.isr_roles(topic, roles)})")
        ids = sorted(self.ids[roles[role]] for role in expected)

        def leader_knows() -> bool:
            with self.client(roles["leader"]) as client:
                return sorted(partition_metadata(client, topic).isr_nodes) == ids

        wait_until(leader_knows, timeout, f"{self.system}: {roles['leader']} has heard that the ISR of "
                                          f"{topic}-0 is {sorted(expected)}")

    def start(self, node: str) -> None:
        """Start a killed broker once ZooKeeper has dropped its old registration: a Kafka broker
        started while the session of its killed self still holds /brokers/ids/<id> exits at start-up
        (NodeExistsException), so both systems are given the same wait."""
        path = f"/brokers/ids/{self.ids[node]}"
        wait_until(lambda: not self.zk.exists(path), 30,
                   f"{self.system}: ZooKeeper dropped the registration of the killed {node}")
        self.db.start(node)

    # -- requests --------------------------------------------------------------------------------

    def client(self, node: str, timeout: float = 30) -> WireClient:
        return WireClient(self.cluster.remotes[node].address, PORT, timeout=timeout)

    def broker_id(self, node: str) -> int:
        return self.ids[node]


# -- raw requests both systems answer ----------------------------------------------------------------


def produce(client: WireClient, topic: str, batch: bytes, acks: int = -1, timeout_s: float = 10):
    """(error code, base offset) of one batch produced to partition 0."""
    part = part_response(client.request(produce_req(topic, 0, batch, acks, timeout_s)))
    return part.error_code, part.base_offset


def init_producer_id(client: WireClient) -> tuple[int, int]:
    """A producer id and epoch for an idempotent producer. Kafka's first answer may be
    COORDINATOR_LOAD_IN_PROGRESS while its broker fetches a block of ids from the controller."""
    answers = []

    def given() -> bool:
        resp = client.request(InitProducerIdRequest(transactional_id=None,
                                                    transaction_timeout=datetime.timedelta(seconds=60),
                                                    producer_id=-1, producer_epoch=-1))
        answers.append(resp)
        return resp.error_code == ErrorCode.none

    wait_until(given, 30, "InitProducerId answered a producer id")
    return answers[-1].producer_id, answers[-1].producer_epoch
