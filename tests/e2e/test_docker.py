"""`faultline run --backend docker`: ZooKeeper and three reference brokers in containers on a
private dockerd, under partitions, kills and pauses; and what a run whose set-up fails says."""

from __future__ import annotations

import json
import os

import pytest

from faultline.control.registry import read_registry
from faultline.models.history import read_history
from tests.e2e.test_cluster import summary
from tests.e2e.test_run import NOTHING_LEFT, faultline, leftovers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the Docker backend's tests start a dockerd as root")


def test_a_docker_run_under_partitions_kills_and_pauses_is_valid_and_leaves_nothing(tmp_path, node_image):
    store = tmp_path / "store"
    proc = faultline("run", "--backend", "docker", "--nodes", "3", "--nemesis", "partition,kill,pause",
                     "--nemesis-interval", "6", "--time-limit", "60", "--seed", "5", "--engine", "python",
                     "--broker-set", "min.insync.replicas=2", "--store", str(store), "--no-progress", timeout=900)
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results["valid"] is True, summary(results)
    history = read_history(run_dir / "history.jsonl").ops
    faults = {op["f"] for op in history if op["process"] == "nemesis" and op["type"] == "info"}
    assert {"start-partition", "kill", "pause", "heal"} <= faults, faults
    sent = [op for op in history if op["type"] == "ok" and op["f"] == "send"]
    assert len(sent) > 300, len(sent)
    test = json.loads((run_dir / "test.json").read_text())
    assert test["backend"] == "docker"
    # Each container's logs, collected before it was removed.
    for node in ("n1", "n2", "n3"):
        text = (run_dir / "nodes" / node / "broker.log").read_text()
        assert f"registered as broker {node[1:]} in ZooKeeper" in text and "shut down cleanly" in text, node
    assert (run_dir / "nodes" / "zk1" / "zookeeper.log").stat().st_size > 0
    assert leftovers() == NOTHING_LEFT
    assert not read_registry()


def test_without_a_docker_daemon_the_run_ends_with_one_paragraph_and_an_unknown_verdict(tmp_path):
    env_host = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = f"unix://{tmp_path}/no-daemon.sock"
    try:
        proc = faultline("run", "--backend", "docker", "--time-limit", "5", "--engine", "python",
                         "--store", str(tmp_path / "store"), "--no-progress", timeout=120)
    finally:
        if env_host is None:
            os.environ.pop("DOCKER_HOST")
        else:
            os.environ["DOCKER_HOST"] = env_host
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("faultline run: set-up failed, so nothing was tested (verdict unknown, exit status 2): "
                           f"no Docker daemon answers at unix://{tmp_path}/no-daemon.sock"), proc.stderr
    assert "start one" in last and "DOCKER_HOST" in last
    run_dir = (tmp_path / "store" / "queue" / "latest").resolve()
    assert json.loads((run_dir / "results.json").read_text())["valid"] == "unknown"
    assert "Traceback" in (run_dir / "harness-errors.jsonl").read_text()


def test_a_broker_that_cannot_start_ends_the_run_with_its_log_line_and_keeps_its_log(tmp_path):
    proc = faultline("run", "--time-limit", "5", "--engine", "python", "--broker-set", "log.segment.bytes=banana",
                     "--store", str(tmp_path / "store"), "--no-progress", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("faultline run: set-up failed, so nothing was tested (verdict unknown, exit status 2): "
                           "the broker on n1 exited while starting. Its log's last line: \"faultline broker: --set: "
                           "log.segment.bytes='banana' is invalid"), proc.stderr
    run_dir = (tmp_path / "store" / "queue" / "latest").resolve()
    assert f"{run_dir}/nodes/n1/" in last
    assert "banana" in (run_dir / "nodes" / "n1" / "broker.log").read_text()
    assert json.loads((run_dir / "results.json").read_text())["valid"] == "unknown"
    assert leftovers() == NOTHING_LEFT
