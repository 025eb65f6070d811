"""One function per Kafka API: a decoded request in, a response dict out.

In: a `codec.Request` and the broker (`BrokerState` plus the wake-up signal
for long polls). Out: the response as a dict in the newest version's field
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
from typing import Any, Awaitable, Callable

from kio.schema.errors import ErrorCode

from .codec import Request
from .state import BrokerError, BrokerState

log = logging.getLogger("faultline.broker.handlers")

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS, INIT_PRODUCER_ID = 10, 18, 19, 22

SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 12),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 9),
    METADATA: (0, 12),
    FIND_COORDINATOR: (0, 6),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
    INIT_PRODUCER_ID: (0, 5),
}

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


class AppendSignal:
    """Wakes long-polling fetches when a partition's high watermark moves."""

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
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiters.discard(fut)


class Handlers:
    def __init__(self, state: BrokerState):
        self.state = state
        self.appended = AppendSignal()
        self.table: dict[int, Callable[[Request], Any]] = {
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            METADATA: self.metadata,
            FIND_COORDINATOR: self.find_coordinator,
            API_VERSIONS: self.api_versions,
            CREATE_TOPICS: self.create_topics,
            INIT_PRODUCER_ID: self.init_producer_id,
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

    def _broker_entry(self) -> dict:
        host, port = self.state.config.advertised
        return {"node_id": self.state.node_id, "host": host, "port": port, "rack": None}

    def _topic_entry(self, name: str) -> dict:
        topic = self.state.topics[name]
        me = self.state.node_id
        return {
            "error_code": ErrorCode.none,
            "name": name,
            "topic_id": topic.topic_id,
            "is_internal": False,
            "partitions": [
                {
                    "error_code": ErrorCode.none,
                    "partition_index": i,
                    "leader_id": me,
                    "leader_epoch": p.leader_epoch,
                    "replica_nodes": (me,),
                    "isr_nodes": (me,),
                    "offline_replicas": (),
                }
                for i, p in enumerate(topic.partitions)
            ],
        }

    def _auto_create(self, name: str) -> ErrorCode:
        """Create a topic on first use if the broker allows it; the error otherwise."""
        if not self.state.config["auto.create.topics.enable"]:
            return ErrorCode.unknown_topic_or_partition
        try:
            self.state.create_topic(name, self.state.config["num.partitions"])
        except BrokerError as exc:
            return exc.code
        return ErrorCode.none

    def metadata(self, request: Request) -> dict:
        body = request.body
        wanted = body.topics
        if wanted is None or (request.version == 0 and not wanted):
            names = sorted(self.state.topics)
        else:
            by_id = {t.topic_id: t.name for t in self.state.topics.values()}
            names = [t.name if getattr(t, "name", None) is not None else by_id.get(getattr(t, "topic_id", None))
                     for t in wanted]
        allow_create = getattr(body, "allow_auto_topic_creation", True)
        topics = []
        for name in names:
            if name is None:
                topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None, "partitions": []})
                continue
            if name not in self.state.topics:
                code = self._auto_create(name) if allow_create else ErrorCode.unknown_topic_or_partition
                if code != ErrorCode.none:
                    topics.append({"error_code": code, "name": name, "partitions": []})
                    continue
            topics.append(self._topic_entry(name))
        return {
            "throttle_time": 0,
            "brokers": [self._broker_entry()],
            "cluster_id": self.state.cluster_id,
            "controller_id": self.state.node_id,
            "topics": topics,
        }

    # -- CreateTopics ---------------------------------------------------------------

    def create_topics(self, request: Request) -> dict:
        results = []
        for t in request.body.topics:
            entry: dict[str, Any] = {"name": t.name, "error_message": None}
            try:
                if t.replication_factor not in (-1, 1):
                    raise BrokerError(
                        ErrorCode.invalid_replication_factor,
                        f"replication factor {t.replication_factor}: this broker runs one node, so 1",
                    )
                if t.configs:
                    raise BrokerError(
                        ErrorCode.invalid_config,
                        "per-topic configs are not supported: " + ", ".join(c.name for c in t.configs),
                    )
                partitions = t.num_partitions
                if t.assignments:
                    partitions = len(t.assignments)
                elif partitions == -1:
                    partitions = self.state.config["num.partitions"]
                if request.body.validate_only:
                    if t.name in self.state.topics:
                        raise BrokerError(ErrorCode.topic_already_exists, f"topic {t.name!r} already exists")
                    entry.update(error_code=ErrorCode.none, num_partitions=partitions, replication_factor=1)
                else:
                    topic = self.state.create_topic(t.name, partitions)
                    entry.update(error_code=ErrorCode.none, topic_id=topic.topic_id,
                                 num_partitions=partitions, replication_factor=1, configs=[])
            except BrokerError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            results.append(entry)
        return {"throttle_time": 0, "topics": results}

    # -- Produce -------------------------------------------------------------------

    def produce(self, request: Request) -> dict | None:
        body = request.body
        acks = body.acks
        responses = []
        appended = False
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                entry: dict[str, Any] = {"index": pd.index, "base_offset": -1, "log_start_offset": -1,
                                         "log_append_time": None, "record_errors": [], "error_message": None}
                try:
                    if acks not in (-1, 0, 1):
                        raise BrokerError(ErrorCode.invalid_required_acks, f"acks={acks}: use -1 (all), 0 or 1")
                    if topic.name not in self.state.topics:
                        code = self._auto_create(topic.name)
                        if code != ErrorCode.none:
                            raise BrokerError(code, f"topic {topic.name!r} does not exist")
                    plog = self.state.partition(topic.name, pd.index)
                    in_sync = 1
                    if acks == -1 and in_sync < self.state.config["min.insync.replicas"]:
                        raise BrokerError(
                            ErrorCode.not_enough_replicas,
                            f"{in_sync} in-sync replica(s) < min.insync.replicas="
                            f"{self.state.config['min.insync.replicas']}",
                        )
                    result = self.state.append(plog, pd.records)
                    appended = appended or not result.duplicate
                    entry.update(error_code=ErrorCode.none, base_offset=result.base_offset,
                                 log_start_offset=plog.log_start_offset)
                    if result.log_append_time >= 0:
                        entry["log_append_time"] = _datetime_ms(result.log_append_time)
                    if result.duplicate:
                        log.info("duplicate batch for %s-%d answered with its offset %d",
                                 topic.name, pd.index, result.base_offset)
                except BrokerError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
                    log.info("produce to %s-%d refused: %s: %s", topic.name, pd.index, exc.code.name, exc)
                parts.append(entry)
            responses.append({"name": topic.name, "partition_responses": parts})
        if appended:
            self.appended.notify()
        if acks == 0:
            return None
        return {"responses": responses, "throttle_time": 0}

    # -- Fetch ----------------------------------------------------------------------

    def _fetch_once(self, body, max_bytes_left: int) -> tuple[list[dict], int]:
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
                    plog = self.state.partition(topic.topic, p.partition)
                except BrokerError as exc:
                    entry["error_code"] = exc.code
                    parts.append(entry)
                    continue
                hw = plog.high_watermark
                entry.update(high_watermark=hw, last_stable_offset=hw, log_start_offset=plog.log_start_offset)
                if not plog.log_start_offset <= p.fetch_offset <= plog.log_end_offset:
                    entry["error_code"] = ErrorCode.offset_out_of_range
                    parts.append(entry)
                    continue
                limit = max(0, min(p.partition_max_bytes, max_bytes_left - total))
                data = plog.read(p.fetch_offset, limit, hw, min_one=first)
                if data:
                    first = False
                total += len(data)
                entry.update(error_code=ErrorCode.none, records=data)
                parts.append(entry)
            responses.append({"topic": topic.topic, "partitions": parts})
        return responses, total

    async def fetch(self, request: Request) -> dict:
        body = request.body
        wait_s = max(body.max_wait.total_seconds(), 0.0)
        deadline = time.monotonic() + wait_s
        error = ErrorCode.none
        if body.session_epoch > 0 or (body.session_id != 0 and body.session_epoch != -1):
            # No fetch sessions are kept, so any incremental fetch names an unknown one.
            error = ErrorCode.fetch_session_id_not_found
            return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": []}
        while True:
            responses, total = self._fetch_once(body, body.max_bytes)
            remaining = deadline - time.monotonic()
            if total >= body.min_bytes or remaining <= 0:
                return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": responses}
            await self.appended.wait(remaining)

    # -- ListOffsets ------------------------------------------------------------------

    def list_offsets(self, request: Request) -> dict:
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                entry: dict[str, Any] = {"partition_index": p.partition_index, "timestamp": -1, "offset": -1,
                                         "leader_epoch": -1}
                try:
                    plog = self.state.partition(topic.name, p.partition_index)
                    entry["error_code"] = ErrorCode.none
                    entry["leader_epoch"] = plog.leader_epoch
                    if p.timestamp == EARLIEST:
                        entry["offset"] = plog.log_start_offset
                    elif p.timestamp == LATEST:
                        entry["offset"] = plog.high_watermark
                    elif p.timestamp == MAX_TIMESTAMP:
                        found = plog.max_timestamp()
                        if found:
                            entry["offset"], entry["timestamp"] = found
                    elif p.timestamp < 0:
                        raise BrokerError(ErrorCode.invalid_request, f"timestamp {p.timestamp} is not a known special value")
                    else:
                        found = plog.offset_for_timestamp(p.timestamp)
                        if found:
                            entry["offset"], entry["timestamp"] = found
                except BrokerError as exc:
                    entry["error_code"] = exc.code
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # -- InitProducerId and FindCoordinator -----------------------------------------------

    def init_producer_id(self, request: Request) -> dict:
        if request.body.transactional_id is not None:
            return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
                    "producer_id": -1, "producer_epoch": -1}
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


def _datetime_ms(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
