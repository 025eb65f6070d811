"""`faultline run --nodes 3`: ZooKeeper, three replicated brokers, leaders killed while producing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from faultline.control.wait import wait_until
from faultline.models.history import read_history
from tests.browser import load
from tests.e2e.test_run import NOTHING_LEFT, REPO, REPORT_PLOTS, faultline, leftovers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def run_with_leader_kills(store, seed: int, *extra: str) -> tuple[dict, list[dict], str]:
    proc = faultline("run", "--nodes", "3", "--replication-factor", "3", "--time-limit", "30",
                     "--rate", "3000", "--concurrency", "16", "--seed", str(seed), "--engine", "python",
                     "--nemesis", "kill-leader", "--nemesis-interval", "2.5",
                     "--store", str(store), "--no-progress", *extra, timeout=600)
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    history = read_history(run_dir / "history.jsonl").ops
    assert proc.returncode == {True: 0, False: 1, "unknown": 2}[results["valid"]], proc.stdout + proc.stderr
    return results, history, proc.stdout + proc.stderr


def summary(results: dict) -> str:
    """The verdict, and one explained witness of each anomaly type, for an assertion message."""
    lines = [f"valid={results['valid']} model={results['model']} counts={results.get('counts')}"]
    for kind, witnesses in results.get("anomalies", {}).items():
        if witnesses:
            lines.append(f"{kind}: {witnesses[0].get('explanation')} {witnesses[0]}")
    return "\n".join(lines)


def leader_kills(history: list[dict]) -> list[dict]:
    return [op for op in history if op["process"] == "nemesis" and op["f"] == "kill" and op["type"] == "info"
            and op["value"]["nodes"]]


@pytest.fixture
def backend(node_image) -> str:
    """The docker backend, after the session's dockerd and node image. The claims test
    (test_claims.py) runs the same faults on the namespace backend: acks=1 under leader kills and
    a power loss of every node."""
    return "docker"


def test_acks_1_loses_acknowledged_writes_when_the_leader_dies(tmp_path, backend):
    # With replica fetches that wait for 100 MB or 2 s, followers trail the leader by up to
    # 2 s of writes (less than replica.lag.time.max.ms, so they stay in the ISR and may be
    # elected): every leader kill loses the acks=1 writes its followers had not fetched.
    # With the default (a fetch answers as soon as there is data) the window is a few
    # milliseconds, and whether a run hits it is timing.
    results, history, output = run_with_leader_kills(
        tmp_path / "store", 1, "--producer", "acks=1", "--producer", "enable.idempotence=false",
        "--broker-set", "replica.fetch.min.bytes=100000000", "--broker-set", "replica.fetch.wait.max.ms=2000",
        "--backend", backend)
    assert leader_kills(history), output
    # acks=1 promises no durability: the loss is found, listed, and allowed by the run's own model.
    assert results["model"].startswith("best-effort"), summary(results)
    assert results["valid"] is True, summary(results)
    found = set(results["anomaly_types"]) & {"lost-write", "unseen"}
    assert found, summary(results)
    witness = results["anomalies"][sorted(found)[0]][0]
    assert "acknowledged" in witness["explanation"]
    assert leftovers() == NOTHING_LEFT
    # Judged by what acks=all with idempotence promises, the same history is invalid for that loss.
    run_dir = (tmp_path / "store" / "latest").resolve()
    strict = faultline("check", "--engine", "python", "--model", "exactly-once", "--no-progress", str(run_dir))
    assert strict.returncode == 1, strict.stdout + strict.stderr
    rejudged = json.loads((run_dir / "results.json").read_text())
    assert rejudged["valid"] is False and "lost-write" in rejudged["bad_anomaly_types"], summary(rejudged)
    # The report the check rewrote: the loss, its witness drawn against the leader kills shading every plot.
    report = run_dir / "report.html"
    kills = len([op for op in history if op["process"] == "nemesis" and op["f"] == "kill" and op["type"] == "info"])
    page = load(report.as_uri(), f"report-acks-1-leader-kills-{backend}.png",
                [*[f"#plot-{p} svg" for p in REPORT_PLOTS], *[f"[id^='{p}-fault-']" for p in REPORT_PLOTS],
                 "[id^='witness-lost-write-'] svg"], text_of=("#verdict",))
    assert page.console == [] and page.errors == [] and page.requests == [report.as_uri()]
    assert {p: page.counts[f"[id^='{p}-fault-']"] for p in REPORT_PLOTS} == {p: kills for p in REPORT_PLOTS}
    assert page.counts["[id^='witness-lost-write-'] svg"] >= 1 and page.texts["#verdict"] == "INVALID"


def test_partitions_and_pauses_on_a_cluster_with_acks_all_stay_valid_and_heal(tmp_path):
    store = tmp_path / "store"
    proc = faultline("run", "--nodes", "3", "--time-limit", "30", "--rate", "200", "--concurrency", "4",
                     "--seed", "11", "--nemesis", "partition,pause-leader", "--nemesis-interval", "4",
                     "--broker-set", "min.insync.replicas=2", "--store", str(store), "--no-progress", timeout=600)
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    history = read_history(run_dir / "history.jsonl").ops
    assert proc.returncode == 0, proc.stdout + proc.stderr
    faults = [op for op in history if op["process"] == "nemesis" and op["type"] == "info"]
    partitions = [op for op in faults if op["f"] == "start-partition"]
    assert partitions, proc.stdout + proc.stderr
    assert all("shape" in op["value"] and "grudge" in op["value"] for op in partitions)
    heal = [op for op in faults if op["f"] == "heal"]
    assert heal and "error" not in heal[-1], heal
    assert results["valid"] is True, summary(results)
    assert leftovers() == NOTHING_LEFT


def run_with_a_power_loss(store, *extra: str) -> tuple[dict, list[dict], dict]:
    # Seed 18's schedule at a 9 s interval: all three nodes lose power at about 8 s and come back
    # at about 21 s; the next fault would fall after the 30 s, so the cluster takes writes for
    # the last ~8 s and the final reads find a log to judge the earlier reads against.
    proc = faultline("run", "--nodes", "3", "--replication-factor", "3", "--time-limit", "30",
                     "--rate", "300", "--concurrency", "6", "--seed", "18", "--engine", "python",
                     "--nemesis", "power-loss-all",
                     "--nemesis-interval", "9", "--broker-set", "min.insync.replicas=2", "--store", str(store),
                     "--no-progress", *extra, timeout=600)
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    history = read_history(run_dir / "history.jsonl").ops
    assert proc.returncode == {True: 0, False: 1, "unknown": 2}[results["valid"]], proc.stdout + proc.stderr
    outages = [op for op in history if op["process"] == "nemesis" and op["f"] == "power-off" and op["type"] == "info"]
    assert [op["value"]["nodes"] for op in outages] == [["n1", "n2", "n3"]], proc.stdout + proc.stderr
    acknowledged = {(m["key"], m["value"]) for op in history if op["type"] == "ok" and op["process"] != "nemesis"
                    for m in op.get("mops") or [] if m["f"] == "send"}
    return results, outages, acknowledged


def test_a_simultaneous_power_loss_loses_acknowledged_writes_that_no_one_flushed(tmp_path, backend):
    # Kafka leaves flushing to the OS: acks=all means every in-sync replica has the batch in
    # its page cache, and a power loss of all of them at once takes it away.
    results, outages, acknowledged = run_with_a_power_loss(tmp_path / "lazy", "--backend", backend)
    assert sum(outages[0]["value"]["unsynced_bytes"].values()) > 0, outages
    # Kafka promises durability through replication, not fsync: the run's own model allows the loss.
    assert "log.flush.interval.messages" in results["model"], summary(results)
    assert results["valid"] is True, summary(results)
    # Judged by what acks=all, min.insync.replicas=2 promises without a power loss, it is invalid.
    run_dir = (tmp_path / "lazy" / "latest").resolve()
    strict = faultline("check", "--engine", "python", "--model", "exactly-once", "--no-progress", str(run_dir))
    assert strict.returncode == 1, strict.stdout + strict.stderr
    results = json.loads((run_dir / "results.json").read_text())
    # Lost acknowledged writes show as lost-write (gone from the final log) and, where they had
    # been read before the loss, as uncommitted-read too.
    lost = results["anomalies"].get("lost-write", [])
    reread = [w for w in results["anomalies"].get("uncommitted-read", []) if (w["key"], w["value"]) in acknowledged]
    assert "lost-write" in results["bad_anomaly_types"] and lost, summary(results)
    assert all("acknowledged" in w["explanation"] for w in lost)
    assert reread, summary(results)
    assert leftovers() == NOTHING_LEFT
    # With an fsync after every message the same schedule loses nothing: the claims test runs that
    # side (power-loss-without-fsync, safe) on the reference broker and on Kafka.


def test_cleanup_after_the_harness_is_killed_mid_partition(tmp_path):
    store = tmp_path / "store"
    run = subprocess.Popen([sys.executable, "-m", "faultline.runner.cli", "run", "--nodes", "3",
                            "--time-limit", "120", "--nemesis", "partition,power-loss", "--nemesis-interval", "1",
                            "--store", str(store), "--no-progress"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        history = store / "queue" / "latest" / "history.jsonl"

        def partitioned() -> bool:
            return history.exists() and any('"start-partition"' in line and '"info"' in line
                                            for line in history.read_text().splitlines())

        wait_until(partitioned, 120, "the run never partitioned its network")
        before = leftovers()
        assert len(before["namespaces"]) == 4, before  # n1..n3 and zk1
        # Some node drops packets (not necessarily n1: a bridge node, for one, keeps both sides).
        rules = [subprocess.run(["ip", "netns", "exec", n.split()[0], "iptables", "-S"], capture_output=True,
                                text=True).stdout for n in before["namespaces"]]
        assert any("FAULTLINE" in r for r in rules), rules
        assert len(before["mounts"]) >= 2, before  # the disks of the nodes that are powered on
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        cleaned = faultline("cleanup")
        assert cleaned.returncode == 0, cleaned.stderr
        # The rules lived in the namespaces; with them gone, no rule, process or link is left.
        assert leftovers() == NOTHING_LEFT, cleaned.stdout
        assert "FAULTLINE" not in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)  # reaped: a harness that is still a process would make cleanup spare its run
        faultline("cleanup")


