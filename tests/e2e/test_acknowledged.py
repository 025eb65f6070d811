"""A replicated run under `kill,partition`, its history held against what the brokers acknowledged
and what their logs hold: every offset a broker acknowledged to the workload is in the history,
on the send micro-operation of that value (whatever the operation's outcome), and is the offset
at which the brokers' own logs hold that value.

What the brokers acknowledged is taken from librdkafka itself: the workload's producer is the
real one, with a tap on its delivery callback that notes every acknowledgement (key, value,
offset) as it arrives, before the workload's own bookkeeping sees it. The logs are the brokers'
segment files, read with the broker's own record decoder after the run stopped them cleanly."""

from __future__ import annotations

import os
import secrets
import threading
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from faultline.broker.records import decode_records, iter_headers
from faultline.checker.check import check_paths
from faultline.control.local_cluster import LocalCluster
from faultline.control.net import Net
from faultline.models.history import HistoryWriter, read_history
from faultline.models.spec import TestSpec
from faultline.runner import testmap
from faultline.runner.run import execute
from faultline.runner.store import create_run_dir
from faultline.workloads import queue
from tests.control.helpers import ours_on_host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


class Tap:
    """Every acknowledgement librdkafka delivered to the workload: (key, value, offset)."""

    def __init__(self):
        self.acks: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def producer_class(self):
        tap = self

        class TappedProducer(Producer):
            def produce(self, topic, value=None, *args, on_delivery=None, **kwargs):
                def delivered(err, msg):
                    if err is None and msg.offset() >= 0:
                        with tap.lock:
                            tap.acks.append((f"{msg.topic()}/{msg.partition()}", int(msg.value()), msg.offset()))
                    if on_delivery is not None:
                        on_delivery(err, msg)

                return super().produce(topic, value, *args, on_delivery=delivered, **kwargs)

        return TappedProducer


def broker_logs(workdir: Path, nodes: list[str]) -> dict[str, dict[tuple[str, int], int]]:
    """Per node, (key, offset) -> value of every record in its data directory's segments."""
    out = {}
    for node in nodes:
        records = {}
        for directory in sorted((workdir / node / "data").glob("*-*")):
            if not directory.is_dir() or not directory.name.rpartition("-")[2].isdigit():
                continue
            topic, _, partition = directory.name.rpartition("-")
            for segment in sorted(directory.glob("*.log")):
                data = segment.read_bytes()
                for position, _header in iter_headers(data):
                    for record in decode_records(data, position):
                        records[(f"{topic}/{partition}", record.offset)] = int(record.value)
        out[node] = records
    return out


def test_every_offset_the_brokers_acknowledged_under_kills_and_partitions_is_in_the_history(tmp_path, monkeypatch):
    tap = Tap()
    monkeypatch.setattr(queue, "Producer", tap.producer_class())
    # Two replicas of three partitions on three brokers: a fault stalls the keys of some brokers
    # while the others' sends are acknowledged, so operations end partly acknowledged.
    spec = TestSpec(nodes=3, replication_factor=2, time_limit=20, rate=200, concurrency=6, seed=11,
                    nemesis=["kill", "partition"], nemesis_interval=3, final_time_limit=30,
                    producer={"acks": "all", "enable.idempotence": "false", "message.timeout.ms": "4000",
                              "request.timeout.ms": "2000"}, store=str(tmp_path / "store"))
    nodes, support = testmap.node_names(spec)
    run_dir = create_run_dir(spec)
    workdir = tmp_path / "work"
    tag = "a" + secrets.token_hex(3)
    cluster = LocalCluster.create(tag, nodes + support, workdir)
    history = HistoryWriter(run_dir / "history.jsonl")
    try:
        test = testmap.build(spec, cluster.remotes, workdir, Net(cluster.remotes))
        execute(test, history, run_dir)  # stops every broker cleanly before it returns
        history.close()
        logs = broker_logs(workdir, nodes)
    finally:
        history.close()
        cluster.destroy()
    assert not ours_on_host({tag})

    ops = read_history(run_dir / "history.jsonl").ops
    faults = Counter(o["f"] for o in ops if o["process"] == "nemesis" and o["type"] == "info")
    assert faults["kill"] and faults["start-partition"], faults
    recorded = {(m["key"], m["value"]): (m.get("offset"), o["type"]) for o in ops
                if o["f"] == "send" and o["type"] != "invoke" for m in o["mops"]}
    assert tap.acks, "the producers acknowledged nothing"
    dropped = [(k, v, off) for k, v, off in tap.acks if recorded.get((k, v), (None,))[0] != off]
    assert not dropped, f"acknowledged offsets the history lacks: {dropped[:10]}"
    # The offsets are the brokers' own: every acknowledged (key, offset) holds its value in the
    # log of some broker, and no broker holds another value there.
    for key, value, offset in tap.acks:
        held = {node: log[(key, offset)] for node, log in logs.items() if (key, offset) in log}
        assert value in held.values() and set(held.values()) == {value}, (key, offset, value, held)
    # And the other way round: a record in the logs whose send the history gave an offset sits
    # at it, or is a second copy written by a retry (no idempotence), the first at that offset.
    duplicates = 0
    for node, log in logs.items():
        for (key, offset), value in log.items():
            known = recorded.get((key, value), (None,))[0]
            if known not in (None, offset):
                assert log.get((key, known)) == value, (node, key, offset, value, known)
                duplicates += 1
    kept = sum(1 for k, v, off in tap.acks if recorded[(k, v)][1] == "info")
    written_unacknowledged = {(k, v) for log in logs.values() for (k, _), v in log.items()
                              if recorded.get((k, v), (0,))[0] is None}
    print(f"{len(tap.acks)} acknowledgements, {kept} of them on info sends; faults {dict(faults)}; "
          f"{len(written_unacknowledged)} values in the logs whose send has no offset; {duplicates} copies "
          f"written by retries")
    finals = [o for o in ops if o["f"] == "final-reads" and o["type"] == "ok"]
    assert len(finals) == spec.concurrency
    results = check_paths([run_dir], engine="python")[0].results
    assert results["valid"] is True, results.get("unknown_reasons") or results.get("counts")
