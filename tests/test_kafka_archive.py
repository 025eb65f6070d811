"""The class archive of Kafka's JVM (db/kafka_archive.py): a node of this machine starts with it
and really maps Kafka's classes from it; a node with a java of its own (a container's) starts
without it; a build that fails is noted once and runs go on without it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from faultline.db import kafka_archive, kafka_jars
from faultline.db.kafka import KafkaDB
from faultline.runner.cli import _spec_from_args, build_parser
from faultline.runner import testmap

VERSION = kafka_jars.DEFAULT_VERSION
JAVA = kafka_archive.host_java()
pytestmark = pytest.mark.skipif(JAVA is None or kafka_jars.resolved(VERSION) is None,
                                reason="needs java and Kafka's jars (scripts/setup)")


def kafka_db(tmp_path: Path, java: str) -> KafkaDB:
    spec = _spec_from_args(build_parser().parse_args(["run", "--db", "kafka", "--nodes", "3"]))
    nodes, support = testmap.node_names(spec)
    remotes = {n: SimpleNamespace(address=f"10.0.0.{i + 2}", java=java) for i, n in enumerate(nodes + support)}
    db = KafkaDB(spec, remotes, tmp_path)
    db.home = kafka_jars.resolved(VERSION)
    return db


def test_a_node_of_this_machine_maps_kafkas_classes_from_the_archive(tmp_path):
    archive = kafka_archive.ensure(VERSION, str(JAVA))
    assert archive is not None and archive.is_file()
    db = kafka_db(tmp_path, str(JAVA))
    db.node_dir("n1").mkdir(parents=True)
    broker = db.command("n1")
    assert f"-XX:SharedArchiveFile={archive}" in broker
    # The node's own JVM options and class path, but the storage tool's main class, so the JVM
    # exits at once: -Xshare:on makes it fail when the archive cannot be mapped, and the class
    # loading log says where kafka's classes came from.
    main = broker.index("kafka.Kafka")
    cmd = [*broker[:main], "-Xshare:on", "-Xlog:class+load=info", "kafka.tools.StorageTool", "random-uuid"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # Uuid is a class the broker loads too; the tool itself is not in the broker's archive.
    loaded = [line for line in proc.stdout.splitlines() if " org.apache.kafka.common.Uuid " in line]
    assert len(loaded) == 1 and loaded[0].endswith("source: shared objects file (top)"), loaded


def test_a_node_with_a_java_of_its_own_starts_without_the_archive(tmp_path):
    # A container's `java` is found on its own PATH: the archive of this machine's java is not its.
    db = kafka_db(tmp_path, "java")
    assert not any(arg.startswith("-XX:SharedArchiveFile") for arg in db.command("n1"))
    assert kafka_archive.ensure(VERSION, "java") is None
    assert kafka_archive.options(VERSION, "/opt/another-jdk/bin/java") == []


def test_a_failed_build_is_noted_once_and_nodes_start_without_it(tmp_path, monkeypatch):
    # A cache whose version folder has no jars: the training node cannot even find Kafka's main class.
    monkeypatch.setenv("FAULTLINE_KAFKA_CACHE", str(tmp_path))
    folder = tmp_path / "9.9.9"
    (folder / "lib").mkdir(parents=True)
    (folder / kafka_jars.log_config_name("9.9.9")).write_text("")
    (folder / kafka_jars.MARKER).write_text("9.9.9\n")
    told: list[str] = []
    assert kafka_archive.ensure("9.9.9", str(JAVA), told.append) is None
    note = kafka_archive.path("9.9.9", JAVA).with_suffix(".failed")
    assert "storage tool exited 1" in note.read_text()
    assert len(told) == 2 and "was not built" in told[1] and "--force 9.9.9" in told[1]
    # Noted: the next run neither tries again nor says it again.
    started = time.monotonic()
    assert kafka_archive.ensure("9.9.9", str(JAVA), told.append) is None
    assert time.monotonic() - started < 1 and len(told) == 2
    assert kafka_archive.options("9.9.9", str(JAVA)) == []
    monkeypatch.setenv(kafka_archive.USE_ENV, "0")
    assert kafka_archive.options(VERSION, str(JAVA)) == []
