"""What is acknowledged survives a clean stop, and with per-message fsync a
SIGKILL too; idempotent producer state survives a restart."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess


def produce(bootstrap: str, topic: str, values: range, partitions: int) -> dict[int, int]:
    """Produce `values` round robin; return {value: offset} of the acknowledged ones."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2})
    acked: dict[int, int] = {}

    def delivered(err, msg):
        if err is None:
            acked[int(msg.value())] = msg.offset()

    for v in values:
        producer.produce(topic, str(v).encode(), partition=v % partitions, on_delivery=delivered)
        producer.poll(0)
    producer.flush(30)
    return acked


def read_all(bootstrap: str, topic: str, partitions: int, expect: int) -> list[tuple[int, int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "restart-test",
                         "enable.auto.commit": False, "check.crcs": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    read = []
    deadline = time.monotonic() + 30
    while len(read) < expect and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.5):
            assert m.error() is None, m.error()
            read.append((m.partition(), m.offset(), int(m.value())))
    consumer.close()
    return read


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)


def test_sigterm_then_restart_keeps_everything(broker: BrokerProcess):
    create(broker.bootstrap, "t", 3)
    acked = produce(broker.bootstrap, "t", range(5000), 3)
    assert len(acked) == 5000
    assert broker.stop() == 0
    assert "shut down cleanly" in broker.log_text()
    broker.start()
    read = read_all(broker.bootstrap, "t", 3, 5000)
    assert sorted(v for _, _, v in read) == list(range(5000))
    assert all(acked[v] == offset for _, offset, v in read)
    # The log continues where it was: a new producer's records follow on.
    more = produce(broker.bootstrap, "t", range(5000, 5300), 3)
    assert min(more.values()) >= min(o for o in acked.values())
    assert len(read_all(broker.bootstrap, "t", 3, 5300)) == 5300


def test_sigkill_with_fsync_per_message_loses_nothing_acknowledged(broker_factory):
    broker = broker_factory({"log.flush.interval.messages": 1, "log.segment.bytes": 200_000})
    create(broker.bootstrap, "k", 2)
    acked = produce(broker.bootstrap, "k", range(3000), 2)
    assert len(acked) == 3000
    broker.kill()
    broker.start()
    read = read_all(broker.bootstrap, "k", 2, len(acked))
    got = {v: offset for _, offset, v in read}
    missing = set(acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged values lost after SIGKILL, e.g. {sorted(missing)[:5]}"
    assert all(got[v] == acked[v] for v in acked), "a value moved to another offset"
    assert len(read) == len(got), "a value was read twice"


def test_sigkill_mid_produce_recovers_a_consistent_log(broker_factory):
    """Killed while producing: after restart the log is readable end to end,
    holds every acknowledged value once, at its acknowledged offset."""
    broker = broker_factory({"log.flush.interval.messages": 1})
    create(broker.bootstrap, "m", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "message.timeout.ms": 3000, "linger.ms": 1})
    acked: dict[int, int] = {}

    def delivered(err, msg):
        if err is None:
            acked[int(msg.value())] = msg.offset()

    for v in range(20000):
        producer.produce("m", str(v).encode(), partition=0, on_delivery=delivered)
        producer.poll(0)
        if v == 10000:
            broker.kill()
    producer.flush(5)
    broker.start()
    read = read_all(broker.bootstrap, "m", 1, len(acked))
    offsets = [o for _, o, _ in read]
    assert offsets == list(range(len(offsets))), "the recovered log has a gap or repeats an offset"
    got = {v: o for _, o, v in read}
    assert all(got.get(v) == o for v, o in acked.items())
