"""Protocol-level behaviour, with exact requests sent over a raw connection."""

from __future__ import annotations

import datetime
import threading
import time

from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v7 import request as lo_req
from kio.schema.metadata.v12 import request as md_req

from faultline.broker.records import encode_batch
from tests.wire import WireClient, fetch, part_response, produce_req, values


def test_retried_idempotent_batch_is_acknowledged_with_its_first_offset(broker):
    with WireClient("127.0.0.1", broker.port) as c:
        pid = c.request(InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(0))).producer_id
        first = encode_batch([(None, b"a"), (None, b"b")], producer_id=pid, producer_epoch=0, base_sequence=0)
        second = encode_batch([(None, b"c")], producer_id=pid, producer_epoch=0, base_sequence=2)
        assert part_response(c.request(produce_req("idem", 0, first))).base_offset == 0
        assert part_response(c.request(produce_req("idem", 0, second))).base_offset == 2
        retry = part_response(c.request(produce_req("idem", 0, first)))
        assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 0)
        gap = encode_batch([(None, b"d")], producer_id=pid, producer_epoch=0, base_sequence=7)
        assert part_response(c.request(produce_req("idem", 0, gap))).error_code == ErrorCode.out_of_order_sequence_number
        assert values(fetch(c, "idem", 0).records) == [b"a", b"b", b"c"]


def test_min_insync_replicas_above_a_single_replica_is_capped_as_kafka_does(broker_factory):
    # Kafka 3.9 (Partition.scala, effectiveMinIsr) caps min.insync.replicas at the replication
    # factor: on one broker, acks=all is answered by the leader alone. Refusals below the minimum
    # on a replicated topic: tests/broker/test_replication.py.
    broker = broker_factory({"min.insync.replicas": 2})
    with WireClient("127.0.0.1", broker.port) as c:
        for value in (b"x", b"y"):
            ok = part_response(c.request(produce_req("mir", 0, encode_batch([(None, value)]))))
            assert ok.error_code == ErrorCode.none
        assert values(fetch(c, "mir", 0).records) == [b"x", b"y"]


def test_oversized_batch_and_unknown_topic_are_refused(broker_factory):
    broker = broker_factory({"message.max.bytes": 1000, "auto.create.topics.enable": "false"})
    with WireClient("127.0.0.1", broker.port) as c:
        big = encode_batch([(None, b"z" * 2000)])
        r = part_response(c.request(produce_req("nope", 0, big)))
        assert r.error_code in (ErrorCode.message_too_large, ErrorCode.unknown_topic_or_partition)
        md = c.request(md_req.MetadataRequest(topics=(md_req.MetadataRequestTopic(name="nope", topic_id=None),),
                                              allow_auto_topic_creation=True,
                                              include_topic_authorized_operations=False))
        assert md.topics[0].error_code == ErrorCode.unknown_topic_or_partition


def test_acks_zero_gets_no_response_and_later_responses_stay_in_order(broker):
    with WireClient("127.0.0.1", broker.port) as c:
        c.send(produce_req("z", 0, encode_batch([(None, b"fire-and-forget")]), acks=0))
        ids = [c.send(produce_req("z", 0, encode_batch([(None, str(i).encode())]))) for i in range(20)]
        offsets = [part_response(c.receive(0, 9, cid)).base_offset for cid in ids]
        assert offsets == list(range(1, 21))


def test_fetch_long_poll_wakes_when_data_arrives(broker):
    with WireClient("127.0.0.1", broker.port) as c:
        c.request(produce_req("lp", 0, encode_batch([(None, b"first")])))
        result = {}

        def poll():
            with WireClient("127.0.0.1", broker.port) as waiter:
                result["part"] = fetch(waiter, "lp", 1, max_wait_ms=20_000, min_bytes=1)

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "a fetch with nothing to return must wait for max.wait.ms"
        c.request(produce_req("lp", 0, encode_batch([(None, b"second")])))
        t.join(10)
        assert not t.is_alive(), "the waiting fetch did not wake when data arrived"
        assert values(result["part"].records) == [b"second"]


def test_fetch_returns_whole_batches_within_max_bytes(broker):
    with WireClient("127.0.0.1", broker.port) as c:
        batches = [encode_batch([(None, bytes([65 + i]) * 100)]) for i in range(10)]
        for b in batches:
            c.request(produce_req("mb", 0, b))
        size = len(batches[0])
        part = fetch(c, "mb", 0, max_bytes=size * 3 + 10)
        assert len(part.records) == size * 3
        assert part.high_watermark == 10
        # The first batch comes whole even when it is larger than max bytes.
        assert len(fetch(c, "mb", 4, max_bytes=10).records) == size
        assert fetch(c, "mb", 11).error_code == ErrorCode.offset_out_of_range


def test_list_offsets_earliest_latest_and_by_timestamp(broker):
    with WireClient("127.0.0.1", broker.port) as c:
        for i, ts in enumerate([1000, 2000, 3000]):
            batch = encode_batch([(None, b"v%d" % i), (None, b"w%d" % i)], timestamp=ts)
            c.request(produce_req("lo", 0, batch))

        def lookup(ts):
            req = lo_req.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
                lo_req.ListOffsetsTopic(name="lo", partitions=(lo_req.ListOffsetsPartition(
                    partition_index=0, timestamp=ts),)),))
            p = c.request(req).topics[0].partitions[0]
            return p.offset, p.timestamp

        assert lookup(-2)[0] == 0
        assert lookup(-1)[0] == 6
        assert lookup(1500) == (2, 2000)
        assert lookup(3000) == (4, 3000)
        assert lookup(9999) == (-1, -1)
        assert lookup(-3)[1] == 3000
