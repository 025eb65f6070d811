"""One broker alone, the reference broker (standalone, no ZooKeeper) against Kafka 3.9 (ZooKeeper
mode, beside a ZooKeeper of its own), both on disks that lose what was not fsynced when the node's
power is cut: the same scripted scenario gives the same observable answers.

Points 8 and 11 of the issue that brought the reference broker to Kafka 3.9's rules (see
`docs/design.md`): `log.flush.interval.ms` without `log.flush.scheduler.interval.ms` fsyncs nothing
by time, and a lone broker's leader epochs (the epoch batches are stamped with, and the epoch a
restart starts).
"""

from __future__ import annotations

import os
import time

import pytest
from kio.schema.errors import ErrorCode

from faultline.broker.records import encode_batch, iter_headers
from faultline.control.wait import wait_until
from tests.differential.harness import Side, produce
from tests.wire import EARLIEST, fetch, list_offset, offset_for_leader_epoch, partition_metadata, values

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"), pytest.mark.slow]

# The time-based flush Kafka documents, without the scheduler that would run it.
SETTINGS = {"log.flush.interval.ms": "200"}
NODE = "n1"


@pytest.fixture(scope="module")
def sides():
    made = {}
    try:
        for system in ("kafka", "reference"):
            made[system] = Side(system, SETTINGS, nodes=1, extra=("--nemesis", "power-loss"))
        yield made
    finally:
        for side in made.values():
            side.close()


def batch(*vals: bytes) -> bytes:
    return encode_batch([(None, v) for v in vals], timestamp=int(time.time() * 1000))


def leading(side: Side, topic: str):
    """The partition's metadata once the broker serves it as leader."""

    def serving():
        with side.client(NODE) as client:
            if list_offset(client, topic, EARLIEST)[0] == ErrorCode.none:
                return partition_metadata(client, topic)
        return None

    return wait_until(serving, 60, f"{side.system}: {NODE} serves {topic}-0")


def batch_epochs(records: bytes) -> list[int]:
    return [header.leader_epoch for _, header in iter_headers(records)]


def power_cycle(side: Side, topic: str) -> dict:
    side.create_topic(topic, replication_factor=1)
    answers: dict = {"epoch at creation": leading(side, topic).leader_epoch}
    with side.client(NODE) as client:
        answers["written"] = [produce(client, topic, batch(v), acks=1) for v in (b"a", b"b")]
        answers["the epoch the batches carry"] = batch_epochs(fetch(client, topic, 0).records)
    # Several times log.flush.interval.ms, so that a flusher on that interval would have run.
    time.sleep(2.0)
    side.db.power_off(NODE)
    side.db.power_on(NODE)
    side.db.wait_ready(NODE)
    answers["epoch after the power came back"] = leading(side, topic).leader_epoch
    with side.client(NODE) as client:
        read = fetch(client, topic, 0)
        answers["what a consumer reads"] = (read.high_watermark, values(read.records))
        answers["written after"] = produce(client, topic, batch(b"c"), acks=1)
        answers["the epoch it carries"] = batch_epochs(fetch(client, topic, 0).records)
        answers["the end of epoch 0"] = offset_for_leader_epoch(client, topic, 0)
    return answers


def test_8_11_log_flush_interval_alone_fsyncs_nothing_and_a_lone_brokers_epochs(sides):
    got = {system: power_cycle(side, f"solo-{system[0]}") for system, side in sides.items()}
    print(got)
    assert got["reference"] == got["kafka"]
    assert got["kafka"] == {
        "epoch at creation": 0,
        "written": [(ErrorCode.none, 0), (ErrorCode.none, 1)],
        # UnifiedLog.appendAsLeader stamps every batch with the leader's epoch.
        "the epoch the batches carry": [0, 0],
        # PartitionStateMachine.initializePartitionState: the controller that starts with the
        # broker finds the partition's leader alive and elects no one, so the epoch stays.
        "epoch after the power came back": 0,
        # LogManager.flushDirtyLogs runs every log.flush.scheduler.interval.ms (default: never):
        # log.flush.interval.ms alone fsynced nothing, so the power cut took a and b.
        "what a consumer reads": (0, []),
        "written after": (ErrorCode.none, 0),
        "the epoch it carries": [0],
        "the end of epoch 0": ("none", 0, 1),
    }
