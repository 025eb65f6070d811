"""Kafka 3.9's rules the differential tests cannot reach on demand, held on the reference broker
alone: a window a scenario cannot hit at will (a joining replica counted in the high watermark; a
new leader whose high watermark lags its epoch), what only a power cut would show (when the
time-based flusher runs), and the standalone broker's leader epochs. Each names the Kafka source
it follows; `tests/differential/` holds the rules both systems were run against."""

from __future__ import annotations

import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from faultline.broker.config import load_config
from faultline.broker.records import check_batch, encode_batch
from faultline.broker.replica import LEADER, FollowerProgress, Replica
from faultline.broker.replica_manager import ReplicaManager
from faultline.broker.state import BrokerState
from faultline.control.wait import wait_until
from tests.broker.cluster import produce
from tests.broker.test_replication import partition_assigned
from tests.broker.test_restart import create
from tests.broker.test_restart import produce as produce_round_robin
from tests.wire import WireClient, list_offset, offset_for_leader_epoch, part_response, produce_req


def recovery_point(broker, topic: str) -> int:
    lines = (broker.data_dir / "recovery-point-offset-checkpoint").read_text().splitlines()[2:]
    return next(int(line.split()[2]) for line in lines if line.split()[:2] == [topic, "0"])


@pytest.mark.parametrize("scheduler_ms, flushed", [(None, False), (100, True)])
def test_log_flush_interval_ms_fsyncs_only_when_the_flush_scheduler_runs(broker_factory, scheduler_ms, flushed):
    # Kafka 3.9 LogManager: the flusher runs every log.flush.scheduler.interval.ms (by default
    # never) and flushes logs not flushed within log.flush.interval.ms; the latter alone does nothing.
    settings = {"log.flush.interval.ms": 100}
    if scheduler_ms:
        settings["log.flush.scheduler.interval.ms"] = scheduler_ms
    broker = broker_factory(settings)
    create(broker.bootstrap, "f", 1)
    assert len(produce_round_robin(broker.bootstrap, "f", range(100), 1)) == 100
    if flushed:
        wait_until(lambda: recovery_point(broker, "f") == 100, 10, "the flusher fsynced the log")
    else:
        time.sleep(1.0)  # ten times log.flush.interval.ms: this test is about time passing
        assert recovery_point(broker, "f") == 0


def test_a_standalone_broker_leads_at_epoch_0_and_keeps_it_across_restarts(broker):
    # As a one-broker Kafka 3.9 cluster in ZooKeeper mode, whose controller finds the leader alive
    # at start-up and elects no one (tests/differential/test_single_broker_vs_kafka.py).
    create(broker.bootstrap, "e", 1)
    produce_round_robin(broker.bootstrap, "e", range(10), 1)
    with WireClient("127.0.0.1", broker.port) as client:
        assert offset_for_leader_epoch(client, "e", 0) == ("none", 0, 10)
        assert offset_for_leader_epoch(client, "e", 1) == ("none", -1, -1), "no epoch 1"
    assert broker.stop() == 0
    broker.start()
    produce_round_robin(broker.bootstrap, "e", range(10, 15), 1)
    with WireClient("127.0.0.1", broker.port) as client:
        assert offset_for_leader_epoch(client, "e", 0) == ("none", 0, 15), "epoch 0 goes on after the restart"
        assert offset_for_leader_epoch(client, "e", 1) == ("none", -1, -1)


def test_a_new_leader_whose_high_watermark_lags_its_epoch_answers_offset_not_available(cluster_factory):
    # KIP-207, Kafka 3.9 Partition.fetchOffsetForTimestamp: until the high watermark reaches the
    # start of the leader's epoch, a consumer asking for the latest offset is told
    # OFFSET_NOT_AVAILABLE (and retries) rather than a stale offset.
    cluster = cluster_factory(settings={"zookeeper.session.timeout.ms": 20000, "replica.lag.time.max.ms": 60000},
                              start=False)
    cluster.start(1)
    wait_until(lambda: cluster.controller() == 1, 20, "broker 1 did not become the controller")
    cluster.start(2, 3)
    # Broker 2 leads; broker 1 (the controller) is next in line; broker 3 stalls.
    topic, p = partition_assigned(cluster, (2, 1, 3))
    cluster.wait_state(topic, p, lambda s: s["leader"] == 2 and len(s["isr"]) == 3, "broker 2 leads, all in sync")
    assert [r[1] for r in produce(cluster.producer(), topic, p, ["a", "b"])] == [0, 1]
    cluster.pause(3)  # stays in the ISR (its session and the lag limit outlast the test) with log end 2
    try:
        with WireClient("127.0.0.1", cluster.brokers[2].port) as client:
            resp = part_response(client.request(produce_req(topic, p, encode_batch([(None, b"c")]), acks=1)))
            assert (resp.error_code, resp.base_offset) == (ErrorCode.none, 2)
        time.sleep(1.0)  # broker 1 fetches c (log end 3); the high watermark stays 2, held by broker 3
        # A controlled shutdown: leadership moves at once, while broker 3's session lives on.
        cluster.brokers[2].stop()
        cluster.wait_state(topic, p, lambda s: s["leader"] == 1, "broker 1 elected")
        with WireClient("127.0.0.1", cluster.brokers[1].port) as client:
            wait_until(lambda: list_offset(client, topic, partition=p)[0] != ErrorCode.not_leader_or_follower, 10,
                       "broker 1 leads")
            assert list_offset(client, topic, partition=p) == (ErrorCode.offset_not_available, -1)
            cluster.resume(3)
            wait_until(lambda: list_offset(client, topic, partition=p) == (ErrorCode.none, 3), 20,
                       "the high watermark reaches the epoch's start and the latest offset is 3")
    finally:
        cluster.resume(3)


def test_a_replica_joining_the_isr_counts_in_the_high_watermark_while_the_change_is_written(tmp_path):
    # KIP-497's maximal ISR, Kafka 3.9 Partition.maybeIncrementLeaderHW: a replica being added to
    # the ISR holds the high watermark back before ZooKeeper says it is in; one neither in nor
    # caught up does not.
    config = load_config(1, "127.0.0.1:1", tmp_path / "data", overrides=["zookeeper.connect=127.0.0.1:1"])
    state = BrokerState(config)
    manager = ReplicaManager(config, state)
    plog = state.ensure_replica("j", 0, uuid.uuid4())
    plog.hw_follows_leo = False
    for i in range(5):
        batch = encode_batch([(None, b"%d" % i)], base_offset=i)
        plog.append(batch, check_batch(batch))
    r = Replica("j", 0, plog, (1, 2, 3), LEADER, 1, 0, (1, 2))
    r.followers = {2: FollowerProgress(leo=5), 3: FollowerProgress(leo=2)}
    manager._advance_hw(r)
    assert plog.high_watermark == 5, "broker 3 is neither in the ISR nor caught up"
    plog.high_watermark = 0
    r.pending_isr = (1, 2, 3)
    manager._advance_hw(r)
    assert plog.high_watermark == 2, "broker 3 is joining: its log end holds the high watermark"
    r.pending_isr = None
    r.followers[3].last_caught_up = time.monotonic()
    plog.high_watermark = 0
    manager._advance_hw(r)
    assert plog.high_watermark == 2, "caught up within the lag: it may rejoin, so it holds the high watermark"
    state.shutdown()
