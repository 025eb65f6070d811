"""`faultline run --db kafka`: Apache Kafka from its own jars, under the same workload, nemeses and
checker as the reference broker.

The jars come from faultline's cache (`~/.cache/faultline/kafka/<version>/`, which
`scripts/setup` fills); a version missing there is resolved from Maven Central first.
Each run is short (25-40 s of workload); the durations measured are in the README. The runs judged
whatever Kafka gives (`RUNS`) go two at a time, as `faultline claims --parallel 2` runs them, before
the first test that reads one; the runs whose timing decides what they show (a stale replica's
election, a SIGKILLed harness) run alone. Kafka's acks=1 loss, its loss to a power cut of every
node and read_uncommitted's aborted reads are shown by the claims run (tests/e2e/test_claims.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from faultline.control.wait import wait_until
from faultline.models.history import read_history
from tests.e2e.test_run import NOTHING_LEFT, faultline, leftovers

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def kafka_jvms() -> list[str]:
    """Kafka JVMs of faultline runs (their server.properties live in a run's work folder)."""
    out = subprocess.run(["pgrep", "-af", r"kafka\.Kafka /tmp/faultline-"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def everything_left() -> dict:
    return {**leftovers(), "kafka": kafka_jvms()}


NOTHING = {**NOTHING_LEFT, "kafka": []}


def run_kafka(store: Path, *args: str, timeout: float = 900, engine: str = "python"
              ) -> tuple[subprocess.CompletedProcess, Path, dict]:
    # The analysis tests hold the Spark engine to the plain-Python one; the runs here check with
    # Python (no JVM to start) but for one, which checks with Spark as `faultline run` does by default.
    started = time.monotonic()
    proc = faultline("run", "--db", "kafka", "--store", str(store), "--no-progress", "--engine", engine, *args,
                     timeout=timeout)
    print(f"faultline run --db kafka {' '.join(args)}: {time.monotonic() - started:.0f} s, exit {proc.returncode}")
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    return proc, run_dir, results


def faults(run_dir: Path) -> list[dict]:
    return [op for op in read_history(run_dir / "history.jsonl").ops
            if op["process"] == "nemesis" and op["type"] == "info" and op["f"] != "heal"]


def safe_run(version: str, seconds: int) -> tuple[tuple[str, ...], str]:
    # acks=all and idempotence are the default producer; RF 3 on 3 nodes; min.insync.replicas=2.
    return (("--kafka-version", version, "--nodes", "3", "--time-limit", str(seconds), "--rate", "60", "--seed", "21",
             "--broker-set", "min.insync.replicas=2", "--nemesis", "partition,kill,pause", "--nemesis-interval", "4"),
            "spark" if version == "4.3.1" else "python")


def subscribe_run(workload: str, protocol: str) -> tuple[tuple[str, ...], str]:
    # One consumer group on three Kafka 4.3.1 nodes; processes end now and then, so members leave
    # and join. A classic member that crashes while its JoinGroup waits at the coordinator cannot
    # leave (its LeaveGroup queues behind the join and times out), and the rebalance then waits
    # for its session to expire: at librdkafka's default of 45 s, longer than the run. Members
    # here get Kafka's least session (group.min.session.timeout.ms); KIP-848 members are timed by
    # the broker.
    session = ("--consumer", "session.timeout.ms=6000", "--consumer", "heartbeat.interval.ms=1000")
    return (("--workload", workload, "--consumer", f"group.protocol={protocol}",
             *(session if protocol == "classic" else ()), "--nodes", "3", "--time-limit", "25", "--rate", "60",
             "--seed", "5", "--broker-set", "min.insync.replicas=2", "--nemesis", "partition,kill",
             "--nemesis-interval", "5"), "python")


def consumption_run(workload: str, seed: int) -> tuple[tuple[str, ...], str]:
    # A killed member's partitions wait out its 6 s session before another member takes them: kills
    # 8 s apart leave the group time to settle and process between them (6 s apart in 30 s, a run in
    # about ten repeated nothing).
    return ("--workload", workload, "--nemesis", "kill-consumer", "--nemesis-interval", "4", "--time-limit", "40",
            "--seed", str(seed)), "python"


def resend_run(idempotence: str) -> tuple[tuple[str, ...], str]:
    # Sends time out under partitions (and die with their SIGKILLed producers); the application
    # sends what it never learned the fate of again, from its next process: a new producer session.
    return ("--workload", "resend", "--nodes", "3", "--broker-set", "min.insync.replicas=2",
            "--producer", f"enable.idempotence={idempotence}", "--nemesis", "partition,kill-producer",
            "--nemesis-interval", "4", "--time-limit", "40", "--rate", "60", "--seed", "2"), "python"


# The runs judged whatever Kafka gives them (the asserts hold for any timing), by the id of the test
# that reads each: (arguments of `faultline run --db kafka`, engine). The newest Kafka gets 40 s of
# faults, 3.9 30 s (the claims test runs acks-all-survives-faults on 4.3.1 too). A transactional
# queue on three Kafka 4.3.1 nodes: read_committed, a tenth of the transactions aborted on purpose.
RUNS = {
    "test_a_safe_run_under_partitions_kills_and_pauses_is_valid[4.3.1]": safe_run("4.3.1", 40),
    "test_a_safe_run_under_partitions_kills_and_pauses_is_valid[3.9.1]": safe_run("3.9.1", 30),
    "test_transactions_under_partitions_kills_and_pauses_are_judged_to_the_end_with_witnesses": (
        ("--workload", "txn", "--nodes", "3", "--time-limit", "40", "--rate", "60", "--seed", "3",
         "--broker-set", "min.insync.replicas=2", "--nemesis", "partition,kill,pause", "--nemesis-interval", "5"),
        "python"),
    "test_subscribing_consumers_under_partitions_and_kills_record_their_rebalances[subscribe-classic]":
        subscribe_run("subscribe", "classic"),
    "test_subscribing_consumers_under_partitions_and_kills_record_their_rebalances[txn-subscribe-consumer]":
        subscribe_run("txn-subscribe", "consumer"),
    "test_a_group_that_commits_after_processing_repeats_but_never_loses_what_killed_members_did":
        consumption_run("consume-after", 7),
    "test_an_auto_committing_group_loses_or_repeats_what_killed_members_did": consumption_run("consume-auto", 3),
    "test_an_idempotent_producer_repeats_only_what_the_application_sent_again_from_a_new_session[true]":
        resend_run("true"),
    "test_an_idempotent_producer_repeats_only_what_the_application_sent_again_from_a_new_session[false]":
        resend_run("false"),
}


@pytest.fixture(scope="module")
def judged_runs(request, tmp_path_factory) -> dict[str, Future]:
    """The runs of RUNS that the selected tests read, two at a time, all finished when it returns
    (each a Future of run_kafka's result, which raises what its run raised), so that no run of
    theirs is under way while another test runs or counts what is left."""
    wanted = [item.name for item in request.session.items if item.module is request.module and item.name in RUNS]
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(run_kafka, tmp_path_factory.mktemp("run") / "store", *RUNS[name][0],
                                     engine=RUNS[name][1]) for name in wanted}
    print(f"{len(futures)} Kafka runs, two at a time: {time.monotonic() - started:.0f} s")
    return futures


@pytest.fixture
def judged(request, judged_runs) -> tuple[subprocess.CompletedProcess, Path, dict]:
    """This test's run of RUNS: (process, run folder, results)."""
    return judged_runs[request.node.name].result()


@pytest.mark.parametrize("version", ["4.3.1", "3.9.1"])
def test_a_safe_run_under_partitions_kills_and_pauses_is_valid(judged, version):
    proc, run_dir, results = judged
    assert proc.returncode == 0 and results["valid"] is True, proc.stdout + proc.stderr
    assert results["model"] == "exactly-once"
    spec = json.loads((run_dir / "test.json").read_text())
    assert (spec["broker"], spec["kafka_version"], spec["kafka_mode"]) == ("kafka", version, "kraft")
    assert spec["replication_factor"] is None and spec["nodes"] == 3  # RF defaults to min(3, nodes)
    done = faults(run_dir)
    kinds = {op["f"] for op in done}
    assert len(done) >= 4 and kinds & {"start-partition", "kill", "pause"}, done
    assert any(op["value"].get("nodes") or op["value"].get("grudge") for op in done), done
    assert results["stats"]["by_f"]["send"]["ok"] > 100, results["stats"]
    for node in ("n1", "n2", "n3"):
        folder = run_dir / "nodes" / node
        for name in ("server.log", "controller.log", "kafka-gc.log", "server.properties", "format.log"):
            assert (folder / name).exists(), (node, name)
        assert f"Kafka version: {version}" in (folder / "server.log").read_text(), node
        props = (folder / "server.properties").read_text()
        assert "min.insync.replicas=2" in props and "offsets.topic.replication.factor=3" in props
    assert everything_left() == NOTHING


def test_cleanup_after_a_sigkilled_kafka_run_leaves_no_kafka_jvm(tmp_path):
    store = tmp_path / "store"
    run = subprocess.Popen([sys.executable, "-m", "faultline.runner.cli", "run", "--db", "kafka", "--nodes", "3",
                            "--time-limit", "120", "--store", str(store), "--no-progress"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(kafka_jvms()) == 3, 180, "the run never started its three Kafka JVMs")
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        assert len(kafka_jvms()) == 3, "the Kafka JVMs should outlive a SIGKILLed harness"
        cleaned = faultline("cleanup")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert "kafka.Kafka" in cleaned.stdout, cleaned.stdout
        assert everything_left() == NOTHING, cleaned.stdout
    finally:
        if run.poll() is None:
            run.kill()
        faultline("cleanup")


def run_stale_election_on_kafka(store: Path, unclean: bool) -> tuple[subprocess.CompletedProcess, Path, dict, list]:
    # Kafka 3.9 under ZooKeeper, where the controller is a broker that elects as soon as a
    # partition's leader is gone: a follower is killed until it leaves the ISR (lag limit 3 s)
    # while writes go on; then the replicas still in sync are killed and the stale one starts first.
    proc, run_dir, results = run_kafka(
        store, "--kafka-version", "3.9.1", "--kafka-mode", "zookeeper", "--nodes", "3", "--time-limit", "30",
        "--rate", "100", "--seed", "1", "--nemesis", "stale-election", "--nemesis-interval", "8",
        "--broker-set", f"unclean.leader.election.enable={str(unclean).lower()}",
        "--broker-set", "replica.lag.time.max.ms=3000")
    elections = [op["value"] for op in read_history(run_dir / "history.jsonl").ops
                 if op["process"] == "nemesis" and op["f"] == "elect-stale" and op["type"] == "info"]
    assert elections, proc.stdout + proc.stderr
    return proc, run_dir, results, elections


def test_unclean_election_on_kafka_3_9_loses_acknowledged_writes_and_clean_election_does_not(tmp_path):
    proc, run_dir, results, elections = run_stale_election_on_kafka(tmp_path / "unclean", unclean=True)
    print(f"unclean: elections {elections}, counts {results['counts']}")
    assert elections[0]["stale_elected"] is True, elections
    # The run's own model knows unclean election gives up acknowledged writes: allowed, reported.
    assert "unclean.leader.election.enable=true" in results["model"], results["model"]
    assert (proc.returncode, results["valid"]) == (0, True), proc.stdout + proc.stderr
    assert results["counts"].get("lost-write", 0) > 0, results["counts"]
    strict = faultline("check", "--engine", "python", "--model", "exactly-once", "--no-progress", str(run_dir))
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "lost-write" in json.loads((run_dir / "results.json").read_text())["bad_anomaly_types"]
    assert everything_left() == NOTHING

    proc, run_dir, results, elections = run_stale_election_on_kafka(tmp_path / "clean", unclean=False)
    print(f"clean: elections {elections}, counts {results['counts']}")
    assert elections[0]["stale_elected"] is False, elections
    assert (proc.returncode, results["valid"]) == (0, True), proc.stdout + proc.stderr
    assert not {"lost-write", "reused-offset", "unseen"} & set(results["counts"]), results["counts"]
    assert everything_left() == NOTHING


def witnesses(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "anomalies" / f"{kind}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def txn_ops(run_dir: Path) -> dict[int, dict]:
    return {op["index"]: op for op in read_history(run_dir / "history.jsonl").ops
            if op["f"] == "txn" and op["type"] != "invoke"}


def test_transactions_under_partitions_kills_and_pauses_are_judged_to_the_end_with_witnesses(judged):
    # Jepsen's transactional queue: whatever Kafka gives, the verdict is reached (final reads past
    # the transaction markers to every key's end) and every anomaly found has witnesses.
    proc, run_dir, results = judged
    print(f"txn on Kafka: counts {results['counts']}, stats {results['stats']['by_f']}")
    assert results["valid"] in (True, False), proc.stdout + proc.stderr
    assert proc.returncode == (0 if results["valid"] else 1)
    assert results["model"] == "exactly-once", results["model"]
    for kind in results["counts"]:
        assert witnesses(run_dir, kind), kind
    txns = txn_ops(run_dir)
    ok = [op for op in txns.values() if op["type"] == "ok"]
    aborted = [op for op in txns.values() if op["type"] == "fail" and op["error"] == "aborted on purpose"]
    assert len(ok) > 100 and aborted, results["stats"]
    # A committed transaction's sends all carry offsets; an aborted one's none.
    assert all(m["offset"] is not None for op in ok for m in op["mops"] if m["f"] == "send")
    assert all(m["offset"] is None for op in aborted for m in op["mops"] if m["f"] == "send")
    # The final reads went by where each consumer found the end, past the commit markers.
    finals = [op for op in read_history(run_dir / "history.jsonl").ops if op["f"] == "final-reads"
              and op["type"] == "ok"]
    assert finals and all(r["outcome"] == "reached" for op in finals for r in op["final_reads"])
    assert everything_left() == NOTHING


# The classic protocol (JoinGroup/SyncGroup, the client assigns) with plain polls; KIP-848's (the
# broker assigns, incrementally) with transactions that commit the group's offsets.
@pytest.mark.parametrize("workload, protocol", [("subscribe", "classic"), ("txn-subscribe", "consumer")])
def test_subscribing_consumers_under_partitions_and_kills_record_their_rebalances(judged, workload, protocol):
    # Whatever Kafka gives is judged to the end with witnesses.
    proc, run_dir, results = judged
    print(f"{workload} ({protocol}) on Kafka: counts {results['counts']}, stats {results['stats']['by_f']}")
    assert results["valid"] in (True, False), proc.stdout + proc.stderr
    assert proc.returncode == (0 if results["valid"] else 1)
    assert json.loads((run_dir / "test.json").read_text())["workload"] == workload
    for kind in results["counts"]:
        assert witnesses(run_dir, kind), kind
    ops = read_history(run_dir / "history.jsonl").ops
    logs = [e for op in ops if op["type"] != "invoke" for e in op.get("rebalance_log") or []]
    assert {e["type"] for e in logs} >= {"assigned"} and any(e["keys"] for e in logs), logs[:5]
    subscribes = [op for op in ops if op["f"] == "subscribe" and op["type"] == "ok"]
    # A member leaves when its process crashes on purpose or ends an operation whose outcome is
    # unknown (info: its successor opens new clients). Which of the two a run shows depends on how
    # many operations the faults let it finish: the crashes are a few percent of them.
    left = [op for op in ops if op["process"] != "nemesis" and op["type"] == "info" and not op.get("final")]
    assert left and len({op["process"] for op in subscribes}) > 4, "members left and new ones joined"
    assert everything_left() == NOTHING


def test_a_group_that_commits_after_processing_repeats_but_never_loses_what_killed_members_did(judged):
    # Members SIGKILLed between processing and committing leave their records to be processed again.
    proc, run_dir, results = judged
    print(f"consume-after: counts {results['counts']}")
    assert proc.returncode == 0 and results["valid"] is True, proc.stdout + proc.stderr
    assert results["counts"].get("duplicate-consumption", 0) > 0, results["counts"]
    assert "lost-consumption" not in results["counts"]
    kills = [op for op in faults(run_dir) if op["f"] == "kill-consumer" and op["value"].get("processes")]
    assert kills, faults(run_dir)
    ops = read_history(run_dir / "history.jsonl").ops
    dups = witnesses(run_dir, "duplicate-consumption")
    assert any(len(set(w["processes"])) >= 2 for w in dups), dups[:3]  # another member, after a kill
    for w in dups:
        # A member that processes a record twice had the record's partition taken and given back
        # between (a rebalance fetches from the committed offset again).
        for (p, a), (q, b) in zip(zip(w["processes"], w["ops"]), zip(w["processes"][1:], w["ops"][1:])):
            assert p != q or any(op["process"] == p and a < op["index"] < b and w["key"] in e["keys"]
                                 for op in ops for e in op.get("rebalance_log") or []), w
    assert any(op["f"] == "committed" and op["type"] == "ok" and op["offsets"] for op in ops)
    assert everything_left() == NOTHING and not subprocess.run(
        ["pgrep", "-f", "faultline.workloads.consumer_child"], capture_output=True).stdout


def test_an_auto_committing_group_loses_or_repeats_what_killed_members_did(judged):
    # librdkafka commits every second in the background, whatever the application has processed.
    proc, run_dir, results = judged
    print(f"consume-auto: counts {results['counts']}")
    assert proc.returncode == 0 and results["valid"] is True, proc.stdout + proc.stderr
    found = {k: results["counts"].get(k, 0) for k in ("lost-consumption", "duplicate-consumption")}
    assert sum(found.values()) > 0, results["counts"]
    # The nemesis kills members that hold partitions (one without has nothing to lose or repeat).
    kills = [op["value"] for op in faults(run_dir) if op["f"] == "kill-consumer" and op["value"].get("processes")]
    assert any(k.get("keys") for k in kills), kills
    spec = json.loads((run_dir / "test.json").read_text())
    assert spec["consumer"]["enable.auto.commit"] == "true"


# Idempotence holds within a producer session: with it off, the first session's own retries write a
# value the application then sends again a second time (more offsets than sessions: duplicate).
@pytest.mark.parametrize("idempotence", ["true", "false"])
def test_an_idempotent_producer_repeats_only_what_the_application_sent_again_from_a_new_session(judged,
                                                                                              idempotence):
    proc, run_dir, results = judged
    print(f"resend, enable.idempotence={idempotence}: counts {results['counts']}")
    # Neither is a bad duplicate: the idempotent run's model is exactly-once, the other's at-least-once.
    assert proc.returncode == 0 and results["valid"] is True, proc.stdout + proc.stderr
    assert [op for op in faults(run_dir) if op["f"] == "kill-producer" and op["value"].get("processes")]
    resent, twice = witnesses(run_dir, "resent-duplicate"), witnesses(run_dir, "duplicate")
    for w in resent:
        sessions = {s["process"] for s in w["sends"]}
        # Sent again after a send whose fate was unknown; each offset another session's one write.
        assert 2 <= len(w["offsets"]) <= len(sessions) and w["sends"][0]["type"] == "info", w
    for w in twice:
        assert len(w["offsets"]) > len({s["process"] for s in w["sends"]}), w  # a session wrote it twice
    if idempotence == "true":
        assert resent and not twice, results["counts"]
    else:
        assert twice, results["counts"]
    assert everything_left() == NOTHING and not subprocess.run(
        ["pgrep", "-f", "faultline.workloads.producer_child"], capture_output=True).stdout
