"""What one broker holds on disk: its identity, topics, partition logs,
producer id reservations and recovery points.

In: the broker's config (its data directory above all). Out: a `BrokerState`
that opens every partition log found there (recovering torn tails),
creates topics, hands out producer ids that no restart reuses, appends
produce batches under the idempotence rules, and flushes and checkpoints on
demand and at shutdown.

Files in the data directory, named as Kafka names them:
    meta.properties                     broker.id and cluster.id
    recovery-point-offset-checkpoint    per partition, the offset below which all is fsynced
    replication-offset-checkpoint       per partition, the high watermark last known (replicated mode)
    producer-id-block                   the first producer id not yet reserved
    <topic>-<partition>/partition.metadata  the topic's id
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from .config import BrokerConfig
from .log import PartitionLog
from .producer_state import Duplicate, ProducerStateError
from .records import (BatchHeader, CorruptBatch, check_batch, iter_headers, set_log_append_time, validate_records,
                      with_offsets)

log = logging.getLogger("faultline.broker.state")

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
HW_CHECKPOINT_FILE = "replication-offset-checkpoint"
PRODUCER_ID_FILE = "producer-id-block"
MAX_PARTITIONS_PER_TOPIC = 10_000


class BrokerError(Exception):
    """An error answered to the client with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionLog] = field(default_factory=dict)


@dataclass
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool


def check_topic(name: str, partitions: int) -> None:
    """Refuse an illegal topic name or partition count, as Kafka does."""
    if not TOPIC_NAME.match(name) or name in (".", ".."):
        raise BrokerError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} is not legal: use 1 to 249 of a-z A-Z 0-9 . _ -",
        )
    if partitions < 1:
        raise BrokerError(ErrorCode.invalid_partitions, f"{partitions} partitions: a topic has at least 1")
    if partitions > MAX_PARTITIONS_PER_TOPIC:
        # As Kafka's controller does: one request must not stall the broker for minutes.
        raise BrokerError(
            ErrorCode.policy_violation,
            f"{partitions} partitions: at most {MAX_PARTITIONS_PER_TOPIC} can be created at once",
        )


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BrokerState:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.node_id = config.node_id
        self.data_dir = config.data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.cluster_id = self._load_identity()
        self.topics: dict[str, Topic] = {}
        self._load_topics()
        self._next_producer_id, self._reserved_until = self._load_producer_ids()
        self._producer_id_lock = threading.Lock()

    # -- start-up --------------------------------------------------------------

    def _load_identity(self) -> str:
        path = self.data_dir / "meta.properties"
        if path.exists():
            props = dict(
                line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")
            )
            stored = int(props.get("broker.id", self.node_id))
            if stored != self.node_id:
                raise SystemExit(
                    f"{path} says this data directory belongs to broker {stored}, not {self.node_id}: "
                    f"start with --node-id {stored}, or give a different --data-dir"
                )
            return props.get("cluster.id", "faultline")
        cluster_id = uuid.uuid4().hex[:22]
        _write_atomically(path, f"version=0\nbroker.id={self.node_id}\ncluster.id={cluster_id}\n")
        return cluster_id

    def adopt_cluster_id(self, cluster_id: str) -> None:
        """Take the cluster's id from ZooKeeper; a data directory of another cluster is refused."""
        if cluster_id == self.cluster_id:
            return
        if self.topics:
            raise SystemExit(
                f"{self.data_dir / 'meta.properties'} belongs to cluster {self.cluster_id}, but ZooKeeper "
                f"holds cluster {cluster_id}: this data directory is from another cluster. Give an empty "
                f"--data-dir, or point zookeeper.connect at that cluster's ZooKeeper"
            )
        self.cluster_id = cluster_id
        _write_atomically(self.data_dir / "meta.properties",
                          f"version=0\nbroker.id={self.node_id}\ncluster.id={cluster_id}\n")

    def _read_checkpoint(self, name: str = CHECKPOINT_FILE) -> dict[tuple[str, int], int]:
        path = self.data_dir / name
        points: dict[tuple[str, int], int] = {}
        if not path.exists():
            return points
        lines = path.read_text().splitlines()
        for line in lines[2:]:
            parts = line.split()
            if len(parts) == 3:
                points[(parts[0], int(parts[1]))] = int(parts[2])
        return points

    def write_checkpoint(self) -> None:
        self._write_offsets(CHECKPOINT_FILE, lambda p: p.recovery_point)

    def write_hw_checkpoint(self) -> None:
        self._write_offsets(HW_CHECKPOINT_FILE, lambda p: p.high_watermark)

    def read_hw_checkpoint(self) -> dict[tuple[str, int], int]:
        return self._read_checkpoint(HW_CHECKPOINT_FILE)

    def _write_offsets(self, name: str, offset) -> None:
        rows = [f"{t.name} {i} {offset(p)}" for t in self.topics.values() for i, p in sorted(t.partitions.items())]
        _write_atomically(self.data_dir / name, "0\n%d\n%s" % (len(rows), "".join(r + "\n" for r in rows)))

    def _load_topics(self) -> None:
        points = self._read_checkpoint()
        found: dict[str, dict[int, Path]] = {}
        for entry in sorted(self.data_dir.iterdir()):
            if not entry.is_dir():
                continue
            name, sep, index = entry.name.rpartition("-")
            if not sep or not index.isdigit() or not TOPIC_NAME.match(name):
                continue
            found.setdefault(name, {})[int(index)] = entry
        replicated = self.config["zookeeper.connect"] is not None
        for name, dirs in found.items():
            count = max(dirs) + 1
            if sorted(dirs) != list(range(count)) and not replicated:
                log.warning("topic %s has partition directories %s; creating the missing ones", name, sorted(dirs))
            topic_id = None
            for d in dirs.values():
                meta = d / "partition.metadata"
                if meta.exists():
                    for line in meta.read_text().splitlines():
                        if line.startswith("topic_id:"):
                            topic_id = uuid.UUID(line.split(":", 1)[1].strip())
            topic = Topic(name, topic_id or uuid.uuid4())
            for i in (sorted(dirs) if replicated else range(count)):
                started = time.monotonic()
                plog = PartitionLog(self.data_dir / f"{name}-{i}", self.config, points.get((name, i), 0))
                topic.partitions[i] = plog
                log.info("loaded %s-%d: offsets %d..%d, %d bytes, %d producers, in %.0f ms",
                         name, i, plog.log_start_offset, plog.log_end_offset, plog.size,
                         len(plog.producers.producers), (time.monotonic() - started) * 1000)
            self.topics[name] = topic

    def _load_producer_ids(self) -> tuple[int, int]:
        path = self.data_dir / PRODUCER_ID_FILE
        stored = int(path.read_text().strip() or 0) if path.exists() else 0
        seen = max(
            (p.producers.max_producer_id() for t in self.topics.values() for p in t.partitions.values()),
            default=-1,
        )
        start = max(stored, seen + 1)
        return start, start

    # -- topics ----------------------------------------------------------------

    def create_topic(self, name: str, partitions: int) -> Topic:
        check_topic(name, partitions)
        if name in self.topics:
            raise BrokerError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        topic = Topic(name, uuid.uuid4())
        for i in range(partitions):
            topic.partitions[i] = self._new_partition_log(topic, i)
        self.topics[name] = topic
        self.write_checkpoint()
        log.info("created topic %s with %d partitions (id %s)", name, partitions, topic.topic_id)
        return topic

    def _new_partition_log(self, topic: Topic, index: int) -> PartitionLog:
        directory = self.data_dir / f"{topic.name}-{index}"
        plog = PartitionLog(directory, self.config)
        _write_atomically(directory / "partition.metadata", f"version: 0\ntopic_id: {topic.topic_id}\n")
        return plog

    def ensure_replica(self, name: str, index: int, topic_id: uuid.UUID) -> PartitionLog:
        """The local log of a partition this broker replicates, created empty if new."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(name, topic_id)
        plog = topic.partitions.get(index)
        if plog is None:
            plog = topic.partitions[index] = self._new_partition_log(topic, index)
            self.write_checkpoint()
            log.info("created the local replica of %s-%d", name, index)
        return plog

    def partition(self, topic: str, index: int) -> PartitionLog:
        t = self.topics.get(topic)
        plog = t.partitions.get(index) if t is not None else None
        if plog is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"{topic}-{index} does not exist here")
        return plog

    # -- producer ids ------------------------------------------------------------

    def allocate_producer_id(self, block_source=None) -> int:
        """The next producer id. Standalone, blocks are reserved in this data directory; in a
        cluster, `block_source(size) -> (start, end)` reserves one for the whole cluster (blocking)."""
        with self._producer_id_lock:
            if self._next_producer_id >= self._reserved_until:
                size = self.config["producer.id.block.size"]
                if block_source is not None:
                    self._next_producer_id, self._reserved_until = block_source(size)
                else:
                    self._reserved_until = self._next_producer_id + size
                    _write_atomically(self.data_dir / PRODUCER_ID_FILE, f"{self._reserved_until}\n")
            pid = self._next_producer_id
            self._next_producer_id += 1
            return pid

    # -- appends -------------------------------------------------------------------

    def append(self, plog: PartitionLog, records: bytes | None) -> AppendResult:
        """Validate a producer's batch and append it under the idempotence rules."""
        if not records:
            raise BrokerError(ErrorCode.invalid_record, "the produce request carries no record batch")
        if len(records) > self.config["message.max.bytes"]:
            raise BrokerError(
                ErrorCode.message_too_large,
                f"a batch of {len(records)} bytes exceeds message.max.bytes={self.config['message.max.bytes']}",
            )
        try:
            header = check_batch(records)
        except CorruptBatch as exc:
            raise BrokerError(ErrorCode.corrupt_message, str(exc)) from None
        if header.size != len(records):
            more = sum(1 for _ in iter_headers(records))
            raise BrokerError(
                ErrorCode.invalid_record,
                f"a produce request must carry exactly one record batch per partition, not {max(more, 2)}",
            )
        if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
            raise BrokerError(
                ErrorCode.invalid_record,
                f"inconsistent batch: {header.record_count} records but last offset delta "
                f"{header.last_offset_delta}",
            )
        try:
            validate_records(records)
        except CorruptBatch as exc:
            raise BrokerError(ErrorCode.corrupt_message, f"the batch's records do not decode: {exc}") from None
        if header.is_transactional or header.is_control:
            raise BrokerError(
                ErrorCode.invalid_record, "transactional and control batches are not accepted by this broker yet"
            )
        try:
            verdict = plog.producers.check(header)
        except ProducerStateError as exc:
            raise BrokerError(exc.code, str(exc)) from None
        if isinstance(verdict, Duplicate):
            return AppendResult(verdict.first_offset, verdict.last_offset, -1, True)
        base = plog.log_end_offset
        batch = with_offsets(records, base, plog.leader_epoch)
        append_time = -1
        if self.config["log.message.timestamp.type"] == "LogAppendTime":
            append_time = int(time.time() * 1000)
            set_log_append_time(batch, append_time)
        appended = BatchHeader._make((base,) + tuple(header[1:]))
        plog.append(batch, appended)
        if plog.hw_follows_leo:
            plog.high_watermark = plog.log_end_offset  # one replica: the leader is the whole ISR
        return AppendResult(base, appended.last_offset, append_time, False)

    # -- flushing -----------------------------------------------------------------

    def flush_due(self) -> int:
        now = time.monotonic()
        flushed = 0
        for t in self.topics.values():
            for p in t.partitions.values():
                if p.flush_due(now):
                    p.flush()
                    flushed += 1
        if flushed:
            self.write_checkpoint()
        return flushed

    def shutdown(self) -> None:
        for t in self.topics.values():
            for p in t.partitions.values():
                p.flush()
                p.close()
        self.write_checkpoint()
        if self.config["zookeeper.connect"] is not None:
            self.write_hw_checkpoint()
