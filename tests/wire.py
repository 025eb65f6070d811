"""A minimal Kafka wire client for tests: sends kio requests, reads responses.

In: a broker address and kio request payloads. Out: the decoded kio response
payloads. Real clients (librdkafka, kafka-python, aiokafka) are what the
tests use to show compatibility; this one exists to send exactly the bytes a
test wants (duplicates, gaps, malformed frames) and to read exact answers.
"""

from __future__ import annotations

import datetime
import socket
import struct

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch_req
from kio.schema.list_offsets.v7 import request as lo_req
from kio.schema.metadata.v12 import request as md_req
from kio.schema.offset_for_leader_epoch.v4 import request as ofle
from kio.schema.produce.v9 import request as pr_req
from kio.serial import entity_reader

from faultline.broker.codec import encode_request
from faultline.broker.records import decode_records, iter_headers


class WireClient:
    def __init__(self, host: str, port: int, timeout: float = 10.0, client_id: str = "faultline-test"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_raw(self, frame: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def encode(self, payload) -> tuple[int, bytes]:
        self.correlation_id += 1
        return self.correlation_id, encode_request(payload, self.correlation_id, self.client_id)

    def send(self, payload) -> int:
        correlation_id, frame = self.encode(payload)
        self.send_raw(frame)
        return correlation_id

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._read_exactly(4))
        return self._read_exactly(size)

    def receive(self, api_key: int, version: int, correlation_id: int):
        frame = self.read_frame()
        schema = load_response_schema(api_key, version)
        header_cls = schema.__header_schema__
        if api_key == 18:  # ApiVersions answers with header v0 whatever its version
            from kio.schema.response_header.v0.header import ResponseHeader as header_cls
        header, used = entity_reader(header_cls)(frame, 0)
        assert header.correlation_id == correlation_id, (header.correlation_id, correlation_id)
        body, _ = entity_reader(schema)(frame, used)
        return body

    def request(self, payload):
        correlation_id = self.send(payload)
        return self.receive(payload.__api_key__, payload.__version__, correlation_id)


# -- request helpers -------------------------------------------------------------------


def produce_req(topic: str, partition: int, batch: bytes, acks: int = -1, timeout_s: float = 5):
    return pr_req.ProduceRequest(
        acks=acks, timeout=datetime.timedelta(seconds=timeout_s),
        topic_data=(pr_req.TopicProduceData(name=topic, partition_data=(
            pr_req.PartitionProduceData(index=partition, records=batch),)),),
    )


def fetch(client: WireClient, topic: str, offset: int, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, partition=0,
          replica_id: int = -1, epoch: int = -1):
    """One fetch (v12) of one partition, by a consumer or, with `replica_id`, as that follower;
    `epoch` the leader epoch the fetcher knows (-1: none)."""
    req = fetch_req.FetchRequest(
        replica_id=replica_id, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=(fetch_req.FetchTopic(topic=topic, partitions=(
            fetch_req.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes,
                                     current_leader_epoch=epoch),)),),
        forgotten_topics_data=(),
    )
    return client.request(req).responses[0].partitions[0]


def offset_for_leader_epoch(client: WireClient, topic: str, epoch: int, partition: int = 0) -> tuple[str, int, int]:
    """(error name, epoch, end offset) a consumer is told for `epoch` of the partition."""
    resp = client.request(ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=(ofle.OffsetForLeaderTopic(
        topic=topic, partitions=(ofle.OffsetForLeaderPartition(partition=partition, leader_epoch=epoch),)),)))
    part = resp.topics[0].partitions[0]
    return part.error_code.name, part.leader_epoch, part.end_offset


LATEST, EARLIEST = -1, -2


def list_offset(client: WireClient, topic: str, timestamp: int = LATEST, partition: int = 0) -> tuple[ErrorCode, int]:
    """(error, offset) a read_uncommitted consumer is told for `timestamp` (LATEST, EARLIEST or a time)."""
    part = client.request(lo_req.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        lo_req.ListOffsetsTopic(name=topic, partitions=(
            lo_req.ListOffsetsPartition(partition_index=partition, timestamp=timestamp, current_leader_epoch=-1),)),))
                          ).topics[0].partitions[0]
    return part.error_code, part.offset


def partition_metadata(client: WireClient, topic: str, partition: int = 0):
    """What this broker's metadata says of one partition (leader, epoch, replicas, ISR)."""
    resp = client.request(md_req.MetadataRequest(
        topics=(md_req.MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=False,
        include_topic_authorized_operations=False))
    return next(p for p in resp.topics[0].partitions if p.partition_index == partition)


def part_response(resp):
    return resp.responses[0].partition_responses[0]


def values(records: bytes) -> list[bytes]:
    out = []
    for pos, _ in iter_headers(records):
        out += [r.value for r in decode_records(records, pos)]
    return out
