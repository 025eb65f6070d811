"""Real Kafka clients use the reference broker unchanged.

Each client creates a 3-partition topic, produces 10,000 unique values and
reads them back by assign with CRC checks on: every value exactly once, in
send order per partition, at consecutive offsets from 0.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict


N = 10_000
PARTITIONS = 3


def check_exactly_once_in_order(sent: dict[int, list[int]], read: list[tuple[int, int, int]]) -> None:
    """`sent`: per partition, values in send order; `read`: (partition, offset, value)."""
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for partition, offset, value in read:
        by_partition[partition].append((offset, value))
    for partition in range(PARTITIONS):
        got = by_partition[partition]
        assert [o for o, _ in got] == list(range(len(got))), f"partition {partition}: offsets not 0..n-1"
        assert [v for _, v in got] == sent[partition], f"partition {partition}: values differ from send order"
    assert sum(len(v) for v in sent.values()) == N


def test_confluent_kafka_idempotent_acks_all(broker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("cf", PARTITIONS, 1)])["cf"].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all"})
    errors, sent = [], defaultdict(list)

    def delivered(err, msg):
        if err:
            errors.append(err)

    for i in range(N):
        producer.produce("cf", str(i).encode(), partition=i % PARTITIONS, on_delivery=delivered)
        sent[i % PARTITIONS].append(i)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "cf-test",
                         "enable.auto.commit": False, "check.crcs": True})
    consumer.assign([TopicPartition("cf", p, 0) for p in range(PARTITIONS)])
    read = []
    deadline = time.monotonic() + 30
    while len(read) < N and time.monotonic() < deadline:
        for m in consumer.consume(1000, 1.0):
            assert m.error() is None, m.error()
            read.append((m.partition(), m.offset(), int(m.value())))
    consumer.close()
    check_exactly_once_in_order(sent, read)


def test_kafka_python(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("kp", PARTITIONS, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True)
    sent = defaultdict(list)
    futures = []
    for i in range(N):
        futures.append(producer.send("kp", str(i).encode(), partition=i % PARTITIONS))
        sent[i % PARTITIONS].append(i)
    producer.flush(30)
    for f in futures:
        f.get(10)
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, check_crcs=True)
    consumer.assign([TopicPartition("kp", p) for p in range(PARTITIONS)])
    consumer.seek_to_beginning()
    read = []
    deadline = time.monotonic() + 30
    while len(read) < N and time.monotonic() < deadline:
        for tp, msgs in consumer.poll(1000).items():
            read += [(tp.partition, m.offset, int(m.value)) for m in msgs]
    consumer.close()
    check_exactly_once_in_order(sent, read)


def test_aiokafka(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic("ak", PARTITIONS, 1)])
        await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        sent = defaultdict(list)
        futures = []
        for i in range(N):
            futures.append(await producer.send("ak", str(i).encode(), partition=i % PARTITIONS))
            sent[i % PARTITIONS].append(i)
        await producer.flush()
        await asyncio.gather(*futures)
        await producer.stop()

        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, check_crcs=True)
        await consumer.start()
        consumer.assign([TopicPartition("ak", p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        read = []
        deadline = time.monotonic() + 30
        while len(read) < N and time.monotonic() < deadline:
            for tp, msgs in (await consumer.getmany(timeout_ms=1000)).items():
                read += [(tp.partition, m.offset, int(m.value)) for m in msgs]
        await consumer.stop()
        return sent, read

    sent, read = asyncio.run(run())
    check_exactly_once_in_order(sent, read)
