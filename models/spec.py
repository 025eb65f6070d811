"""The test spec: everything that defines one run, seed included.

In: command-line flags, or a TOML file with the same names (flags win), or a
stored `test.json`. Out: a `TestSpec` whose `to_json()` is what `test.json`
holds, so that `--seed` (or the stored spec) replays the same workload and
fault schedule.
"""

from __future__ import annotations

import dataclasses
import json
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PRODUCER = {
    "acks": "all",
    "enable.idempotence": "true",
    "message.timeout.ms": "5000",
    "request.timeout.ms": "3000",
}
DEFAULT_CONSUMER = {
    "auto.offset.reset": "earliest",
    "enable.auto.commit": "false",
    "isolation.level": "read_uncommitted",
    "check.crcs": "true",
}


@dataclass(frozen=True)
class WorkloadTraits:
    """What the model and the client defaults must know of a workload: how its consumers read
    (`consumer_mode`: assign or subscribe), whether its operations are broker transactions, and
    the client settings it starts from (under the user's --producer/--consumer)."""

    consumer_mode: str
    transactions: bool
    producer: dict = field(default_factory=dict)
    consumer: dict = field(default_factory=dict)
    summary: str = ""
    # Kafka coordinators the workload's clients need ("transaction", "group"); the reference
    # broker has none yet.
    coordinators: tuple = ()
    # When its consumer group's application commits offsets: "auto", "after" or "before" processing
    # (None: it commits none that processing depends on).
    commit: str | None = None


# The workloads `--workload` names (workloads.WORKLOADS builds each; the checker reads the traits
# from test.json's `workload`).
WORKLOADS = {
    "queue": WorkloadTraits("assign", False, summary="Jepsen's queue: sends, polls and assigns of random keys"),
    "txn": WorkloadTraits(
        "assign", True,
        # A transaction left open by a process that crashed holds read_committed readers back (the
        # last stable offset) until the coordinator aborts it: 6 s, not librdkafka's 60 s, so that
        # the final reads get past it. librdkafka needs message.timeout.ms <= this.
        producer={"transaction.timeout.ms": "6000"},
        consumer={"isolation.level": "read_committed"},
        coordinators=("transaction",),
        summary="Jepsen's transactional queue: each operation a transaction of 1-4 sends and polls "
                "(transactional.id per process, read_committed, a share aborted on purpose)"),
    "txn-subscribe": WorkloadTraits(
        "subscribe", True, producer={"transaction.timeout.ms": "6000"}, consumer={"isolation.level": "read_committed"},
        coordinators=("transaction", "group"),
        summary="txn with group membership (as subscribe): each transaction also commits the group's offsets of "
                "what it read (send_offsets_to_transaction)"),
    **{f"consume-{mode}": WorkloadTraits(
        "subscribe", False, coordinators=("group",), commit=mode,
        # A killed member's keys go to the others once its session expires: 6 s (the broker's least by
        # default), not librdkafka's 45 s. (The KIP-848 protocol refuses these; the client drops them.)
        consumer={"session.timeout.ms": "6000", "heartbeat.interval.ms": "2000",
                  **({"enable.auto.commit": "true", "auto.commit.interval.ms": "1000"} if mode == "auto" else {})},
        summary=f"consumers of one group that poll, process and commit as applications do, {how} (a member runs "
                f"in a process of its own: the kill-consumer nemesis SIGKILLs it)")
       for mode, how in (("auto", "with enable.auto.commit=true"), ("after", "committing after processing"),
                         ("before", "committing before processing"))},
    "resend": WorkloadTraits(
        "assign", False,
        summary="the queue, each producer in a process of its own (the kill-producer nemesis SIGKILLs it), and an "
                "application that sends again, from its next producer session, what it never learned the fate of"),
    "subscribe": WorkloadTraits(
        "subscribe", False, coordinators=("group",),
        summary="the queue with group membership: consumers of one group subscribe, commit after each poll, "
                "and leave and join as processes end, so rebalances happen (--consumer group.protocol=consumer "
                "for KIP-848, Kafka 4.x)"),
}


class SpecError(ValueError):
    """A spec value that cannot be used; the message says which and how to fix it."""


#: Where nodes run: `local`, a network namespace per node on this machine; `docker`, a container per node.
BACKENDS = ("local", "docker")


@dataclass
class TestSpec:
    __test__ = False  # not a pytest test class
    name: str = "queue"
    workload: str = "queue"
    broker: str = "reference"
    backend: str = "local"
    nodes: int = 1
    zookeeper_nodes: int | None = None
    time_limit: float = 30.0
    final_time_limit: float = 30.0
    rate: float = 100.0
    concurrency: int = 4
    seed: int | None = None
    topics: int = 1
    partitions: int = 3
    replication_factor: int | None = None
    max_sends_per_op: int = 3
    producer: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PRODUCER))
    consumer: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CONSUMER))
    broker_settings: dict[str, str] = field(default_factory=dict)
    nemesis: list[str] = field(default_factory=list)
    nemesis_interval: float = 10.0
    # Seconds each broker node's wall clock runs off by from its start (libfaketime), by node name.
    clock_offsets: dict[str, int] = field(default_factory=dict)
    # Apache Kafka (broker = "kafka"): the version resolved from Maven Central, KRaft or ZooKeeper
    # (3.x only), controller-only nodes (0: the first brokers are combined controller+broker
    # nodes), and feature levels given to Kafka's storage tool at format time (KRaft).
    kafka_version: str = "4.3.1"
    kafka_mode: str = "kraft"
    kafka_controllers: int = 0
    kafka_features: dict[str, str] = field(default_factory=dict)
    store: str = "store"
    spark_master: str = "local[2]"
    # The check's engine: Spark (local[2] or spark_master), or the same analysis in plain Python.
    engine: str = "spark"
    model: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def need(cond: bool, message: str) -> None:
            if not cond:
                raise SpecError(message)

        need(self.nodes >= 1, f"nodes={self.nodes}: a test needs at least 1 node")
        need(self.engine in ("spark", "python"), f"engine={self.engine!r}: the check runs on spark or python")
        need(self.time_limit > 0, f"time-limit={self.time_limit}: give a positive number of seconds")
        need(self.final_time_limit > 0, f"final-time-limit={self.final_time_limit}: give a positive number")
        need(self.rate > 0, f"rate={self.rate}: give a positive number of operations per second")
        need(self.concurrency >= 1, f"concurrency={self.concurrency}: at least 1 worker")
        need(self.topics >= 1 and self.partitions >= 1, "topics and partitions must be at least 1")
        need(self.max_sends_per_op >= 1, "max-sends-per-op must be at least 1")
        need(self.nemesis_interval > 0, "nemesis-interval must be a positive number of seconds")
        rf = self.effective_replication_factor
        need(1 <= rf <= self.nodes, f"replication-factor={rf} needs that many nodes; nodes={self.nodes}")
        self._validate_kafka(need)
        zk = self.effective_zookeeper_nodes
        need(zk >= 0, f"zookeeper-nodes={zk}: give 0 (a standalone broker) or more")
        if self.broker == "kafka" and self.kafka_mode == "zookeeper":
            need(zk >= 1, "kafka-mode=zookeeper with zookeeper-nodes=0: Kafka in ZooKeeper mode keeps its "
                          "metadata there, even as a single broker; give --zookeeper-nodes 1 or more, or "
                          "--kafka-mode kraft")
        elif self.broker != "kafka":
            need(zk >= 1 or self.nodes == 1,
                 f"nodes={self.nodes} with zookeeper-nodes=0: brokers form a cluster through ZooKeeper; "
                 f"give --zookeeper-nodes 1 or more")
        need(zk % 2 == 1 or zk == 0,
             f"zookeeper-nodes={zk}: an ensemble of an even size tolerates no more failures than one "
             f"member fewer and can split evenly; use an odd number (1, 3, 5)")
        need(self.workload in WORKLOADS, f"workload {self.workload!r} is unknown; choose one of {', '.join(WORKLOADS)}")
        needs = WORKLOADS[self.workload].coordinators if self.workload in WORKLOADS else ()
        need(self.broker == "kafka" or not needs,
             f"workload {self.workload} needs Kafka's {' and '.join(needs)} coordinator"
             f"{'s' if len(needs) > 1 else ''}, which the reference broker does not have yet; run it against Apache Kafka with --db kafka")
        need(self.backend in BACKENDS, f"backend {self.backend!r} is unknown; use one of {', '.join(BACKENDS)}")
        brokers = [f"n{i}" for i in range(1, self.nodes + 1)]
        for node, seconds in self.clock_offsets.items():
            need(node in brokers, f"clock offset for {node!r}: the broker nodes are {', '.join(brokers)}")
            need(isinstance(seconds, int) and not isinstance(seconds, bool),
                 f"clock offset for {node}: {seconds!r} is not a whole number of seconds (write {node}=-30)")

    def _validate_kafka(self, need) -> None:
        default = TestSpec.__dataclass_fields__
        if self.broker != "kafka":
            changed = [f"--{name.replace('_', '-')}" for name in ("kafka_version", "kafka_mode", "kafka_controllers")
                       if getattr(self, name) != default[name].default] + (["--kafka-feature"] if self.kafka_features
                                                                            else [])
            need(not changed, f"{', '.join(changed)} apply to Apache Kafka only; add --db kafka")
            return
        need(self.kafka_mode in ("kraft", "zookeeper"),
             f"kafka-mode={self.kafka_mode!r}: choose kraft or zookeeper")
        major = self.kafka_version.split(".")[0]
        need(major.isdigit(), f"kafka-version={self.kafka_version!r}: give a version such as 4.3.1 or 3.9.1")
        need(self.kafka_mode == "kraft" or int(major) < 4,
             f"kafka-mode=zookeeper: Kafka {self.kafka_version} has no ZooKeeper mode (3.9 is the last "
             f"with it); use --kafka-version 3.9.1 or KRaft")
        need(isinstance(self.kafka_controllers, int) and self.kafka_controllers >= 0,
             f"kafka-controllers={self.kafka_controllers!r}: give 0 (combined nodes) or more")
        need(self.kafka_mode == "kraft" or (self.kafka_controllers == 0 and not self.kafka_features),
             "--kafka-controllers and --kafka-feature are KRaft's; drop them, or --kafka-mode zookeeper")
        need(self.kafka_mode == "zookeeper" or not self.zookeeper_nodes,
             f"zookeeper-nodes={self.zookeeper_nodes}: Kafka in KRaft mode runs no ZooKeeper; "
             f"give --kafka-mode zookeeper (Kafka 3.x) to run it on ZooKeeper")
        for name, level in self.kafka_features.items():
            need(str(level).isdigit(), f"--kafka-feature {name}={level}: a feature level is a whole number")

    @property
    def effective_replication_factor(self) -> int:
        return self.replication_factor if self.replication_factor is not None else min(3, self.nodes)

    @property
    def effective_zookeeper_nodes(self) -> int:
        """ZooKeeper servers: by default one for a cluster and for Kafka in ZooKeeper mode (which
        cannot start without it, even alone), none for a single standalone reference broker."""
        if self.zookeeper_nodes is not None:
            return self.zookeeper_nodes
        if self.broker == "kafka":
            return 0 if self.kafka_mode == "kraft" else 1  # KRaft keeps the metadata in its own quorum
        return 0 if self.nodes == 1 else 1

    def with_seed(self) -> "TestSpec":
        """A copy whose seed is fixed (drawn now if none was given)."""
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**31)
        return dataclasses.replace(self, seed=seed)

    @property
    def keys(self) -> list[str]:
        return [f"{topic}/{p}" for topic in self.topic_names for p in range(self.partitions)]

    @property
    def topic_names(self) -> list[str]:
        return [f"faultline-{i}" for i in range(self.topics)]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TestSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown spec field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)


def spec_from_fields(fields: dict[str, Any]) -> TestSpec:
    """A spec from fields as a TOML file gives them (`faultline run --config`, a claim's sides):
    the given client settings over the workload's and the defaults', the workload's name as the
    test's unless one is given; a SpecError for an unknown workload or field."""
    fields = dict(fields)
    workload = fields.setdefault("workload", "queue")
    if workload not in WORKLOADS:
        raise SpecError(f"workload {workload!r} is unknown; choose one of {', '.join(WORKLOADS)}")
    fields.setdefault("name", workload)
    traits = WORKLOADS[workload]
    strings = lambda name: {k: str(v) for k, v in (fields.pop(name, None) or {}).items()}  # noqa: E731
    producer = {**DEFAULT_PRODUCER, **traits.producer, **strings("producer")}
    consumer = {**DEFAULT_CONSUMER, **traits.consumer, **strings("consumer")}
    return TestSpec.from_json({**fields, "producer": producer, "consumer": consumer,
                               "broker_settings": strings("broker_settings")})


def load_toml(path: str | Path) -> dict[str, Any]:
    """Spec fields from a TOML file; dashes in names are accepted for underscores."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    return {k.replace("-", "_"): v for k, v in data.items()}


def load_stored(store_dir: str | Path) -> TestSpec:
    path = Path(store_dir) / "test.json"
    try:
        return TestSpec.from_json(json.loads(path.read_text()))
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None


def parse_settings(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r}: expected key=value, for example {flag} acks=1")
        out[key.strip()] = value.strip()
    return out
