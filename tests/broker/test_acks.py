"""What `acks` promises a producer, checked with confluent-kafka against real brokers:
acks=0 is told "delivered" for writes no broker ever appended, and acks=1 writes that only
the leader held are gone once a follower takes over."""

from __future__ import annotations

import os
import signal

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker.cluster import produce


def read_all(bootstrap: str, topic: str) -> list[str]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "acks-test", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[str] = []
        idle = 0
        while idle < 3:
            msgs = consumer.consume(100, 1.0)
            idle = 0 if msgs else idle + 1
            got += [m.value().decode() for m in msgs if not m.error()]
        return got
    finally:
        consumer.close()


def test_acks_0_reports_delivered_writes_a_killed_broker_never_appended(broker):
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "0", "enable.idempotence": False,
                         "linger.ms": 0})
    assert produce(producer, "z", 0, ["before"])[0][2] is None
    assert read_all(broker.bootstrap, "z") == ["before"], "the connection is up and the topic exists"
    # A stopped broker's kernel still takes bytes into the socket's receive buffer, which is all
    # an acks=0 producer waits for; the SIGKILL then discards them unread.
    os.kill(broker.proc.pid, signal.SIGSTOP)
    sent = produce(producer, "z", 0, [f"v{i}" for i in range(50)])
    broker.kill()
    assert all(error is None for _, _, error in sent), sent
    broker.start()
    assert read_all(broker.bootstrap, "z") == ["before"]


def test_acks_1_writes_only_the_leader_held_are_lost_when_it_dies(cluster_factory):
    # Followers' fetches wait up to 3 s for 10 MB at the leader, so acks=1 writes sit on the leader
    # alone for seconds (Kafka's replica.fetch.min.bytes / replica.fetch.wait.max.ms); the ISR
    # keeps them as members because the lag limit is longer.
    cluster = cluster_factory(settings={"replica.fetch.min.bytes": 10_000_000, "replica.fetch.wait.max.ms": 3000,
                                        "replica.lag.time.max.ms": 20000})
    cluster.create_topic("a", 1, 3)
    before = produce(cluster.producer(), "a", 0, ["replicated"])
    assert before[0][2] is None, "acks=all waits for the followers' next fetch"
    leader = cluster.state("a", 0)
    acked = produce(cluster.producer(acks="1", **{"enable.idempotence": False}), "a", 0,
                    [f"only-leader-{i}" for i in range(20)])
    assert all(error is None for _, _, error in acked), acked
    cluster.kill(leader["leader"])
    new = cluster.wait_state("a", 0, lambda s: s["leader"] not in (-1, leader["leader"]), "a new leader")
    assert new["isr"] != [leader["leader"]]
    cluster.brokers[leader["leader"]].start()
    cluster.wait_state("a", 0, lambda s: len(s["isr"]) == 3, "the old leader back in the ISR")
    assert read_all(cluster.bootstrap, "a") == ["replicated"]
    # The old leader truncated its unreplicated tail to follow the new leader's log.
    old_log = b"".join(p.read_bytes() for p in (cluster.brokers[leader["leader"]].data_dir / "a-0").glob("*.log"))
    assert b"replicated" in old_log and b"only-leader" not in old_log
