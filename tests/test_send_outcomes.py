"""What a history says of sends and repairs, on real reference-broker clusters in network
namespaces and real librdkafka clients, each fault placed deterministically by a scripted
generator run through the real interpreter, nemeses, heal and final reads:

- a send to two keys while one key's follower is paused, or its leader is cut off by a network
  partition: the other key's offset, which the broker acknowledged, is kept; the unacknowledged
  one is `info` (the leader wrote it: the final reads find it);
- bounded retries whose first attempt timed out (written by the leader) and whose last was
  refused (NOT_ENOUGH_REPLICAS): `info`, never `fail`, and the final reads find the value;
- a repair that fails (a killed broker that cannot start again) while another nemesis's repair
  succeeds: both outcomes recorded per node, the heal an `info` with the error, nothing read
  from the broken cluster, the final readers' record, and an unknown verdict naming why.

The rows of the outcome table are unit-tested in tests/test_client_outcomes.py."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from faultline.checker.check import check_paths
from faultline.control.local_cluster import LocalCluster
from faultline.control.net import Net
from faultline.control.wait import wait_until
from faultline.db.reference import ReferenceBrokerDB
from faultline.models.history import HistoryWriter, read_history
from faultline.models.spec import TestSpec
from faultline.nemesis import grudges
from faultline.nemesis.partition import PartitionNemesis
from faultline.nemesis.process import ClockNemesis, KillNemesis, PauseNemesis
from faultline.runner.interpreter import Interpreter, NemesisClient
from faultline.runner.store import create_run_dir
from faultline.runner.testmap import heal_and_final
from faultline.workloads import queue
from faultline.workloads.generator import Once, Phases, clients, nemesis
from faultline.workloads.queue import parse_key

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

# A send either waits for its follower (1 s, then REQUEST_TIMED_OUT) or is acknowledged at once.
ONE_ATTEMPT = {"acks": "all", "enable.idempotence": "false", "retries": "0", "request.timeout.ms": "1000",
               "message.timeout.ms": "5000", "linger.ms": "0"}


def spec_for(tmp_path: Path, nodes: int, producer: dict, **extra) -> TestSpec:
    return TestSpec(name="outcomes", nodes=nodes, replication_factor=min(nodes, 2), partitions=3, concurrency=1,
                    final_time_limit=30, producer=producer, store=str(tmp_path / "store"), seed=1, **extra)


def keys_around(db, spec: TestSpec, role: str) -> tuple[str, str, str]:
    """(node, key it is the `role` (leader or follower) of, key it holds no replica of)."""
    topic = spec.topic_names[0]
    replicas = {p: (db.leader(topic, p), db.in_sync_replicas(topic, p)) for p in range(spec.partitions)}
    for node in db.nodes:
        mine = [p for p, (leader, isr) in replicas.items()
                if node in isr and (leader == node) == (role == "leader")]
        other = [p for p, (leader, isr) in replicas.items() if node not in isr]
        if mine and other:
            return node, f"{topic}/{mine[0]}", f"{topic}/{other[0]}"
    raise AssertionError(f"no node is a {role} of one key and holds no replica of another: {replicas}")


class PauseThenCommit(PauseNemesis):
    """Pauses `node`; its heal resumes it and returns once the leader's high watermark of `key`
    reaches `end`. What the leader wrote while its follower was paused is committed only when the
    follower fetches it again (and, with the ISR below min.insync.replicas, not before the follower
    is back in it: KAFKA-15583); the final reads read to the high watermark they find."""

    def __init__(self, db, node: str, key: str, end: int):
        super().__init__(db, [node])
        self.key, self.end = key, end

    def heal(self):
        from confluent_kafka import Consumer, TopicPartition

        value = super().heal()
        consumer = Consumer({"bootstrap.servers": self.db.bootstrap, "group.id": "heal"})
        try:
            high = [None]

            def committed() -> bool:
                high[0] = consumer.get_watermark_offsets(TopicPartition(*parse_key(self.key)), timeout=5)[1]
                return high[0] >= self.end
            wait_until(committed, 60, lambda: f"{self.key}'s high watermark stayed {high[0]} < {self.end}")
        finally:
            consumer.close()
        return value


class QuickDB(ReferenceBrokerDB):
    ready_timeout = 30

    def wait_ready(self, node: str, timeout: float | None = None) -> None:
        super().wait_ready(node, self.ready_timeout if timeout is None else timeout)


def run(tmp_path: Path, spec: TestSpec, script, db_class=ReferenceBrokerDB) -> tuple[list[dict], Path, tuple]:
    """Start the spec's cluster, run `script(db, net)` -> (phases, nemeses, what it chose) followed
    by the heal and the workload's final reads, tear down; (history, run folder, what it chose)."""
    nodes = [f"n{i + 1}" for i in range(spec.nodes)] + [f"zk{i + 1}" for i in range(spec.effective_zookeeper_nodes)]
    run_dir = create_run_dir(spec)
    workdir = tmp_path / "work"
    cluster = LocalCluster.create("o" + secrets.token_hex(3), nodes, workdir)
    history = HistoryWriter(run_dir / "history.jsonl")
    try:
        db = db_class(spec, cluster.remotes, workdir)
        try:
            db.setup()
            db.create_topics(spec.topic_names, spec.partitions, spec.effective_replication_factor)
            phases, nemeses, chosen = script(db, Net(cluster.remotes) if spec.nodes > 1 else None)
            workload = queue.workload(spec)
            gen = Phases((*phases, *heal_and_final(workload)))
            Interpreter(gen, spec.concurrency, lambda process: workload.client(db.bootstrap, process), history,
                        NemesisClient({f: n for n in nemeses for f in n.fs})).run()
        finally:
            db.teardown(run_dir)
    finally:
        history.close()
        cluster.destroy()
    return read_history(run_dir / "history.jsonl").ops, run_dir, chosen


def send(*pairs) -> dict:
    return {"f": "send", "mops": [{"f": "send", "key": key, "value": value} for key, value in pairs]}


def completions(ops: list[dict], f: str) -> list[dict]:
    return [o for o in ops if o["f"] == f and o["type"] != "invoke"]


def final_log(ops: list[dict]) -> dict[tuple[str, int], int]:
    """(key, offset) -> value, of every record the final reads returned."""
    return {(r["key"], r["offset"]): r["value"] for o in completions(ops, "poll") if o.get("final")
            for m in o["mops"] for r in m["records"]}


def verdict(run_dir: Path) -> dict:
    return check_paths([run_dir], engine="python")[0].results


def assert_partly_acknowledged(ops, stalled, fine):
    warm, test = completions(ops, "send")
    assert warm["type"] == "ok", warm
    assert test["type"] == "info", test
    stalled_mop, fine_mop = test["mops"]
    assert fine_mop["key"] == fine and fine_mop["offset"] == warm["mops"][1]["offset"] + 1 and "error" not in fine_mop
    assert stalled_mop["key"] == stalled and stalled_mop["offset"] is None and "timed out" in stalled_mop["error"]
    assert test["error"] == stalled_mop["error"]
    finals = [o for o in completions(ops, "final-reads") if o["type"] == "ok"]
    assert finals and all(r["outcome"] == "reached" for o in finals for r in o["final_reads"]), finals
    assert final_log(ops)[(fine, fine_mop["offset"])] == fine_mop["value"], "the acknowledged offset holds it"
    return stalled_mop


def test_a_send_whose_follower_is_paused_keeps_the_other_keys_acknowledged_offset(tmp_path):
    spec = spec_for(tmp_path, 3, ONE_ATTEMPT)

    def script(db, net):
        node, stalled, fine = keys_around(db, spec, "follower")
        pause = PauseThenCommit(db, node, stalled, 2)  # its only candidate: the follower of `stalled`
        return ([clients(Once(send((stalled, 1), (fine, 2)))), nemesis(Once({"f": "pause", "seed": 1})),
                 clients(Once(send((stalled, 3), (fine, 4))))], [pause], (node, stalled, fine))

    ops, run_dir, (node, stalled, fine) = run(tmp_path, spec, script)
    mop = assert_partly_acknowledged(ops, stalled, fine)
    heal = completions(ops, "heal")[0]
    assert heal["value"] == {"PauseThenCommit": {"nodes": [node], "signal": "SIGCONT", "outcomes": {node: "healed"}}}
    assert "error" not in heal
    # The leader wrote it; once the follower was back it was committed, and the final reads read it.
    assert mop["value"] in final_log(ops).values()
    assert verdict(run_dir)["valid"] is True


def test_a_partition_cutting_off_one_keys_leader_keeps_the_other_keys_acknowledged_offset(tmp_path):
    spec = spec_for(tmp_path, 3, ONE_ATTEMPT, nemesis=["partition"])

    class Isolate(PartitionNemesis):
        def invoke(self, op):
            if op["f"] != "start-partition":
                return super().invoke(op)
            self.active = True
            return {"shape": "isolate", "node": self.nodes[0],
                    "grudge": self.net.drop(grudges.isolate(self.everyone, self.nodes[0]))}

    def script(db, net):
        node, stalled, fine = keys_around(db, spec, "leader")
        others = [n for n in db.nodes if n != node]
        cut = Isolate(net, db, [node, *others], db.support_nodes, spec.keys)
        return ([clients(Once(send((stalled, 1), (fine, 2)))), nemesis(Once({"f": "start-partition"})),
                 clients(Once(send((stalled, 3), (fine, 4))))], [cut], (node, stalled, fine))

    ops, run_dir, (node, stalled, fine) = run(tmp_path, spec, script)
    assert_partly_acknowledged(ops, stalled, fine)
    cut = completions(ops, "start-partition")[0]
    assert cut["value"]["node"] == node and sorted(cut["value"]["grudge"][node]) == sorted(
        [n for n in ("n1", "n2", "n3", "zk1") if n != node])
    heal = completions(ops, "heal")[0]
    assert heal["value"]["Isolate"]["outcomes"] == {n: "healed" for n in ("n1", "n2", "n3", "zk1")}
    assert "error" not in heal
    assert verdict(run_dir)["valid"] is True


def test_bounded_retries_whose_first_attempt_timed_out_end_indeterminate_not_failed(tmp_path):
    # Attempt 1: the leader appends, its follower is paused, the broker answers REQUEST_TIMED_OUT
    # after 0.5 s. The follower leaves the ISR (1.5 s); with the ISR below min.insync.replicas the
    # high watermark stays (KAFKA-15583). Attempt 2, 5 s later: ISR 1 < min.insync.replicas 2,
    # refused before the append: NOT_ENOUGH_REPLICAS, the last of retries=1. The value is in the
    # log, and committed once the resumed follower is back in the ISR.
    producer = {"acks": "all", "enable.idempotence": "false", "retries": "1", "request.timeout.ms": "500",
                "retry.backoff.ms": "5000", "retry.backoff.max.ms": "5000", "message.timeout.ms": "20000",
                "linger.ms": "0"}
    spec = spec_for(tmp_path, 3, producer, broker_settings={"min.insync.replicas": "2",
                                                            "replica.lag.time.max.ms": "1500"})

    def script(db, net):
        node, stalled, fine = keys_around(db, spec, "follower")
        return ([clients(Once(send((stalled, 1), (fine, 2)))), nemesis(Once({"f": "pause", "seed": 1})),
                 clients(Once(send((stalled, 3))))], [PauseThenCommit(db, node, stalled, 2)], (node, stalled, fine))

    ops, run_dir, (node, stalled, fine) = run(tmp_path, spec, script)
    warm, test = completions(ops, "send")
    assert warm["type"] == "ok"
    assert test["type"] == "info", "a refusal after a retry is not a failure"
    assert test["mops"] == [{"f": "send", "key": stalled, "value": 3, "offset": None,
                             "error": "Broker: Not enough in-sync replicas"}]
    assert final_log(ops)[(stalled, warm["mops"][0]["offset"] + 1)] == 3, \
        "the first attempt was written: recorded as fail, this read would be a G1a"
    assert verdict(run_dir)["valid"] is True


def test_a_repair_that_fails_is_recorded_per_node_the_others_still_run_and_nothing_is_read(tmp_path):
    spec = spec_for(tmp_path, 1, ONE_ATTEMPT, nemesis=["kill", "clock"])

    class BreakDisk:
        """Puts a file where the killed broker's data directory was: it cannot start again."""

        fs = ("break-disk",)

        def __init__(self, db):
            self.db = db

        def invoke(self, op):
            data = self.db.node_dir("n1") / "data"
            data.rename(data.with_name("data.moved"))
            data.write_text("not a directory\n")
            return {"nodes": ["n1"]}

        def heal(self):
            return {"outcomes": {}}

    def script(db, net):
        db.ready_timeout = 5  # after setup: the broken broker is waited for 5 s, not 30
        kill, clock = KillNemesis(db, ["n1"]), ClockNemesis(db, ["n1"])
        return ([clients(Once(send((spec.keys[0], 1)))), nemesis(Once({"f": "bump-clock", "seed": 2})),
                 nemesis(Once({"f": "kill", "seed": 1})), nemesis(Once({"f": "break-disk"}))],
                [kill, clock, BreakDisk(db)], None)

    ops, run_dir, _ = run(tmp_path, spec, script, QuickDB)
    kill = completions(ops, "kill")[0]
    assert kill["value"]["nodes"] == ["n1"] and kill["value"]["target"] == "random"
    heal = completions(ops, "heal")[0]
    assert heal["type"] == "info"
    failed = heal["value"]["KillNemesis"]
    # The db waits for a broker to serve, and says why it never did: it exited, refusing the data dir.
    assert failed["nodes"] == [] and failed["outcomes"]["n1"].startswith("n1: ")
    assert "the broker on n1 exited" in failed["outcomes"]["n1"] and "File exists" in failed["outcomes"]["n1"]
    assert heal["value"]["ClockNemesis"]["outcomes"] == {"n1": "healed"}, "the next repair ran all the same"
    assert heal["error"].startswith("KillNemesis: n1: ") and "the broker on n1 exited" in heal["error"]
    after = ops[heal["index"] + 1:]
    assert {o["f"] for o in after} == {"final-reads"}, "nothing is read from a cluster that was not healed"
    record = [o for o in after if o["type"] == "ok"][0]
    assert record["final_reads"] == [{"key": k, "end": None, "read_to": 0, "outcome": "unavailable"}
                                     for k in spec.keys]
    results = verdict(run_dir)
    assert results["valid"] == "unknown"
    assert any("the heal failed" in r and "n1" in r for r in results["unknown_reasons"]), results["unknown_reasons"]
