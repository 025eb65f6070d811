"""The db interface: the system under test on a set of nodes (Jepsen's `jepsen.db`).

A `DB` is built on `Remote`s (one per node) and knows how to set the system
up and tear it down (logs collected into the run's store folder), start,
stop, kill, pause and resume it on one node, wait until a node serves, and
say which node leads a partition and which is the controller. Nemeses and
the runner talk to this interface only, never to a concrete db.

Its nodes are `nodes` (the brokers: targets of process faults) and
`support_nodes` (a coordination service such as ZooKeeper: targets of
network faults only). Capabilities some nemeses need (power loss, wall-clock
skew, reading a stopped replica's log from its disk) are methods that a db
without them answers with `Unsupported`.

`create_topics` is shared by every Kafka-protocol db: the admin client makes
the test's topics and waits until each partition has a leader.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from pathlib import Path

from ..control.wait import wait_until


class ExitedWhileStarting(RuntimeError):
    """A node's program exited before it served: a setting it refused, a missing file, a port taken.
    Says which program on which node, and the end of its log (`last_line`: its last line)."""

    def __init__(self, what: str, node: str, log_path: Path):
        try:
            tail = log_path.read_text(errors="replace")[-1500:]
        except OSError:
            tail = ""
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        self.node, self.log_path = node, log_path
        self.last_line = lines[-1] if lines else "(its log is empty)"
        super().__init__(f"{what} on {node} exited while starting; {log_path} ends:\n{tail or '(nothing)'}")


#: What a readiness probe returns once the program it waits for has exited (see `wait_serving`).
EXITED = "exited"


def wait_serving(probe, timeout: float, message: str, what: str, node: str, log_path: Path) -> None:
    """`wait_until(probe)`, except that a probe returning `EXITED` ends the wait at once with
    `ExitedWhileStarting` (wait_until takes exceptions for "not yet", so an exit is returned)."""
    if wait_until(probe, timeout, message) == EXITED:
        raise ExitedWhileStarting(what, node, log_path)


class Unsupported(Exception):
    """The db cannot perform a fault a nemesis asked for; the message says which and why."""


class DB(ABC):
    nodes: list[str]
    support_nodes: list[str]

    @property
    @abstractmethod
    def bootstrap(self) -> str:
        """`host:port,...` that clients connect to."""

    @abstractmethod
    def setup(self) -> None:
        """Start the system on every node and wait until it serves."""

    @abstractmethod
    def teardown(self, store_dir: Path) -> None:
        """Stop everything cleanly and copy each node's logs into `store_dir/nodes/<node>/`."""

    @abstractmethod
    def start(self, node: str) -> int:
        """Start the system on `node`; its pid."""

    @abstractmethod
    def wait_ready(self, node: str, timeout: float = 30) -> None:
        """Return once `node` serves clients; raise with its log's end if it exited."""

    @abstractmethod
    def kill(self, node: str) -> int | None:
        """SIGKILL the system on `node`; the pid it had (None: not running)."""

    @abstractmethod
    def stop(self, node: str) -> int | None:
        """Stop it cleanly (SIGTERM, a controlled shutdown); its exit status."""

    @abstractmethod
    def pause(self, node: str) -> None: ...

    @abstractmethod
    def resume(self, node: str) -> None: ...

    @abstractmethod
    def running(self, node: str) -> bool: ...

    @abstractmethod
    def leader(self, topic: str, partition: int) -> str | None:
        """The node that leads the partition now (None: nobody does)."""

    @abstractmethod
    def controller(self) -> str | None:
        """The node that is the cluster's controller now."""

    def in_sync_replicas(self, topic: str, partition: int) -> list[str]:
        """The nodes in the partition's in-sync replica set now, as the cluster's metadata says."""
        raise Unsupported(f"{type(self).__name__} cannot say which replicas are in sync")

    def power_off(self, node: str) -> dict:
        """Cut the node's power: what it wrote but did not fsync is lost. What was done."""
        raise Unsupported(f"{type(self).__name__} cannot cut the power of a node")

    def power_on(self, node: str) -> int:
        raise Unsupported(f"{type(self).__name__} cannot cut the power of a node")

    def clock_file(self, node: str) -> Path:
        """The file holding the node's wall-clock offset (read through libfaketime)."""
        raise Unsupported(f"{type(self).__name__} cannot skew the clocks of its nodes")

    def start_offset(self, node: str) -> int:
        """Seconds the node's wall clock started off by: where clock faults heal to."""
        return 0

    def log_end_offset(self, node: str, topic: str, partition: int) -> int | None:
        """The end offset of the partition's log as `node`'s disk holds it while its broker is down
        (what the broker will recover; None: no log of it there)."""
        raise Unsupported(f"{type(self).__name__} cannot read a replica's log from its disk")

    def create_topics(self, topics: list[str], partitions: int, replication_factor: int) -> None:
        create_topics(topics, partitions, replication_factor, self.bootstrap)


def create_topics(topics: list[str], partitions: int, replication_factor: int, bootstrap: str) -> None:
    """Create the topics through the admin client and wait until every partition has a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def created() -> bool:
        futures = admin.create_topics([NewTopic(t, partitions, replication_factor) for t in topics],
                                      operation_timeout=10)
        for topic, fut in futures.items():
            try:
                fut.result(15)
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        return True

    wait_until(created, 60, f"could not create the topics {topics} on {bootstrap}")

    def led() -> bool:
        md = admin.list_topics(timeout=10)
        return all(t in md.topics and len(md.topics[t].partitions) == partitions
                   and all(p.leader >= 0 for p in md.topics[t].partitions.values()) for t in topics)

    wait_until(led, 60, f"the partitions of {topics} did not all get a leader on {bootstrap}")


# Kafka's record batch (message format v2): baseOffset, batchLength, partitionLeaderEpoch, magic,
# crc, attributes, lastOffsetDelta; the CRC covers attributes to the batch's end. The reference
# broker's `broker.records` parses the same header, but the harness imports nothing of the broker
# (docs/design.md), and Kafka's files are read here too; a property test holds this reader to the
# broker's recovery.
_BATCH_PREFIX = struct.Struct(">qiibIhi")
_LOG_OVERHEAD = 12
_CRC_START = 21
_MIN_BATCH_LENGTH = 49


def log_end_on_disk(partition_dir: Path) -> int | None:
    """The end offset of the log in `partition_dir` (Kafka's layout: `<20-digit base offset>.log`
    segments of record batches), as recovery would leave it: the offset after the last batch that
    is whole, passes its CRC and starts where the one before it ended. None when the folder holds
    no log.

    Both the reference broker and Apache Kafka lay partitions out this way. A batch torn by a kill
    ends the scan, as it ends recovery; recovery-point checkpoints are not consulted, because every
    batch is checked here."""
    from crc32c import crc32c

    segments = sorted(p for p in partition_dir.glob("*.log") if p.stem.isdigit() and len(p.stem) == 20)
    if not segments:
        return None
    end = None
    for segment in segments:
        data = segment.read_bytes()
        end = max(end or 0, int(segment.stem))
        pos = 0
        while len(data) - pos >= _BATCH_PREFIX.size:
            base, length, _epoch, magic, crc, _attributes, last_delta = _BATCH_PREFIX.unpack_from(data, pos)
            stop = pos + _LOG_OVERHEAD + length
            # The base offset lies outside the CRC: one that does not follow on is damage too.
            if base != end or magic != 2 or length < _MIN_BATCH_LENGTH or stop > len(data) or last_delta < 0:
                break
            if crc32c(data[pos + _CRC_START:stop]) != crc:
                break
            end, pos = base + last_delta + 1, stop
        if pos < len(data):
            break  # a torn or corrupt batch: recovery truncates the log here, later segments with it
    return end
