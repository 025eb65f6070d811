"""Apache Kafka as a system under test (`faultline run --db kafka`), from Kafka's own jars.

In: the test spec (`kafka_version`, `kafka_mode`, `kafka_controllers`, `kafka_features`,
`broker_settings`) and one `Remote` per node. Out: a Kafka cluster on the nodes behind the `DB`
interface: the version's jars resolved once from Maven Central (`kafka_jars`), each node's
`server.properties` written, its storage formatted with Kafka's storage tool
(`kafka.tools.StorageTool format`, feature levels from `--kafka-feature`), each node started as
`java <kafka_jars.BROKER_JVM_OPTIONS> -cp '<jars>/*' kafka.Kafka server.properties` inside its
network namespace (the daemon "broker", so kill, pause, partitions and `faultline cleanup` reach
it as they reach the reference broker), and `server.log`, `controller.log`, `state-change.log`,
the GC log, the JVM's output and `server.properties` collected into `store/nodes/<node>/`.

Layouts:
- KRaft (default): brokers `n1..nN` (node ids 1..N); the first 3 (1 when N < 3) are combined
  controller+broker nodes, the static quorum `controller.quorum.voters`;
- KRaft with `kafka_controllers = M`: M controller-only nodes `c1..cM` (ids 101..) hold the
  quorum and the brokers are brokers only; controller nodes are targets of process faults too;
- ZooKeeper (`kafka_mode = "zookeeper"`, Kafka 3.x): brokers register in the run's ZooKeeper
  (`zk1..`, `db/zookeeper.py`), as the reference broker's do.

Who leads a partition and its ISR come from Kafka's Admin API (confluent-kafka's
`describe_topics`); the active controller from the quorum (DescribeQuorum, which any broker
forwards to the controllers) under KRaft, and from `describe_cluster` under ZooKeeper. Power
loss puts each node's log dirs on the project's FUSE file system; clock faults preload
libfaketime into the JVM; both as for the reference broker (the parts of its db reused here).
"""

from __future__ import annotations

import base64
import logging
import socket
import struct
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..control.wait import wait_until
from ..models.spec import TestSpec
from .core import EXITED, wait_serving
from .reference import DAEMON, DISK, ReferenceBrokerDB
from .zookeeper import ZooKeeperDB

log = logging.getLogger("faultline.db.kafka")

BROKER_PORT = 9092
CONTROLLER_PORT = 9093
CONTROLLER_ID_BASE = 100
# Files of a node's folder copied into store/nodes/<node>/ (the GC log rotates: kafka-gc.log.N too).
LOG_FILES = ("server.log", "controller.log", "state-change.log", "kafka.out", "server.properties",
             "format.log", "disk.log")


def _jars():
    # Imported when needed, so `python -m faultline.db.kafka_jars` runs a module not yet imported.
    from . import kafka_jars

    return kafka_jars


def cluster_id() -> str:
    """A cluster id as Kafka makes one (`Uuid.randomUuid()`: 16 random bytes, URL-safe base64,
    never starting with '-', which a command line would take for an option)."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value


def properties_text(settings: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class KafkaDB(ReferenceBrokerDB):
    """Apache Kafka on every node. See the module's docstring for the layouts."""

    @staticmethod
    def node_names(spec: TestSpec) -> tuple[list[str], list[str]]:
        brokers = [f"n{i + 1}" for i in range(spec.nodes)]
        controllers = [f"c{i + 1}" for i in range(spec.kafka_controllers)]
        zookeeper = ([f"zk{i + 1}" for i in range(spec.effective_zookeeper_nodes)]
                     if spec.kafka_mode == "zookeeper" else [])
        return brokers + controllers, zookeeper

    def __init__(self, spec: TestSpec, remotes: dict, workdir: Path):
        self.spec = spec
        self.nodes, self.support_nodes = self.node_names(spec)
        self.remotes = {n: remotes[n] for n in self.nodes}
        self.workdir = workdir
        self.brokers = [n for n in self.nodes if n.startswith("n")]
        self.controller_nodes = [n for n in self.nodes if n.startswith("c")]
        self.node_ids = {name: i + 1 for i, name in enumerate(self.brokers)}
        self.node_ids.update({name: CONTROLLER_ID_BASE + i + 1 for i, name in enumerate(self.controller_nodes)})
        self.kraft = spec.kafka_mode == "kraft"
        if self.kraft:
            self.voters = self.controller_nodes or self.brokers[:3 if len(self.brokers) >= 3 else 1]
        else:
            self.voters = []
        self.zookeeper = (ZooKeeperDB({n: remotes[n] for n in self.support_nodes}, workdir)
                          if self.support_nodes else None)
        self.zookeeper_connect = self.zookeeper.connect if self.zookeeper else None
        self.cluster_id = cluster_id()
        self.home: Path | None = None  # the version's cache folder, once resolved
        self._view = None

    # -- configuration

    def roles(self, node: str) -> list[str]:
        if not self.kraft:
            return ["broker"]
        return ([r for r in ("broker",) if node in self.brokers]
                + [r for r in ("controller",) if node in self.voters])

    def data_root(self, node: str) -> Path:
        return self.node_dir(node) / "data"

    def partition_dir(self, node: str, topic: str, partition: int) -> Path:
        return self.data_root(node) / "kafka-logs" / f"{topic}-{partition}"

    def settings(self, node: str | None = None, data_root: Path | None = None) -> dict[str, str]:
        """The node's server.properties: faultline's layout, Kafka's defaults where a small 3-node
        cluster needs other values, and the test's --broker-set last (passed through unchanged)."""
        node = node or self.brokers[0]
        address = self.remotes[node].address
        brokers = len(self.brokers)
        roles = self.roles(node)
        root = data_root or self.data_root(node)
        s: dict[str, str] = {}
        if self.kraft:
            s["process.roles"] = ",".join(roles)
            s["node.id"] = str(self.node_ids[node])
            s["controller.quorum.voters"] = ",".join(
                f"{self.node_ids[v]}@{self.remotes[v].address}:{CONTROLLER_PORT}" for v in self.voters)
            s["controller.listener.names"] = "CONTROLLER"
            listeners = []
            if "broker" in roles:
                listeners.append(f"PLAINTEXT://{address}:{BROKER_PORT}")
            if "controller" in roles:
                listeners.append(f"CONTROLLER://{address}:{CONTROLLER_PORT}")
            s["listeners"] = ",".join(listeners)
            if "broker" in roles:
                s["advertised.listeners"] = f"PLAINTEXT://{address}:{BROKER_PORT}"
                s["inter.broker.listener.name"] = "PLAINTEXT"
            s["listener.security.protocol.map"] = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        else:
            s["broker.id"] = str(self.node_ids[node])
            s["zookeeper.connect"] = self.zookeeper_connect or ""
            s["zookeeper.session.timeout.ms"] = "6000"
            s["listeners"] = f"PLAINTEXT://{address}:{BROKER_PORT}"
            s["advertised.listeners"] = f"PLAINTEXT://{address}:{BROKER_PORT}"
        s["log.dirs"] = str(root / "kafka-logs")
        rf = self.spec.effective_replication_factor
        s["num.partitions"] = str(self.spec.partitions)
        s["default.replication.factor"] = str(rf)
        # Internal topics sized for the node count, so groups and transactions work on 1 to 3 nodes,
        # with fewer partitions than Kafka's 50 so that a restarted node loads them in moments.
        s["offsets.topic.replication.factor"] = str(min(3, brokers))
        s["offsets.topic.num.partitions"] = "10"
        s["transaction.state.log.replication.factor"] = str(min(3, brokers))
        s["transaction.state.log.min.isr"] = str(min(2, brokers))
        s["transaction.state.log.num.partitions"] = "10"
        s["group.initial.rebalance.delay.ms"] = "0"
        # Failures noticed in seconds, as the reference cluster's defaults do.
        s["replica.lag.time.max.ms"] = "10000"
        s.update(self.spec.broker_settings)
        return s

    def properties_path(self, node: str) -> Path:
        return self.node_dir(node) / "server.properties"

    def log_path(self, node: str) -> Path:
        """The JVM's own output (stdout and stderr); Kafka's logs are server.log and friends."""
        return self.node_dir(node) / "kafka.out"

    def command(self, node: str) -> list[str]:
        assert self.home is not None, "setup() resolves the jars first"
        kafka_jars = _jars()
        java = self.remotes[node].java
        version = self.spec.kafka_version
        config = self.home / kafka_jars.log_config_name(version)
        return [java, *kafka_jars.BROKER_JVM_OPTIONS, *self._archive(node),
                f"-Xlog:gc*:file={self.node_dir(node) / 'kafka-gc.log'}:time,tags:filecount=4,filesize=20M",
                f"-Dkafka.logs.dir={self.node_dir(node)}", kafka_jars.log_config_property(version, config),
                "-cp", f"{self.home / 'lib'}/*", "kafka.Kafka", str(self.properties_path(node))]

    # -- addresses

    def address(self, node: str) -> str:
        return f"{self.remotes[node].address}:{BROKER_PORT}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(n) for n in self.brokers)

    def port(self, node: str) -> int:
        return BROKER_PORT if node in self.brokers else CONTROLLER_PORT

    # -- lifecycle

    def format(self, node: str) -> None:
        """Format the node's log dirs with Kafka's storage tool (KRaft), with the test's feature levels.
        With power loss, onto the node's disk (the durable side), before its file system is mounted."""
        assert self.home is not None
        kafka_jars = _jars()
        root = self.disk_dir(node) if self.power_loss else self.data_root(node)
        props = self.node_dir(node) / "format.properties"
        props.write_text(properties_text(self.settings(node, root)))
        java = self.remotes[node].java
        config = self.home / kafka_jars.log_config_name(self.spec.kafka_version)
        cmd = [java, "-Xmx256m", *self._archive(node), kafka_jars.log_config_property(self.spec.kafka_version, config),
               f"-Dkafka.logs.dir={self.node_dir(node) / 'format-logs'}", "-cp", f"{self.home / 'lib'}/*",
               "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(props)]
        for name, level in self.spec.kafka_features.items():
            cmd += ["--feature", f"{name}={level}"]
        proc = self.remotes[node].run(cmd, timeout=120, check=False)
        (self.node_dir(node) / "format.log").write_text(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        if proc.returncode != 0:
            raise RuntimeError(f"formatting Kafka's storage on {node} failed (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-2000:]}")

    def _archive(self, node: str) -> list[str]:
        """The class archive's option for the node's JVM (kafka_archive): none in a container."""
        from . import kafka_archive

        return kafka_archive.options(self.spec.kafka_version, self.remotes[node].java)

    def start(self, node: str) -> int:
        remote = self.remotes[node]
        if not self.kraft and node in self.brokers:
            self._wait_unregistered(node)
        if self.power_loss and remote.pid(DISK) is None:
            self.mount_disk(node)
        env = None
        if self.skewable:
            from ..control.clock import environment, set_offset

            if not self.clock_file(node).exists():
                set_offset(self.clock_file(node), self.start_offset(node))
            # libfaketime's "monotonic fix" wraps pthread_cond_timedwait on monotonic clocks, which the
            # JVM waits on everywhere: with it, a JVM starts ten times slower (measured: 1.4 s ->
            # 19-26 s for Kafka's storage tool). Monotonic clocks are not faked here, so it is not needed.
            env = dict(environment(self.clock_file(node)), FAKETIME_FORCE_MONOTONIC_FIX="0")
        pid = remote.spawn(DAEMON, self.command(node), self.log_path(node), env=env)
        log.info("started Kafka %s (%s) on %s (pid %d)", self.node_ids[node], "+".join(self.roles(node)), node, pid)
        return pid

    def _wait_unregistered(self, node: str) -> None:
        """A ZooKeeper-mode broker started while the session of its killed self still holds
        /brokers/ids/<id> exits at start-up (NodeExistsException): wait until ZooKeeper has ended
        that session (zookeeper.session.timeout.ms after the kill)."""
        path = f"/brokers/ids/{self.node_ids[node]}"
        zk = self._cluster_view().zk
        session_s = int(self.settings(node).get("zookeeper.session.timeout.ms", "6000")) / 1000
        wait_until(lambda: not zk.exists(path), session_s + 15,
                   f"ZooKeeper still holds {path}, the registration of the Kafka broker on {node} "
                   f"before it was stopped; a broker started now would exit")

    def wait_ready(self, node: str, timeout: float = 60) -> None:
        host, port = self.remotes[node].address, self.port(node)

        def accepting() -> bool | str:
            if self.remotes[node].pid(DAEMON) is None:
                return EXITED
            with socket.create_connection((host, port), timeout=1):
                return True

        wait_serving(accepting, timeout, f"Kafka on {node} did not accept connections on {host}:{port}; "
                                         f"{self._tail(node)}", "Kafka", node, self._log_with_output(node))

    def _log_with_output(self, node: str) -> Path:
        """kafka.out when the JVM said anything there (it dies before logging), else server.log."""
        out = self.node_dir(node) / "kafka.out"
        return out if out.exists() and out.stat().st_size else self.node_dir(node) / "server.log"

    def _tail(self, node: str) -> str:
        for name in ("kafka.out", "server.log"):
            path = self.node_dir(node) / name
            if path.exists() and path.stat().st_size:
                return f"its {name} ends:\n{path.read_text(errors='replace')[-1500:]}"
        return "it logged nothing"

    def setup(self) -> None:
        self.home = _jars().resolve(self.spec.kafka_version)
        from . import kafka_archive

        for java in sorted({self.remotes[n].java for n in self.nodes}):
            kafka_archive.ensure(self.spec.kafka_version, java)
        if self.zookeeper is not None:
            self.zookeeper.setup()
        for node in self.nodes:
            self.node_dir(node).mkdir(parents=True, exist_ok=True)
            self.properties_path(node).write_text(properties_text(self.settings(node)))
        if self.kraft:
            # One JVM per node; two at a time is what two cores hold.
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(self.format, self.nodes))
        for node in self.nodes:
            self.start(node)
        for node in self.nodes:
            self.wait_ready(node, 90)

    def stop(self, node: str) -> int | None:
        return self.remotes[node].stop(DAEMON, 30)

    def teardown(self, store_dir: Path) -> None:
        try:
            self._teardown_kafka(store_dir)
        finally:
            if self.zookeeper is not None:
                self.zookeeper.teardown(store_dir)

    def _teardown_kafka(self, store_dir: Path) -> None:
        for node in self.nodes:
            try:
                self.remotes[node].resume(DAEMON)
            except Exception:  # noqa: BLE001 - it may not be running
                pass

        def stop(node: str) -> None:
            # The history is closed and the data folders are thrown away, so only a power-loss
            # run's disk needs a clean end (the broker's clean shutdown flushes it); that gets 10 s,
            # as a node whose quorum is gone waits for it, then SIGKILL. The rest are SIGKILLed at
            # once, as Jepsen's teardown does: a clean shutdown of three nodes took 6-10 s.
            try:
                if self.power_loss:
                    self.remotes[node].stop(DAEMON, 10)
                else:
                    self.remotes[node].kill(DAEMON)
            except Exception as exc:  # noqa: BLE001 - teardown goes on for the other nodes
                log.warning("stopping Kafka on %s failed: %s", node, exc)
            if self.power_loss:
                try:
                    self.remotes[node].stop(DISK, 10)
                    self.unmount_disk(node)
                except Exception as exc:  # noqa: BLE001
                    log.warning("unmounting the disk of %s failed: %s", node, exc)

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(stop, self.nodes))
        for node, remote in self.remotes.items():
            dest = store_dir / "nodes" / node
            dest.mkdir(parents=True, exist_ok=True)
            folder = self.node_dir(node)
            names = [*LOG_FILES, *(p.name for p in folder.glob("kafka-gc.log*"))]
            for name in names:
                if (folder / name).exists():
                    try:
                        remote.download(folder / name, dest / name)
                    except OSError as exc:
                        log.warning("collecting %s of %s failed: %s", name, node, exc)

    # -- the cluster as Kafka's Admin API says

    def admin(self):
        """A fresh Admin client for each question: librdkafka sends describe_topics and
        describe_cluster to the broker it last took for the controller, and a long-lived client
        would keep waiting on a killed one until its next metadata refresh (minutes)."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000,
                            "logger": logging.getLogger("faultline.db.kafka.admin")})

    def node_of(self, node_id: int | None) -> str | None:
        return next((n for n, i in self.node_ids.items() if i == node_id), None)

    def _partition(self, topic: str, partition: int):
        from confluent_kafka import TopicCollection

        admin = self.admin()  # held until the answer came: a client dropped earlier is destroyed
        description = admin.describe_topics(TopicCollection([topic]), request_timeout=8)[topic].result(10)
        return next((p for p in description.partitions if p.id == partition), None)

    def leader(self, topic: str, partition: int) -> str | None:
        try:
            info = self._partition(topic, partition)
        except Exception as exc:  # noqa: BLE001 - no broker answered: nobody known to lead
            log.info("describe_topics(%s) failed: %s", topic, exc)
            return None
        return self.node_of(info.leader.id) if info is not None and info.leader is not None else None

    def in_sync_replicas(self, topic: str, partition: int) -> list[str]:
        info = self._partition(topic, partition)
        return sorted(n for n in (self.node_of(r.id) for r in (info.isr if info else [])) if n is not None)

    def controller(self) -> str | None:
        if not self.kraft:
            try:
                admin = self.admin()  # held until the answer came
                cluster = admin.describe_cluster(request_timeout=8).result(10)
            except Exception as exc:  # noqa: BLE001
                log.info("describe_cluster failed: %s", exc)
                return None
            return self.node_of(cluster.controller.id) if cluster.controller is not None else None
        # Under KRaft a broker's metadata names a random broker as "controller"; the quorum's
        # leader is the active controller, and every broker forwards DescribeQuorum to it.
        for node in self.brokers:
            try:
                leader = describe_quorum_leader(self.remotes[node].address, BROKER_PORT)
            except Exception as exc:  # noqa: BLE001 - try the next broker
                log.info("DescribeQuorum through %s failed: %s", node, exc)
                continue
            if leader is not None and leader >= 0:
                return self.node_of(leader)
        return None


def describe_quorum_leader(host: str, port: int, timeout: float = 5.0) -> int | None:
    """The node id leading `__cluster_metadata` (the active controller), by Kafka's DescribeQuorum
    request (v0) sent to a broker, which forwards it to the controllers; None if it has no leader."""
    from kio.index import load_response_schema
    from kio.schema.describe_quorum.v0.request import DescribeQuorumRequest, PartitionData, TopicData
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_reader, entity_writer
    from kio.static.primitive import i32
    from kio.schema.types import TopicName
    import io

    request = DescribeQuorumRequest(topics=(TopicData(topic_name=TopicName("__cluster_metadata"),
                                                      partitions=(PartitionData(partition_index=i32(0)),)),))
    header = RequestHeader(request_api_key=request.__api_key__, request_api_version=request.__version__,
                           correlation_id=i32(1), client_id="faultline-db")
    buf = io.BytesIO()
    entity_writer(RequestHeader)(buf, header)
    entity_writer(DescribeQuorumRequest)(buf, request)
    frame = buf.getvalue()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(sock, 4))[0]
        body = _read(sock, size)
    schema = load_response_schema(int(request.__api_key__), int(request.__version__))
    _, used = entity_reader(schema.__header_schema__)(body, 0)
    response, _ = entity_reader(schema)(body, used)
    if response.error_code.value != 0:
        raise RuntimeError(f"DescribeQuorum answered {response.error_code.name}")
    partition = response.topics[0].partitions[0]
    if partition.error_code.value != 0:
        raise RuntimeError(f"DescribeQuorum answered {partition.error_code.name} for __cluster_metadata")
    return int(partition.leader_id)


def _read(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
