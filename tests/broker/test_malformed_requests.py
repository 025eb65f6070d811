"""Malformed, truncated, oversized and unsupported requests never take the broker down.

Every frame goes to one broker shared by the whole module, on a fresh
connection, and must get the protocol's answer or a closed connection. After
each one, a monitor connection opened before any of them must still get
correct ApiVersions and Metadata answers, the broker process must be alive
and its log must hold no traceback (the broker logs internal errors with
one). At the end real clients must still produce and consume.

What each frame deserves is worked out with the broker's own request parser
(`decode_request`): a frame it cannot parse, or with an unsupported version,
must close the connection (ApiVersions excepted: it is answered in v0 with
UNSUPPORTED_VERSION); one it parses must be answered with a response that
kio reads back whole.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import operator
import os
import pickle
import socket
import struct
import subprocess
import time
import traceback
from typing import NamedTuple

import pytest
from crc32c import crc32c
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.schema.api_versions.v0 import request as av0
from kio.schema.api_versions.v3 import request as av3
from kio.schema.create_topics.v7 import request as ct7
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fe12
from kio.schema.init_producer_id.v4 import request as ip4
from kio.schema.list_offsets.v7 import request as lo7
from kio.schema.metadata.v4 import request as md4
from kio.schema.metadata.v12 import request as md12
from kio.schema.produce.v9 import request as pr9
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader

from faultline.broker.codec import ProtocolError, UnsupportedVersion, decode_request
from faultline.broker.handlers import API_VERSIONS, CREATE_TOPICS, FETCH, METADATA, PRODUCE, SUPPORTED
from faultline.broker.records import (COMPRESSION_MASK, CRC_START, HEADER_SIZE, decode_records, encode_batch,
                                      iter_headers)
from tests.conftest import BrokerProcess
from tests.wire import WireClient

MAX_REQUEST = 1 << 20  # socket.request.max.bytes of the shared broker
READ_TIMEOUT = 5.0
# A Fetch that may long-poll is given this long to answer; silence after it is legitimate.
LONG_POLL_GRACE = 0.5
INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)

FUZZ = settings(max_examples=200, deadline=None)

_fresh_names = itertools.count()


def fresh_topic(prefix: str) -> str:
    return f"{prefix}-{next(_fresh_names)}"


# --- requests ----------------------------------------------------------------------------


def produce_req(topic: str, partition: int, batch: bytes, acks: int = -1):
    return pr9.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
        topic_data=(pr9.TopicProduceData(name=topic, partition_data=(
            pr9.PartitionProduceData(index=partition, records=batch),)),),
    )


def fetch_req(topic: str, partitions: list[tuple[int, int]], partition_max_bytes: list[int] | None = None):
    limits = partition_max_bytes or [1 << 16] * len(partitions)
    return fe12.FetchRequest(
        max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20,
        topics=(fe12.FetchTopic(topic=topic, partitions=tuple(
            fe12.FetchPartition(partition=p, fetch_offset=offset, partition_max_bytes=limit)
            for (p, offset), limit in zip(partitions, limits))),),
        forgotten_topics_data=(),
    )


def list_offsets_req(topic: str, timestamp: int):
    return lo7.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        lo7.ListOffsetsTopic(name=topic, partitions=(lo7.ListOffsetsPartition(partition_index=0,
                                                                              timestamp=timestamp),)),))


def create_topics_req(*topics: tuple[str, int]):
    return ct7.CreateTopicsRequest(
        topics=tuple(ct7.CreatableTopic(name=name, num_partitions=n, replication_factor=1, assignments=(),
                                        configs=()) for name, n in topics),
        timeout=datetime.timedelta(seconds=5),
    )


def api_versions_req():
    return av3.ApiVersionsRequest(client_software_name="faultline-test", client_software_version="1.0")


def part_response(produce_response):
    return produce_response.responses[0].partition_responses[0]


class FrameEncoder(WireClient):
    """WireClient's request encoding, without a connection."""

    def __init__(self) -> None:
        self.client_id = "fuzz"
        self.correlation_id = 0


def frame_of(payload, correlation_id: int) -> bytes:
    """A request frame (header and body, no size prefix), as WireClient sends it."""
    encoder = FrameEncoder()
    encoder.correlation_id = correlation_id - 1  # encode() takes the next one
    return encoder.encode(payload)[1]


def sized(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def with_crc(batch: bytes | bytearray) -> bytes:
    out = bytearray(batch)
    if len(out) >= CRC_START:
        struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


# Valid requests that the mutation tests start from. The topic "seed" exists with data.
SEED_REQUESTS = {
    "api_versions_v0": av0.ApiVersionsRequest(),
    "api_versions_v3": api_versions_req(),
    "metadata_v4": md4.MetadataRequest(topics=(md4.MetadataRequestTopic(name="seed"),),
                                       allow_auto_topic_creation=False),
    "metadata_v12": md12.MetadataRequest(topics=(md12.MetadataRequestTopic(topic_id=None, name="seed"),),
                                         allow_auto_topic_creation=True, include_topic_authorized_operations=False),
    "produce_v9": produce_req("seed", 0, encode_batch([(b"key", b"value"), (None, b"second")], timestamp=5000)),
    "fetch_v12": fetch_req("seed", [(0, 0), (1, 1)]),
    "list_offsets_v7": lo7.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        lo7.ListOffsetsTopic(name="seed", partitions=(
            lo7.ListOffsetsPartition(partition_index=0, timestamp=-1),
            lo7.ListOffsetsPartition(partition_index=1, timestamp=1500))),)),
    "create_topics_v7": create_topics_req(("fuzz-created", 1)),
    "init_producer_id_v4": ip4.InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(0)),
}
SEEDS = {name: frame_of(payload, i) for i, (name, payload) in enumerate(SEED_REQUESTS.items(), start=1)}


# --- the shared broker and its monitor connection ----------------------------------------


class Monitor:
    """A connection opened before any malformed frame and kept for the whole module."""

    def __init__(self, broker: BrokerProcess):
        self.broker = broker
        self.client = WireClient("127.0.0.1", broker.port, timeout=READ_TIMEOUT)

    def reconnect(self) -> None:
        self.client.close()
        self.client = WireClient("127.0.0.1", self.broker.port, timeout=READ_TIMEOUT)

    def check(self) -> None:
        versions = self.client.request(api_versions_req())
        assert versions.error_code == ErrorCode.none
        assert {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys} == SUPPORTED
        md = self.client.request(md12.MetadataRequest(
            topics=(md12.MetadataRequestTopic(topic_id=None, name="canary"),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert [(b.node_id, b.port) for b in md.brokers] == [(1, self.broker.port)]
        assert [(t.name, t.error_code, len(t.partitions)) for t in md.topics] == [("canary", ErrorCode.none, 1)]


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("malformed") / "data",
                           {"socket.request.max.bytes": MAX_REQUEST})
    try:
        broker.start()
        yield broker
    finally:
        broker.kill()


@pytest.fixture(scope="module")
def monitor(shared_broker):
    monitor = Monitor(shared_broker)
    created = monitor.client.request(create_topics_req(("canary", 1), ("seed", 2)))
    assert [t.error_code for t in created.topics] == [ErrorCode.none, ErrorCode.none]
    for partition in (0, 1):
        for i in range(3):
            batch = encode_batch([(b"k", b"seed-%d-%d" % (partition, i))], timestamp=1000 * (i + 1))
            produced = monitor.client.request(produce_req("seed", partition, batch))
            assert part_response(produced).error_code == ErrorCode.none
    yield monitor
    monitor.client.close()


def log_tail(broker: BrokerProcess) -> str:
    """The broker log from its last error on (the traceback, when there is one)."""
    text = broker.log_text()
    last_error = max(text.rfind(" ERROR "), text.rfind("memory allocation"))
    start = text.rfind("\n", 0, last_error) + 1 if last_error >= 0 else len(text) - 1500
    return text[max(start, 0):][:4000]


def ensure_running(broker: BrokerProcess, monitor: Monitor) -> None:
    """Restart a broker that an earlier test or example killed (and failed for), so
    that Hypothesis judges and shrinks every other example on a live broker."""
    if not broker.alive():
        broker.start()
        monitor.reconnect()


@contextlib.contextmanager
def still_serving(broker: BrokerProcess, monitor: Monitor):
    """Around one malformed exchange: afterwards the broker is alive, logged no
    traceback, and answers the monitor connection correctly."""
    ensure_running(broker, monitor)
    log_offset = broker.log_path.stat().st_size
    yield
    try:
        monitor.check()
    except OSError:
        # Perhaps the broker is dying: say so rather than report a lost connection.
        with contextlib.suppress(subprocess.TimeoutExpired):
            broker.proc.wait(1)
        if broker.alive():
            raise
    assert broker.alive(), f"the broker died, exit status {broker.proc.returncode}:\n{log_tail(broker)}"
    with open(broker.log_path, "rb") as f:
        f.seek(log_offset)
        new_log = f.read().decode("utf-8", "replace")
    assert "Traceback" not in new_log, f"the broker hit an internal error:\n{new_log[-4000:]}"


# --- reading what the broker sends ------------------------------------------------------


def connect(broker: BrokerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", broker.port), timeout=READ_TIMEOUT)


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send; the broker may already have closed the connection, which is its right."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    """`n` bytes, or None when the broker closes the connection first."""
    chunks = []
    while n:
        try:
            chunk = sock.recv(n)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_reply(sock: socket.socket) -> bytes | None:
    """One response frame, or None for a closed connection. A timeout propagates."""
    prefix = recv_exactly(sock, 4)
    if prefix is None:
        return None
    (size,) = struct.unpack(">i", prefix)
    assert 4 <= size <= 64 << 20, f"response frame with an absurd size {size}"
    body = recv_exactly(sock, size)
    assert body is not None, f"the broker closed the connection in the middle of a {size}-byte response"
    return body


def parse_response(reply: bytes, api_key: int, version: int, correlation_id: int):
    """Read a response frame whole with kio; fail unless it is well formed and for `correlation_id`."""
    schema = load_response_schema(api_key, version)
    header_cls = ResponseHeaderV0 if api_key == API_VERSIONS else schema.__header_schema__
    header, used = entity_reader(header_cls)(reply, 0)
    assert header.correlation_id == correlation_id, (header.correlation_id, correlation_id)
    body, body_used = entity_reader(schema)(reply, used)
    assert used + body_used == len(reply), f"{len(reply) - used - body_used} stray bytes after the response"
    return body


def assert_closed(sock: socket.socket, what: str) -> None:
    try:
        reply = read_reply(sock)
    except TimeoutError:
        pytest.fail(f"{what}: the broker neither answered nor closed the connection in {READ_TIMEOUT}s")
    assert reply is None, f"{what}: expected the connection to be closed, got a {len(reply)}-byte response"


def follow_up_api_versions(sock: socket.socket) -> None:
    """Ask ApiVersions on `sock` and check the very next frame answers it."""
    correlation_id = 0x7EADBEEF
    send_quietly(sock, sized(frame_of(api_versions_req(), correlation_id)))
    reply = read_reply(sock)
    assert reply is not None, "the broker closed a connection it should have kept serving"
    assert parse_response(reply, API_VERSIONS, 3, correlation_id).error_code == ErrorCode.none


# --- the oracle ----------------------------------------------------------------------------


class Expect(NamedTuple):
    kind: str  # answer, versions_v0, close, no_response, may_wait, decoder_aborts
    api_key: int = -1
    version: int = -1
    correlation_id: int = 0
    partitions_to_create: int = 0
    reason: str = ""


def _judge(frame: bytes) -> Expect:
    try:
        request = decode_request(frame, SUPPORTED)
    except UnsupportedVersion as exc:
        if exc.api_key == API_VERSIONS:
            return Expect("versions_v0", correlation_id=exc.correlation_id)
        return Expect("close", reason=str(exc))
    except ProtocolError as exc:
        return Expect("close", reason=str(exc))
    except BaseException as exc:  # escapes the broker's handling too: its log check will fail
        return Expect("close", reason=f"decode_request raised {exc!r}")
    body = request.body
    kind = "answer"
    if request.api_key == PRODUCE and body.acks == 0:
        kind = "no_response"
    elif request.api_key == FETCH and body.min_bytes > 0 and body.max_wait:
        kind = "may_wait"
    partitions = 0
    if request.api_key == CREATE_TOPICS and not body.validate_only:
        partitions = sum(len(t.assignments or ()) or max(t.num_partitions, 1) for t in body.topics)
    return Expect(kind, request.api_key, request.version, request.correlation_id, partitions)


def expectation(frame: bytes) -> Expect:
    """What the broker owes `frame`, judged in a forked child: kio's native decoder
    aborts the whole process on some frames, and must not take pytest with it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the abort's backtrace
            try:
                verdict = _judge(frame)
            except Exception:
                verdict = traceback.format_exc()
            os.write(write_end, pickle.dumps(verdict))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return Expect("decoder_aborts", reason=f"decode_request dies of signal {os.WTERMSIG(status)}")
    verdict = pickle.loads(data)
    if isinstance(verdict, str):
        raise RuntimeError(f"judging frame {frame.hex()} failed in the test itself:\n{verdict}")
    return verdict


def exchange(broker: BrokerProcess, frame: bytes, expected: Expect | None = None) -> str:
    """Send one complete frame on a fresh connection and check the broker's reaction
    to it. Returns what happened, for Hypothesis's statistics."""
    expected = expected or expectation(frame)
    what = f"frame {frame[:48].hex()}{'...' if len(frame) > 48 else ''} ({len(frame)} bytes)"
    with connect(broker) as sock:
        send_quietly(sock, sized(frame))
        if expected.kind == "versions_v0":
            reply = read_reply(sock)
            assert reply is not None, f"{what}: an unsupported ApiVersions version must be answered in v0"
            body = parse_response(reply, API_VERSIONS, 0, expected.correlation_id)
            assert body.error_code == ErrorCode.unsupported_version
            assert body.api_keys
            return "ApiVersions answered in v0 with UNSUPPORTED_VERSION"
        if expected.kind in ("close", "decoder_aborts"):
            assert_closed(sock, f"{what} ({expected.reason})")
            return "closed"
        if expected.kind == "no_response":
            # Produce with acks=0: the next answer on the connection is for the next request.
            follow_up_api_versions(sock)
            return "Produce acks=0: no response, connection kept"
        if expected.kind == "may_wait":
            sock.settimeout(LONG_POLL_GRACE)
        try:
            reply = read_reply(sock)
        except TimeoutError:
            assert expected.kind == "may_wait", f"{what}: a parsed request got neither an answer nor a close"
            return "Fetch long poll still waiting"
        assert reply is not None, \
            f"{what}: the broker closed the connection on a request it parses:\n{log_tail(broker)}"
        parse_response(reply, expected.api_key, expected.version, expected.correlation_id)
        return f"answered api {expected.api_key}"


# --- deterministic cases ---------------------------------------------------------------------


def test_api_versions_above_supported_is_answered_in_v0_with_unsupported_version(shared_broker, monitor):
    frame = bytearray(frame_of(api_versions_req(), 7))
    struct.pack_into(">h", frame, 2, 99)
    with still_serving(shared_broker, monitor), connect(shared_broker) as sock:
        send_quietly(sock, sized(bytes(frame)))
        reply = read_reply(sock)
        assert reply is not None, "ApiVersions v99 closed the connection instead of being answered in v0"
        body = parse_response(reply, API_VERSIONS, 0, 7)
        assert body.error_code == ErrorCode.unsupported_version
        assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == SUPPORTED
        # A client then retries with a version from the list, on the same connection.
        follow_up_api_versions(sock)


def test_unknown_api_key_closes_the_connection(shared_broker, monitor):
    with still_serving(shared_broker, monitor), connect(shared_broker) as sock:
        send_quietly(sock, sized(struct.pack(">hhih", 9999, 0, 1, 4) + b"fuzz"))
        assert_closed(sock, "api key 9999")


def test_produce_with_corrupt_crc_is_refused_and_the_connection_stays_usable(shared_broker, monitor):
    topic = fresh_topic("crc")
    batch = bytearray(encode_batch([(None, b"payload")]))
    batch[-1] ^= 0xFF  # inside the CRC's range, after the CRC was computed
    with still_serving(shared_broker, monitor), WireClient("127.0.0.1", shared_broker.port) as client:
        refused = part_response(client.request(produce_req(topic, 0, bytes(batch))))
        assert (refused.error_code, refused.base_offset) == (ErrorCode.corrupt_message, -1)
        accepted = part_response(client.request(produce_req(topic, 0, encode_batch([(None, b"good")]))))
        assert (accepted.error_code, accepted.base_offset) == (ErrorCode.none, 0)


@pytest.mark.parametrize("size", [-1, -(2**31), 0, MAX_REQUEST + 1, 2**31 - 1])
def test_absurd_size_prefix_closes_the_connection(shared_broker, monitor, size):
    with still_serving(shared_broker, monitor), connect(shared_broker) as sock:
        send_quietly(sock, struct.pack(">i", size) + b"\0" * 16)
        assert_closed(sock, f"size prefix {size}")


def test_frame_of_exactly_the_size_limit_is_read_whole(shared_broker, monitor):
    """At socket.request.max.bytes the frame is read whole, not cut short: it is answered (the tail
    after the body is ignored, as Kafka ignores it) and the next request on the connection is too."""
    frame = frame_of(api_versions_req(), 3)
    with still_serving(shared_broker, monitor), connect(shared_broker) as sock:
        sock.sendall(sized(frame + b"\0" * (MAX_REQUEST - len(frame))))
        reply = read_reply(sock)
        assert reply is not None and parse_response(reply, API_VERSIONS, 3, 3).error_code == ErrorCode.none
        follow_up_api_versions(sock)


@pytest.mark.parametrize("frame", [
    # Metadata v12 whose topics compact array claims 2**35 - 2 entries.
    pytest.param(struct.pack(">hhih", METADATA, 12, 1, -1) + b"\0" + uvarint(2**35 - 1), id="compact"),
    # Metadata v4 whose topics array claims 2**31 - 1 entries.
    pytest.param(struct.pack(">hhihi", METADATA, 4, 1, -1, 2**31 - 1), id="legacy"),
])
def test_array_length_beyond_the_frame_closes_the_connection(shared_broker, monitor, frame):
    with still_serving(shared_broker, monitor):
        exchange(shared_broker, frame, Expect("close", reason="an array longer than the frame"))


def test_fetch_with_negative_partition_max_bytes_is_answered(shared_broker, monitor):
    topic = fresh_topic("negmax")
    with still_serving(shared_broker, monitor):
        with WireClient("127.0.0.1", shared_broker.port) as client:
            assert client.request(create_topics_req((topic, 2))).topics[0].error_code == ErrorCode.none
            for partition in (0, 1):
                produced = client.request(produce_req(topic, partition, encode_batch([(None, b"v")])))
                assert part_response(produced).error_code == ErrorCode.none
        # Partition 0 returns data first, so partition 1's limit is not lifted for a first batch.
        exchange(shared_broker, frame_of(fetch_req(topic, [(0, 0), (1, 0)], [1 << 16, -1]), 11))


def test_create_topics_with_absurd_partition_count_is_refused_promptly(tmp_path):
    """Kafka refuses a request this large with POLICY_VIOLATION; creating the
    partitions one by one would stop the broker serving anyone for hours."""
    broker = BrokerProcess(tmp_path / "data")
    try:
        broker.start()
        with WireClient("127.0.0.1", broker.port) as client, \
                WireClient("127.0.0.1", broker.port, timeout=5) as other:
            correlation_id = client.send(create_topics_req(("huge", 1_000_000)))
            time.sleep(0.2)
            try:
                other.request(api_versions_req())
                result = client.receive(CREATE_TOPICS, 7, correlation_id).topics[0]
            except TimeoutError:
                pytest.fail("the broker stopped answering while it created a million partitions")
            assert result.error_code != ErrorCode.none
    finally:
        broker.kill()


# --- record batches that are malformed under a valid CRC ----------------------------------


def check_stored_batch(broker: BrokerProcess, monitor: Monitor, topic: str, batch: bytes) -> None:
    """Produce `batch`, then Fetch and ListOffsets in every way on its partition:
    all answered, and a stored batch has records that decode (Kafka validates
    every record of an uncompressed or gzip batch and refuses the batch with
    CORRUPT_MESSAGE or INVALID_RECORD otherwise)."""
    with still_serving(broker, monitor), WireClient("127.0.0.1", broker.port) as client:
        def ask(payload):
            try:
                return client.request(payload)
            except ConnectionError:
                pytest.fail(f"the broker dropped {type(payload).__name__} on {topic}:\n{log_tail(broker)}")

        produced = part_response(ask(produce_req(topic, 0, batch)))
        assert produced.error_code != ErrorCode.unknown_server_error
        for timestamp in (-2, -1, -3, 0, 10):
            p = ask(list_offsets_req(topic, timestamp)).topics[0].partitions[0]
            assert p.error_code == ErrorCode.none
        fetched = ask(fetch_req(topic, [(0, 0)])).responses[0].partitions[0]
        assert fetched.error_code == ErrorCode.none
        if produced.error_code != ErrorCode.none:
            assert fetched.records == b"", "a refused batch was stored"
            return
        for pos, header in iter_headers(fetched.records):
            if header.attributes & COMPRESSION_MASK in (0, 1):
                try:
                    records = decode_records(fetched.records, pos)
                except Exception as exc:  # CorruptBatch, or gzip's own errors
                    pytest.fail(f"the broker accepted a batch whose records do not decode: {exc!r}")
                assert len(records) == header.record_count >= 1, \
                    f"the broker accepted a batch of {header.record_count} records holding {len(records)}"


def count_zero_batch() -> bytes:
    batch = bytearray(encode_batch([(None, b"v")], timestamp=10))
    struct.pack_into(">i", batch, HEADER_SIZE - 4, 0)  # record count
    return with_crc(batch)


@pytest.mark.parametrize("batch", [
    pytest.param(encode_batch([(None, b"not gzip")], attributes=1, timestamp=10), id="gzip-flag-plain-body"),
    pytest.param(count_zero_batch(), id="record-count-0"),
])
def test_batch_with_valid_crc_but_undecodable_records(shared_broker, monitor, batch):
    check_stored_batch(shared_broker, monitor, fresh_topic("undecodable"), batch)


batch_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("set_attributes"), st.integers(0, 0xFF)),
    st.tuples(st.just("set_count"), INT32),
    st.tuples(st.just("truncate"), st.integers(CRC_START, 10**6)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=32)),
)


def mutate_batch(batch: bytes, mutations) -> bytes:
    out = bytearray(batch)
    for kind, *args in mutations:
        if kind == "flip":
            out[args[0] % len(out)] ^= args[1]
        elif kind == "set_attributes" and len(out) >= HEADER_SIZE:
            out[CRC_START + 1] = args[0]
        elif kind == "set_count" and len(out) >= HEADER_SIZE:
            struct.pack_into(">i", out, HEADER_SIZE - 4, args[0])
        elif kind == "truncate":
            del out[max(args[0] % len(out), CRC_START):]
        elif kind == "extend":
            out += args[0]
    return with_crc(out)


@settings(FUZZ, max_examples=100)
@given(values=st.lists(st.binary(max_size=20), min_size=1, max_size=3),
       mutations=st.lists(batch_mutation, min_size=1, max_size=3))
def test_fuzz_batches_mutated_under_a_valid_crc(shared_broker, monitor, values, mutations):
    batch = mutate_batch(encode_batch([(None, v) for v in values], timestamp=10), mutations)
    check_stored_batch(shared_broker, monitor, fresh_topic("crcfuzz"), batch)


# --- random and mutated frames ---------------------------------------------------------------


def header_v1(api_key: int, version: int, correlation_id: int, client_id: bytes) -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


random_frame = st.one_of(
    st.binary(min_size=1, max_size=300),
    # A plausible header before the random bytes, so that the fuzzing gets past the first checks.
    st.builds(operator.add,
              st.builds(header_v1, st.sampled_from(sorted(SUPPORTED)), st.integers(-1, 15), INT32,
                        st.binary(max_size=8)),
              st.binary(max_size=200)),
)


@FUZZ
@given(frame=random_frame)
def test_fuzz_random_frames(shared_broker, monitor, frame):
    with still_serving(shared_broker, monitor):
        event(exchange(shared_broker, frame))


# Boundary values written over a field-sized run of bytes.
interesting_int = st.sampled_from([0, 1, -1, 2**7 - 1, -(2**7), 2**15 - 1, -(2**15), 2**31 - 1, -(2**31),
                                   2**63 - 1, -(2**63)])
# Mutations that leave every field where it was: the frame often still parses and
# reaches a handler.
in_place_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("overwrite"), st.integers(0, 10**6), st.sampled_from([1, 2, 4, 8]), interesting_int),
)
# Mutations that move or cut fields, or change what the frame says it is: mostly parse errors.
reshaping_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 16)),
    st.tuples(st.just("api_key"), st.one_of(st.sampled_from(sorted(SUPPORTED)), INT16)),
    st.tuples(st.just("version"), st.one_of(st.integers(-1, 16), INT16)),
)


def mutate_frame(frame: bytes, mutations) -> bytes:
    out = bytearray(frame)
    for kind, *args in mutations:
        if kind in ("api_key", "version"):
            if len(out) >= 4:
                struct.pack_into(">h", out, 0 if kind == "api_key" else 2, args[0])
        elif kind == "extend":
            out += args[0]
        elif not out:
            continue
        elif kind == "flip":
            out[args[0] % len(out)] ^= args[1]
        elif kind == "overwrite":
            pos, width, value = args[0] % len(out), args[1], args[2]
            out[pos:pos + width] = (value % 2 ** (8 * width)).to_bytes(width, "big")[:len(out) - pos]
        elif kind == "truncate":
            del out[args[0] % len(out):]
        elif kind == "insert":
            pos = args[0] % len(out)
            out[pos:pos] = args[1]
        elif kind == "delete":
            pos = args[0] % len(out)
            del out[pos:pos + args[1]]
    return bytes(out)


frame_mutations = st.one_of(
    st.lists(in_place_mutation, min_size=1, max_size=3),
    st.builds(operator.add, st.lists(in_place_mutation, max_size=2),
              st.lists(reshaping_mutation, min_size=1, max_size=2)),
)


@settings(FUZZ, max_examples=400)
@given(seed=st.sampled_from(sorted(SEEDS)), mutations=frame_mutations)
def test_fuzz_mutated_valid_requests(shared_broker, monitor, seed, mutations):
    frame = mutate_frame(SEEDS[seed], mutations)
    expected = expectation(frame)
    # A flipped partition count would have the broker create millions of partitions;
    # test_create_topics_with_absurd_partition_count_is_refused_promptly covers that.
    assume(expected.partitions_to_create <= 100)
    with still_serving(shared_broker, monitor):
        event(exchange(shared_broker, frame, expected))


@FUZZ
@given(seed=st.sampled_from(sorted(SEEDS)),
       declared=st.one_of(st.integers(1, 64), st.integers(1, MAX_REQUEST)),
       sent_fraction=st.floats(0, 1, exclude_max=True),
       prefix_only=st.integers(0, 3),
       abort=st.booleans())
def test_fuzz_connections_closed_mid_frame(shared_broker, monitor, seed, declared, sent_fraction, prefix_only,
                                           abort):
    """A frame the client never finishes gets no answer; the broker closes its side once the client does."""
    body = (SEEDS[seed] * (declared // len(SEEDS[seed]) + 1))[:declared]
    if prefix_only:
        data = struct.pack(">i", declared)[:prefix_only]
    else:
        data = struct.pack(">i", declared) + body[:int(declared * sent_fraction)]
    with still_serving(shared_broker, monitor), connect(shared_broker) as sock:
        send_quietly(sock, data)
        if abort:
            # SO_LINGER 0: the close sends a reset instead of a FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        sock.shutdown(socket.SHUT_WR)
        assert recv_exactly(sock, 1) is None, "the broker answered a frame it had not received whole"


@FUZZ
@given(size=st.one_of(st.integers(-(2**31), 0), st.integers(MAX_REQUEST + 1, 2**31 - 1)),
       tail=st.binary(max_size=64))
def test_fuzz_absurd_size_prefixes(shared_broker, monitor, size, tail):
    with still_serving(shared_broker, monitor), connect(shared_broker) as sock:
        send_quietly(sock, struct.pack(">i", size) + tail)
        assert_closed(sock, f"size prefix {size}")


# --- after all of it: real clients ---------------------------------------------------------


def test_real_clients_still_work_and_the_broker_never_failed(shared_broker, monitor):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    ensure_running(shared_broker, monitor)
    topic = fresh_topic("after-fuzz")
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap, "acks": "all", "enable.idempotence": True})
    errors = []

    def delivered(err, msg):
        if err:
            errors.append(err)

    for i in range(100):
        producer.produce(topic, str(i).encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    assert errors == []
    del producer, admin

    consumer = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "after-fuzz",
                         "enable.auto.commit": False, "check.crcs": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = []
    try:
        deadline = time.monotonic() + 30
        while len(read) < 100 and time.monotonic() < deadline:
            for m in consumer.consume(100, 1.0):
                assert m.error() is None, m.error()
                read.append((m.offset(), int(m.value())))
    finally:
        consumer.close()
    assert read == [(i, i) for i in range(100)]

    assert shared_broker.alive()
    assert shared_broker.starts == 1, f"the broker died during the module:\n{log_tail(shared_broker)}"
    log = shared_broker.log_text()
    assert "Traceback" not in log, \
        "the broker logged internal errors:\n" + log[max(log.index("Traceback") - 300, 0):][:4000]
