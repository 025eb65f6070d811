"""The `faultline` command line as a user meets it: check's verdicts and exit
statuses, the run spec from a TOML file and flags, and Ctrl-C during a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from faultline.models.history import write_history
from faultline.models.spec import SpecError
from faultline.runner.cli import _spec_from_args, build_parser
from faultline.control.wait import wait_until
from tests.e2e.test_run import NOTHING_LEFT, leftovers

REPO = Path(__file__).resolve().parent.parent


def op(index, process, type_, f, **fields):
    return {"index": index, "time": index * 10, "process": process, "type": type_, "f": f, **fields}


def sends_and_reads(values_read: list[tuple[int, int]]) -> list[dict]:
    """Process 0 sends values 1 and 2 to t/0; process 1 reads `values_read` as (offset, value)."""
    records = [{"key": "t/0", "offset": o, "value": v} for o, v in values_read]
    return [
        op(0, 0, "invoke", "send", mops=[{"f": "send", "key": "t/0", "value": 1},
                                         {"f": "send", "key": "t/0", "value": 2}]),
        op(1, 0, "ok", "send", mops=[{"f": "send", "key": "t/0", "value": 1, "offset": 0},
                                     {"f": "send", "key": "t/0", "value": 2, "offset": 1}]),
        op(2, 1, "invoke", "assign", keys=["t/0"], seek_to_beginning=True),
        op(3, 1, "ok", "assign", keys=["t/0"], seek_to_beginning=True),
        op(4, 1, "invoke", "poll", mops=[{"f": "poll"}]),
        op(5, 1, "ok", "poll", mops=[{"f": "poll", "records": records}]),
    ]


def good_dup_broken(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Three store folders: a valid history, one with a duplicate, one whose line 4 is bad JSON."""
    good, dup, broken = tmp_path / "good", tmp_path / "dup", tmp_path / "broken"
    for d in (good, dup, broken):
        d.mkdir()
    write_history(good / "history.jsonl", sends_and_reads([(0, 1), (1, 2)]))
    write_history(dup / "history.jsonl", sends_and_reads([(0, 1), (1, 2), (2, 1)]))
    lines = sends_and_reads([(0, 1), (1, 2)])
    (broken / "history.jsonl").write_text(
        "\n".join(json.dumps(line) for line in lines[:3]) + "\n{not json\n" + json.dumps(lines[4]) + "\n")
    return good, dup, broken


@pytest.mark.parametrize("engine", ["spark", "python"])
def test_check_gives_each_history_its_verdict_and_the_worst_exit_status(tmp_path, engine):
    good, dup, broken = good_dup_broken(tmp_path)

    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", str(good), str(dup),
                           str(broken), "--no-progress", "--engine", engine], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    good_r = json.loads((good / "results.json").read_text())
    dup_r = json.loads((dup / "results.json").read_text())
    broken_r = json.loads((broken / "results.json").read_text())
    assert good_r["valid"] is True and good_r["model"] == "exactly-once"
    assert "no test.json" in " ".join(good_r.get("notes", []))
    assert dup_r["valid"] is False and dup_r["bad_anomaly_types"] == ["duplicate"]
    witness = dup_r["anomalies"]["duplicate"][0]
    assert witness["ops"] and "value 1 of t/0" in witness["explanation"]
    assert broken_r["valid"] == "unknown"
    assert "history.jsonl:4" in broken_r["error"] and "bad JSON" in broken_r["error"]
    assert "history.jsonl:4" in proc.stdout

    # The same duplicate under at-least-once is allowed: valid, and exit 0.
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", str(dup), "--model",
                           "at-least-once", "--no-progress", "--engine", engine], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dup_r = json.loads((dup / "results.json").read_text())
    assert dup_r["anomaly_types"] == ["duplicate"] and dup_r["bad_anomaly_types"] == []


def test_explain_model_prints_each_type_forbidden_or_allowed_and_why(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    spec = {"producer": {"acks": "all", "enable.idempotence": "true"}, "consumer": {},
            "broker_settings": {"min.insync.replicas": "1"}, "nemesis": ["kill-leader"]}
    (run / "test.json").write_text(json.dumps(spec))

    def explain(*extra):
        proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", "--explain-model", str(run),
                               *extra], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    out = explain()
    assert "model at-most-once (min.insync.replicas=1 with faults kill-leader: acknowledged writes may be lost)" in out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert lines["allowed   lost-write"].endswith("min.insync.replicas=1 with faults kill-leader: acks=all waits "
                                                  "only for the in-sync replicas, which may be the leader alone, "
                                                  "and such writes are lost if it fails)")
    assert "only no-duplicates rules it out, and the run claims it (because enable.idempotence=true" in (
        lines["FORBIDDEN duplicate"])
    assert "FORBIDDEN uncommitted-read" in lines and "allowed   G1c-ww" in lines
    assert "FORBIDDEN any type not listed above (fail closed" in out
    assert not (run / "results.json").exists(), "explaining a model checks nothing"
    # --model overrides the run's settings
    assert "  FORBIDDEN lost-write: only no-loss rules it out, and the run claims it (because the model named " \
           "exactly-once claims it)" in explain("--model", "exactly-once")
    # What the history shows refines the model as the check does: its processes subscribe, and no
    # operation both sends and polls.
    lines = [{"index": 0, "time": 1, "process": 0, "type": "invoke", "f": "subscribe", "keys": ["t/0"]},
             {"index": 1, "time": 2, "process": 0, "type": "ok", "f": "subscribe", "keys": ["t/0"]}]
    (run / "history.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = explain()
    assert "not claimed consumer-order" in out and "because the history's processes subscribe" in out
    assert "claimed     atomic-transactions" in out and "no operation of the history both sends and polls" in out
    assert not (run / "results.json").exists()


def test_run_spec_merges_toml_and_flags(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text('name = "mine"\nrate = 50\ntime-limit = 12\n[producer]\nacks = "1"\n')
    args = build_parser().parse_args(["run", "--config", str(toml), "--rate", "75", "--producer", "linger.ms=3"])
    spec = _spec_from_args(args)
    assert (spec.name, spec.rate, spec.time_limit) == ("mine", 75, 12)
    assert spec.producer["acks"] == "1" and spec.producer["linger.ms"] == "3"
    assert spec.producer["enable.idempotence"] == "true", "defaults stay unless overridden"


def test_clock_offsets_are_whole_seconds_for_broker_nodes():
    parse = build_parser().parse_args
    spec = _spec_from_args(parse(["run", "--nodes", "3", "--clock-offset", "n2=-30", "--clock-offset", "n3=+5"]))
    assert spec.clock_offsets == {"n2": -30, "n3": 5}
    with pytest.raises(SpecError, match="the broker nodes are n1, n2, n3"):
        _spec_from_args(parse(["run", "--nodes", "3", "--clock-offset", "zk1=10"]))
    with pytest.raises(SpecError, match="give whole seconds, for example --clock-offset n1=-30"):
        _spec_from_args(parse(["run", "--clock-offset", "n1=1.5"]))


def test_run_flags_with_bad_values_are_refused_with_the_reason():
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "run", "--nodes", "1",
                           "--replication-factor", "3"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "replication-factor=3 needs that many nodes" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "run", "--nodes", "3",
                           "--zookeeper-nodes", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give --zookeeper-nodes 1 or more" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "run", "--nodes", "3",
                           "--zookeeper-nodes", "2"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "use an odd number" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_ctrl_c_during_a_run_cleans_up_and_still_checks(tmp_path):
    store = tmp_path / "store"
    run = subprocess.Popen([sys.executable, "-m", "faultline.runner.cli", "run", "--time-limit", "120",
                            "--store", str(store), "--no-progress"], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        history = lambda: next(store.glob("queue/*/history.jsonl"), None)  # noqa: E731
        wait_until(lambda: history() and history().stat().st_size > 2000, 90, "the run recorded nothing")
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=300)
        assert "interrupted" in out
        assert leftovers() == NOTHING_LEFT
        results = json.loads((history().parent / "results.json").read_text())
        assert results["valid"] in (True, False, "unknown") and results["stats"]["ops"] > 0
    finally:
        if run.poll() is None:
            run.kill()
            subprocess.run([sys.executable, "-m", "faultline.runner.cli", "cleanup"], cwd=REPO)
