"""Apache Kafka as a db, without a cluster: the spec's Kafka fields and flags, each layout's
server.properties, and what a user reads when Maven Central cannot be reached."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from faultline.db import DBS
from faultline.db import kafka_jars
from faultline.db.kafka import KafkaDB, cluster_id
from faultline.models.spec import SpecError, TestSpec
from faultline.runner import testmap
from faultline.runner.cli import _spec_from_args, build_parser


def spec_of(*argv: str) -> TestSpec:
    return _spec_from_args(build_parser().parse_args(["run", *argv]))


def db_for(spec: TestSpec, tmp_path: Path) -> KafkaDB:
    nodes, support = testmap.node_names(spec)
    remotes = {n: SimpleNamespace(address=f"10.0.0.{i + 2}") for i, n in enumerate(nodes + support)}
    return DBS["kafka"](spec, remotes, tmp_path)


def test_the_flags_make_a_kafka_spec_and_test_json_keeps_them():
    spec = spec_of("--db", "kafka", "--nodes", "3", "--kafka-version", "3.9.1", "--kafka-feature",
                   "eligible.leader.replicas.version=0", "--kafka-feature", "transaction.version=1",
                   "--kafka-controllers", "3")
    assert (spec.broker, spec.kafka_version, spec.kafka_mode, spec.kafka_controllers) == ("kafka", "3.9.1", "kraft", 3)
    assert spec.to_json()["kafka_features"] == {"eligible.leader.replicas.version": "0", "transaction.version": "1"}
    assert TestSpec.from_json(spec.to_json()) == spec
    # KRaft needs no ZooKeeper node; the reference cluster still gets one by default.
    assert testmap.node_names(spec) == (["n1", "n2", "n3", "c1", "c2", "c3"], [])
    assert testmap.node_names(spec_of("--nodes", "3")) == (["n1", "n2", "n3"], ["zk1"])
    zk = spec_of("--db", "kafka", "--nodes", "3", "--kafka-version", "3.9.1", "--kafka-mode", "zookeeper")
    assert testmap.node_names(zk) == (["n1", "n2", "n3"], ["zk1"])


@pytest.mark.parametrize("argv, message", [
    (["--kafka-version", "3.9.1"], "apply to Apache Kafka only"),
    (["--db", "kafka", "--kafka-mode", "zookeeper"], "has no ZooKeeper mode"),
    (["--db", "kafka", "--nodes", "3", "--zookeeper-nodes", "1"], "runs no ZooKeeper"),
    (["--db", "kafka", "--kafka-version", "3.9.1", "--kafka-mode", "zookeeper", "--kafka-controllers", "1"],
     "KRaft's"),
    (["--db", "kafka", "--kafka-feature", "transaction.version=two"], "whole number"),
    (["--db", "kafka", "--kafka-version", "latest"], "a version such as"),
    (["--workload", "txn"], "workload txn needs Kafka's transaction coordinator, which the reference broker does "
                            "not have yet; run it against Apache Kafka with --db kafka"),
])
def test_spec_errors_say_what_to_change(argv, message):
    with pytest.raises(SpecError, match=message):
        spec_of(*argv)


def test_kraft_combined_nodes_are_the_static_quorum(tmp_path):
    db = db_for(spec_of("--db", "kafka", "--nodes", "3", "--broker-set", "min.insync.replicas=2",
                        "--broker-set", "offsets.topic.num.partitions=50"), tmp_path)
    s = db.settings("n2")
    assert s["process.roles"] == "broker,controller" and s["node.id"] == "2"
    assert s["controller.quorum.voters"] == "1@10.0.0.2:9093,2@10.0.0.3:9093,3@10.0.0.4:9093"
    assert s["listeners"] == "PLAINTEXT://10.0.0.3:9092,CONTROLLER://10.0.0.3:9093"
    assert s["advertised.listeners"] == "PLAINTEXT://10.0.0.3:9092"
    assert s["log.dirs"] == str(tmp_path / "n2" / "data" / "kafka-logs")
    assert (s["offsets.topic.replication.factor"], s["transaction.state.log.replication.factor"],
            s["transaction.state.log.min.isr"], s["default.replication.factor"]) == ("3", "3", "2", "3")
    # --broker-set passes through unchanged and wins.
    assert s["min.insync.replicas"] == "2" and s["offsets.topic.num.partitions"] == "50"
    assert db.bootstrap == "10.0.0.2:9092,10.0.0.3:9092,10.0.0.4:9092"
    one = db_for(spec_of("--db", "kafka"), tmp_path).settings("n1")
    assert one["controller.quorum.voters"] == "1@10.0.0.2:9093"
    assert (one["offsets.topic.replication.factor"], one["transaction.state.log.min.isr"]) == ("1", "1")


def test_separate_controllers_and_zookeeper_mode(tmp_path):
    db = db_for(spec_of("--db", "kafka", "--nodes", "3", "--kafka-controllers", "3"), tmp_path)
    assert db.nodes == ["n1", "n2", "n3", "c1", "c2", "c3"] and db.support_nodes == []
    broker, controller = db.settings("n1"), db.settings("c2")
    assert broker["process.roles"] == "broker" and broker["listeners"] == "PLAINTEXT://10.0.0.2:9092"
    assert controller["process.roles"] == "controller" and controller["node.id"] == "102"
    assert controller["listeners"] == "CONTROLLER://10.0.0.6:9093" and "advertised.listeners" not in controller
    assert broker["controller.quorum.voters"] == "101@10.0.0.5:9093,102@10.0.0.6:9093,103@10.0.0.7:9093"
    assert db.node_of(102) == "c2" and db.port("c2") == 9093
    zk = db_for(spec_of("--db", "kafka", "--nodes", "3", "--kafka-version", "3.9.1", "--kafka-mode", "zookeeper"),
                tmp_path)
    s = zk.settings("n3")
    assert s["broker.id"] == "3" and s["zookeeper.connect"] == "10.0.0.5:2181" and "process.roles" not in s


def test_cluster_ids_are_kafka_uuids():
    ids = {cluster_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) == 22 and not i.startswith("-") for i in ids)


@pytest.mark.skipif(shutil.which("mvn") is None, reason="needs Maven")
def test_when_maven_central_cannot_be_reached_one_paragraph_says_so(tmp_path, monkeypatch):
    settings = tmp_path / "settings.xml"
    settings.write_text("<settings><mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>"
                        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>")
    monkeypatch.setenv("FAULTLINE_KAFKA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAULTLINE_MAVEN_ARGS", f"-s {settings} -Dmaven.repo.local={tmp_path / 'm2'}")
    lines = []
    with pytest.raises(kafka_jars.KafkaJarsError) as error:
        kafka_jars.resolve("3.9.1", progress=lines.append)
    assert "resolving Apache Kafka 3.9.1" in lines[0]
    message = str(error.value)
    assert "Maven Central could not be reached" in message and str(tmp_path / "cache" / "3.9.1") in message
    assert "Connection refused" in message
    assert not (tmp_path / "cache" / "3.9.1").exists()  # nothing half-resolved is left to be used
