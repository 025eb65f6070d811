"""Verdicts held to Jepsen's Kafka semantics (issue 14): small hand-written histories with complete
final reads, checked end to end by `faultline check` (both engines), each rule both ways: where it
is an anomaly the run is invalid with exactly that type bad; its legal neighbour is valid.

Rules shown here at the verdict (the engines' witnesses are in test_anomalies.py):
- 1: a read from the future is G1c-realtime, bad for a run of plain sends and polls;
- 3: interleaved plain sends make write cycles (G0) that Kafka allows, unless the model claims
  write isolation;
- 10: the consumer mode comes from the history: a subscriber's poll-skip is allowed without
  test.json and under `--model exactly-once`, and the same skip by an assigned consumer is bad.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultline.checker.check import check_paths
from faultline.models.history import write_history
from faultline.models.spec import TestSpec

from .histories import Builder

ENGINES = ("python", "spark")


def _final_reads(b: Builder, ends: dict[str, list[int]]) -> None:
    """Final reads of every key to its end: ends maps key -> its values in offset order."""
    f = b.process()
    b.assign(f, sorted(ends), seek=True, ends={k: len(vs) for k, vs in ends.items()})
    b.poll(f, [(k, o, v) for k, vs in sorted(ends.items()) for o, v in enumerate(vs)])


def _store(tmp_path: Path, name: str, b: Builder, spec: bool) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    write_history(directory / "history.jsonl", b.lines)
    if spec:
        # A real run's test.json: acks=all with idempotence, three replicas, min.insync.replicas=2,
        # consumers assign, no faults, no transactions.
        settings = TestSpec(nodes=3, broker_settings={"min.insync.replicas": "2"}).to_json()
        (directory / "test.json").write_text(json.dumps(settings))
    return directory


def _check(directory: Path, engine: str, spark, model: str | None = None) -> dict:
    [checked] = check_paths([directory], engine=engine, spark=spark if engine == "spark" else None, model=model)
    return checked.results


def future_read(after: bool) -> Builder:
    b = Builder()
    k, c, p = "t/0", b.process(), b.process()
    b.assign(c, [k])
    if after:
        b.send(p, [(k, 1, 0)])
        b.poll(c, [(k, 0, 1)])
    else:
        b.poll(c, [(k, 0, 1)])
        b.send(p, [(k, 1, 0)])
    _final_reads(b, {k: [1]})
    return b


def interleaved_sends() -> Builder:
    b = Builder()
    k, j, p, q = "t/0", "t/1", b.process(), b.process()
    b.line(p, "invoke", "send", mops=[{"f": "send", "key": k, "value": 1}, {"f": "send", "key": j, "value": 2}])
    b.line(q, "invoke", "send", mops=[{"f": "send", "key": k, "value": 3}, {"f": "send", "key": j, "value": 4}])
    b.line(p, "ok", "send", mops=[{"f": "send", "key": k, "value": 1, "offset": 0},
                                  {"f": "send", "key": j, "value": 2, "offset": 1}])
    b.line(q, "ok", "send", mops=[{"f": "send", "key": k, "value": 3, "offset": 1},
                                  {"f": "send", "key": j, "value": 4, "offset": 0}])
    _final_reads(b, {k: [1, 3], j: [4, 2]})
    return b


def skipping_consumer(f: str) -> Builder:
    """A consumer (assigned, or subscribed) whose second poll starts two offsets on."""
    b = Builder()
    k, p, c = "t/0", b.process(), b.process()
    b.send(p, [(k, v, v - 1) for v in (1, 2, 3, 4)])
    b.assign(c, [k], f=f)
    b.poll(c, [(k, 0, 1)])
    b.poll(c, [(k, 3, 4)])
    _final_reads(b, {k: [1, 2, 3, 4]})
    return b


@pytest.fixture(scope="module")
def spark_session(request):
    return request.getfixturevalue("spark")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_read_from_the_future_fails_a_run_of_plain_sends_and_polls(tmp_path, engine, spark_session):
    results = _check(_store(tmp_path, "future", future_read(after=False), spec=True), engine, spark_session)
    assert (results["valid"], results["bad_anomaly_types"]) == (False, ["G1c-realtime"])
    assert results["anomalies"]["G1c-realtime"][0]["explanation"] == (
        "2 operations form a dependency cycle (op 3, op 5; 2 in its component): op 3 completed ok before the "
        "invocation of op 5; op 5 wrote a value of t/0 that was read by op 3, back to the first")
    results = _check(_store(tmp_path, "after", future_read(after=True), spec=True), engine, spark_session)
    assert (results["valid"], results["anomaly_types"]) == (True, [])


@pytest.mark.parametrize("engine", ENGINES)
def test_interleaved_plain_sends_are_valid_unless_the_model_claims_write_isolation(tmp_path, engine,
                                                                                    spark_session):
    directory = _store(tmp_path, "interleaved", interleaved_sends(), spec=True)
    results = _check(directory, engine, spark_session)
    assert (results["valid"], results["anomaly_types"], results["bad_anomaly_types"]) == (True, ["G0"], [])
    results = _check(directory, engine, spark_session, model="exactly-once+write-isolation")
    assert (results["valid"], results["bad_anomaly_types"]) == (False, ["G0"])


@pytest.mark.parametrize("engine", ENGINES)
def test_the_consumer_mode_comes_from_the_history(tmp_path, engine, spark_session):
    subscribed = _store(tmp_path, "subscribed", skipping_consumer("subscribe"), spec=False)
    for model in (None, "exactly-once"):
        results = _check(subscribed, engine, spark_session, model=model)
        assert (results["valid"], results["anomaly_types"], results["bad_anomaly_types"]) == (
            True, ["poll-skip"], []), model
    assigned = _store(tmp_path, "assigned", skipping_consumer("assign"), spec=False)
    results = _check(assigned, engine, spark_session)
    assert (results["valid"], results["bad_anomaly_types"]) == (False, ["poll-skip"])
