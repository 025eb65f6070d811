"""One function per Kafka API: a decoded request in, a response dict out.

In: a `codec.Request` and the broker (`BrokerState` for the logs and the
`ReplicaManager` for who leads what, the ISR and the wake-up signal of long
polls). Out: the response as a dict in the newest version's field
names (codec fits it to the asked version), `None` when Kafka sends no
response (acks=0), or an awaitable of either for requests that wait
(Fetch long polls).

`SUPPORTED` is what ApiVersions advertises: for each API the versions both
kio's schemas and these handlers cover.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
from typing import Any, Awaitable, Callable

from kio.schema.errors import ErrorCode

from .codec import Request
from .replica_manager import ReplicaManager
from .state import BrokerError, BrokerState, check_topic

log = logging.getLogger("faultline.broker.handlers")

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS, INIT_PRODUCER_ID = 10, 18, 19, 22
OFFSET_FOR_LEADER_EPOCH = 23

SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 12),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 9),
    METADATA: (0, 12),
    FIND_COORDINATOR: (0, 6),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
    INIT_PRODUCER_ID: (0, 5),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
}

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


class Handlers:
    def __init__(self, state: BrokerState, replicas: ReplicaManager):
        self.state = state
        self.replicas = replicas
        self.table: dict[int, Callable[[Request], Any]] = {
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            METADATA: self.metadata,
            FIND_COORDINATOR: self.find_coordinator,
            API_VERSIONS: self.api_versions,
            CREATE_TOPICS: self.create_topics,
            INIT_PRODUCER_ID: self.init_producer_id,
            OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
        }

    def handle(self, request: Request) -> dict | None | Awaitable[dict | None]:
        return self.table[request.api_key](request)

    # -- ApiVersions --------------------------------------------------------------

    def api_versions_body(self, error: ErrorCode = ErrorCode.none) -> dict:
        return {
            "error_code": error,
            "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(SUPPORTED.items())
            ],
            "throttle_time": 0,
        }

    def api_versions(self, request: Request) -> dict:
        return self.api_versions_body()

    # -- Metadata -----------------------------------------------------------------

    def _brokers(self) -> list[dict]:
        snap = self.replicas.snapshot
        if snap is None:
            host, port = self.state.config.advertised
            return [{"node_id": self.state.node_id, "host": host, "port": port, "rack": None}]
        return [{"node_id": b.id, "host": b.host, "port": b.port, "rack": None}
                for b in sorted(snap.brokers.values(), key=lambda b: b.id)]

    def _known_topics(self) -> set[str]:
        if not self.replicas.replicated:
            return set(self.state.topics)
        snap = self.replicas.snapshot
        return set(snap.topics) if snap is not None else set()

    def _topic_entry(self, name: str) -> dict:
        snap = self.replicas.snapshot
        if not self.replicas.replicated:
            topic = self.state.topics[name]
            me = self.state.node_id
            parts = [(i, me, p.leader_epoch, (me,), (me,), ()) for i, p in sorted(topic.partitions.items())]
            topic_id = topic.topic_id
        else:
            info = snap.topics[name]
            topic_id = info.topic_id
            parts = []
            for i, replicas in sorted(info.assignment.items()):
                st = snap.states.get((name, i))
                offline = tuple(b for b in replicas if b not in snap.brokers)
                if st is None:
                    parts.append((i, -1, -1, replicas, (), offline))
                else:
                    parts.append((i, st.leader, st.leader_epoch, replicas, st.isr, offline))
        return {
            "error_code": ErrorCode.none,
            "name": name,
            "topic_id": topic_id,
            "is_internal": False,
            "partitions": [
                {
                    "error_code": ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
                    "partition_index": i,
                    "leader_id": leader,
                    "leader_epoch": epoch,
                    "replica_nodes": replicas,
                    "isr_nodes": isr,
                    "offline_replicas": offline,
                }
                for i, leader, epoch, replicas, isr, offline in parts
            ],
        }

    async def _create(self, name: str, partitions: int, replication_factor: int,
                      auto: bool = False) -> uuid.UUID:
        if replication_factor == -1:
            replication_factor = self.state.config["default.replication.factor"]
        if not self.replicas.replicated:
            if replication_factor != 1:
                raise BrokerError(
                    ErrorCode.invalid_replication_factor,
                    f"replication factor {replication_factor}: a standalone broker (no zookeeper.connect) "
                    f"holds one replica, so 1",
                )
            topic = self.state.create_topic(name, partitions)
            self.replicas.added_standalone(name)
            return topic.topic_id
        check_topic(name, partitions)
        topic_id = await asyncio.to_thread(self.replicas.create_topic, name, partitions, replication_factor, auto)
        # Answer once this broker's metadata shows the topic, so the client's next request finds it.
        deadline = time.monotonic() + 5
        while name not in self._known_topics() and time.monotonic() < deadline:
            await self.replicas.changed.wait(0.2)
        return uuid.UUID(topic_id)

    async def _auto_create(self, name: str) -> ErrorCode:
        """Create a topic on first use if the broker allows it; the error otherwise."""
        if not self.state.config["auto.create.topics.enable"]:
            return ErrorCode.unknown_topic_or_partition
        if self.replicas.replicated and self.replicas.snapshot is None:
            # Still joining the cluster: the topic may well exist; the client retries.
            return ErrorCode.leader_not_available
        try:
            await self._create(name, self.state.config["num.partitions"], -1, auto=True)
        except BrokerError as exc:
            if exc.code == ErrorCode.topic_already_exists:
                # Created meanwhile, and not yet in this broker's metadata: Kafka answers
                # LEADER_NOT_AVAILABLE, which clients retry (TOPIC_ALREADY_EXISTS they do not).
                return ErrorCode.leader_not_available
            return exc.code
        return ErrorCode.none

    async def metadata(self, request: Request) -> dict:
        body = request.body
        wanted = body.topics
        known = self._known_topics()
        if wanted is None or (request.version == 0 and not wanted):
            names = sorted(known)
        else:
            by_id = {t.topic_id: t.name for t in self.state.topics.values()}
            if self.replicas.snapshot is not None:
                by_id.update({uuid.UUID(t.topic_id): n for n, t in self.replicas.snapshot.topics.items()
                              if t.topic_id})
            names = [t.name if getattr(t, "name", None) is not None else by_id.get(getattr(t, "topic_id", None))
                     for t in wanted]
        allow_create = getattr(body, "allow_auto_topic_creation", True)
        topics = []
        for name in names:
            if name is None:
                topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None, "partitions": []})
                continue
            if name not in self._known_topics():
                code = await self._auto_create(name) if allow_create else ErrorCode.unknown_topic_or_partition
                if code != ErrorCode.none:
                    topics.append({"error_code": code, "name": name, "partitions": []})
                    continue
            topics.append(self._topic_entry(name))
        snap = self.replicas.snapshot
        if not self.replicas.replicated:
            controller = self.state.node_id
        else:
            controller = snap.controller if snap is not None and snap.controller is not None else -1
        return {
            "throttle_time": 0,
            "brokers": self._brokers(),
            "cluster_id": self.state.cluster_id,
            "controller_id": controller,
            "topics": topics,
        }

    # -- CreateTopics ---------------------------------------------------------------

    async def create_topics(self, request: Request) -> dict:
        results = []
        for t in request.body.topics:
            entry: dict[str, Any] = {"name": t.name, "error_message": None}
            try:
                if self.replicas.replicated and self.replicas.controller_epoch is None:
                    raise BrokerError(ErrorCode.not_controller, f"broker {self.state.node_id} is not the controller")
                if t.configs:
                    raise BrokerError(
                        ErrorCode.invalid_config,
                        "per-topic configs are not supported: " + ", ".join(c.name for c in t.configs),
                    )
                if t.assignments:
                    raise BrokerError(ErrorCode.invalid_request,
                                      "manual replica assignments are not supported: give a replication factor")
                partitions = t.num_partitions
                if partitions == -1:
                    partitions = self.state.config["num.partitions"]
                rf = t.replication_factor
                if rf == -1:
                    rf = self.state.config["default.replication.factor"]
                if request.body.validate_only:
                    if t.name in self._known_topics():
                        raise BrokerError(ErrorCode.topic_already_exists, f"topic {t.name!r} already exists")
                    check_topic(t.name, partitions)
                    entry.update(error_code=ErrorCode.none, num_partitions=partitions, replication_factor=rf)
                else:
                    topic_id = await self._create(t.name, partitions, rf)
                    entry.update(error_code=ErrorCode.none, topic_id=topic_id,
                                 num_partitions=partitions, replication_factor=rf, configs=[])
            except BrokerError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            results.append(entry)
        return {"throttle_time": 0, "topics": results}

    # -- Produce -------------------------------------------------------------------

    async def produce(self, request: Request) -> dict | None:
        body = request.body
        acks = body.acks
        deadline = time.monotonic() + max(body.timeout.total_seconds(), 0)
        responses = []
        waits = []
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                entry: dict[str, Any] = {"index": pd.index, "base_offset": -1, "log_start_offset": -1,
                                         "log_append_time": None, "record_errors": [], "error_message": None}
                try:
                    if acks not in (-1, 0, 1):
                        raise BrokerError(ErrorCode.invalid_required_acks, f"acks={acks}: use -1 (all), 0 or 1")
                    if topic.name not in self._known_topics():
                        code = await self._auto_create(topic.name)
                        if code != ErrorCode.none:
                            raise BrokerError(code, f"topic {topic.name!r} does not exist")
                    replica = self.replicas.leader_replica(topic.name, pd.index)
                    plog = replica.log
                    min_isr = replica.effective_min_isr(self.state.config["min.insync.replicas"])
                    if acks == -1 and len(replica.isr) < min_isr:
                        raise BrokerError(
                            ErrorCode.not_enough_replicas,
                            f"ISR {list(replica.isr)} has {len(replica.isr)} member(s) < min.insync.replicas={min_isr}",
                        )
                    result = self.state.append(plog, pd.records)
                    if not result.duplicate:
                        self.replicas.appended(replica)
                    entry.update(error_code=ErrorCode.none, base_offset=result.base_offset,
                                 log_start_offset=plog.log_start_offset)
                    if result.log_append_time >= 0:
                        entry["log_append_time"] = _datetime_ms(result.log_append_time)
                    if result.duplicate:
                        log.info("duplicate batch for %s-%d answered with its offset %d",
                                 topic.name, pd.index, result.base_offset)
                    if acks == -1:
                        waits.append((entry, replica, result.last_offset + 1, replica.leader_term))
                except BrokerError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                    log.info("produce to %s-%d refused: %s: %s", topic.name, pd.index, exc.code.name, exc)
                parts.append(entry)
            responses.append({"name": topic.name, "partition_responses": parts})
        for entry, replica, required, term in waits:
            code = await self.replicas.wait_replicated(replica, required, term, deadline)
            if code != ErrorCode.none:
                entry.update(error_code=code, error_message=f"offsets below {required} of {replica.name}: "
                             f"{code.name} (isr {list(replica.isr)}, high watermark {replica.log.high_watermark})")
                log.info("acks=all produce to %s ended with %s", replica.name, code.name)
        if acks == 0:
            return None
        return {"responses": responses, "throttle_time": 0}

    # -- Fetch ----------------------------------------------------------------------

    def _fetch_replica(self, topic: str, p, replica_id: int, version: int):
        """The replica a fetch reads, or the error Kafka answers (Partition.fetchRecords): a
        follower's fetch must come to the leader from a replica of the partition; a consumer's may
        be served by a follower from fetch v11 on (KIP-392), up to that follower's high watermark."""
        epoch = getattr(p, "current_leader_epoch", -1)
        if replica_id < 0 and version >= 11:
            replica = self.replicas.readable_replica(topic, p.partition, epoch)
        else:
            replica = self.replicas.leader_replica(topic, p.partition, epoch)
        if replica_id >= 0:
            self.replicas.check_follower(replica, replica_id, epoch)
        return replica

    def _fetch_once(self, body, max_bytes_left: int, replica_id: int, version: int,
                    followers_seen: list | None = None) -> tuple[list[dict], int]:
        """One read of every partition a fetch names. A follower's fetch that reads its partition
        (`followers_seen` given, the first read only) is then counted as that follower's progress,
        after the read, as Kafka does: the high watermark it is answered is the one from before."""
        responses = []
        total = 0
        first = True
        for topic in body.topics:
            parts = []
            for p in topic.partitions:
                entry: dict[str, Any] = {"partition_index": p.partition, "high_watermark": -1,
                                         "last_stable_offset": -1, "log_start_offset": -1,
                                         "aborted_transactions": None, "records": b""}
                try:
                    replica = self._fetch_replica(topic.topic, p, replica_id, version)
                except BrokerError as exc:
                    entry["error_code"] = exc.code
                    parts.append(entry)
                    continue
                plog = replica.log
                hw = plog.high_watermark
                entry.update(high_watermark=hw, last_stable_offset=hw, log_start_offset=plog.log_start_offset)
                if not plog.log_start_offset <= p.fetch_offset <= plog.log_end_offset:
                    # A consumer told this resets its position (auto.offset.reset): worth a line in the log.
                    # A follower told this is not counted as caught up (Kafka reads before it updates).
                    log.warning("%s: fetch at offset %d by %s is out of range (log %d..%d, high watermark %d, "
                                "epoch %d)", replica.name, p.fetch_offset,
                                f"broker {replica_id}" if replica_id >= 0 else "a consumer",
                                plog.log_start_offset, plog.log_end_offset, hw, replica.leader_epoch)
                    entry["error_code"] = ErrorCode.offset_out_of_range
                    parts.append(entry)
                    continue
                # Followers read up to the log end (that is how the high watermark moves); consumers below it.
                upper = plog.log_end_offset if replica_id >= 0 else hw
                limit = max(0, min(p.partition_max_bytes, max_bytes_left - total))
                data = plog.read(p.fetch_offset, limit, upper, min_one=first)
                if data:
                    first = False
                total += len(data)
                entry.update(error_code=ErrorCode.none, records=data)
                parts.append(entry)
                if followers_seen is not None:
                    followers_seen.append((replica, p.fetch_offset))
            responses.append({"topic": topic.topic, "partitions": parts})
        return responses, total

    async def fetch(self, request: Request) -> dict:
        body = request.body
        wait_s = max(body.max_wait.total_seconds(), 0.0)
        deadline = time.monotonic() + wait_s
        error = ErrorCode.none
        session_id, session_epoch = getattr(body, "session_id", 0), getattr(body, "session_epoch", -1)
        if session_epoch > 0 or (session_id != 0 and session_epoch != -1):
            # No fetch sessions are kept, so any incremental fetch names an unknown one.
            error = ErrorCode.fetch_session_id_not_found
            return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": []}
        replica_id = getattr(body, "replica_id", -1)
        seen: list | None = [] if replica_id >= 0 else None
        while True:
            responses, total = self._fetch_once(body, body.max_bytes, replica_id, request.version, seen)
            if seen:
                for replica, offset in seen:
                    self.replicas.follower_fetched(replica, replica_id, offset)
            seen = None
            remaining = deadline - time.monotonic()
            # As Kafka's delayed fetch, a partition error answers at once: waiting cannot fix it,
            # and a follower must learn of a leader change without sitting out its whole wait.
            errored = any(part.get("error_code") for t in responses for part in t["partitions"])
            if total >= body.min_bytes or remaining <= 0 or errored:
                return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": responses}
            await self.replicas.changed.wait(remaining)

    # -- ListOffsets ------------------------------------------------------------------

    def list_offsets(self, request: Request) -> dict:
        replica_id = request.body.replica_id
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                entry: dict[str, Any] = {"partition_index": p.partition_index, "timestamp": -1, "offset": -1,
                                         "leader_epoch": -1}
                try:
                    replica = self.replicas.leader_replica(topic.name, p.partition_index,
                                                           getattr(p, "current_leader_epoch", -1))
                    plog = replica.log
                    entry["error_code"] = ErrorCode.none
                    entry["leader_epoch"] = replica.leader_epoch
                    client = replica_id < 0
                    fetchable = plog.high_watermark if client else plog.log_end_offset
                    # KIP-207, as Kafka 3.9's fetchOffsetForTimestamp: a new leader whose high
                    # watermark has not yet reached the start of its epoch cannot say what is
                    # committed, so a client asking for the latest offset (or one beyond the
                    # high watermark) is told OFFSET_NOT_AVAILABLE and retries.
                    epoch_start = plog.epochs.start_of(replica.leader_epoch)
                    lagging = client and epoch_start is not None and epoch_start > plog.high_watermark
                    if p.timestamp == EARLIEST:
                        entry["offset"] = plog.log_start_offset
                    elif p.timestamp == LATEST:
                        if lagging:
                            raise _not_available(replica, epoch_start)
                        entry["offset"] = fetchable
                    elif p.timestamp < 0 and p.timestamp != MAX_TIMESTAMP:
                        raise BrokerError(ErrorCode.invalid_request, f"timestamp {p.timestamp} is not a known special value")
                    else:
                        found = (plog.max_timestamp() if p.timestamp == MAX_TIMESTAMP
                                 else plog.offset_for_timestamp(p.timestamp))
                        if found and found[0] < fetchable:
                            entry["offset"], entry["timestamp"] = found
                        elif lagging:
                            raise _not_available(replica, epoch_start)
                except BrokerError as exc:
                    entry["error_code"] = exc.code
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # -- OffsetForLeaderEpoch ----------------------------------------------------------

    def offset_for_leader_epoch(self, request: Request) -> dict:
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                entry: dict[str, Any] = {"partition": p.partition, "leader_epoch": -1, "end_offset": -1}
                try:
                    replica = self.replicas.leader_replica(topic.topic, p.partition, p.current_leader_epoch)
                    epoch, end = replica.log.epochs.end_offset_for(p.leader_epoch, replica.log.log_end_offset)
                    if end < 0:
                        # librdkafka resets a consumer by auto.offset.reset on this answer.
                        log.warning("%s: OffsetForLeaderEpoch for epoch %d: no epoch <= it is known here "
                                    "(epochs %s)", replica.name, p.leader_epoch, replica.log.epochs.entries)
                    entry.update(error_code=ErrorCode.none, leader_epoch=epoch, end_offset=end)
                except BrokerError as exc:
                    entry["error_code"] = exc.code
                parts.append(entry)
            topics.append({"topic": topic.topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # -- InitProducerId and FindCoordinator -----------------------------------------------

    async def init_producer_id(self, request: Request) -> dict:
        if request.body.transactional_id is not None:
            return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
                    "producer_id": -1, "producer_epoch": -1}
        if self.replicas.replicated:
            zk = self.replicas.zk
            pid = await asyncio.to_thread(self.state.allocate_producer_id,
                                          lambda size: zk.producer_id_block(self.state.node_id, size))
        else:
            pid = self.state.allocate_producer_id()
        log.info("producer id %d given to client %s", pid, request.client_id)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": 0}

    def find_coordinator(self, request: Request) -> dict:
        body = request.body
        host, port = self.state.config.advertised
        keys = list(getattr(body, "coordinator_keys", ()) or ())
        if not keys and getattr(body, "key", None) is not None:
            keys = [body.key]
        me = {"node_id": self.state.node_id, "host": host, "port": port,
              "error_code": ErrorCode.none, "error_message": None}
        return {"throttle_time": 0, **me, "coordinators": [{"key": k, **me} for k in keys]}


def _not_available(replica, epoch_start: int) -> BrokerError:
    return BrokerError(ErrorCode.offset_not_available,
                       f"{replica.name}: the high watermark {replica.log.high_watermark} has not reached the "
                       f"start {epoch_start} of leader epoch {replica.leader_epoch}")


def _datetime_ms(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
