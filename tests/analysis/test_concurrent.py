"""Property tests on concurrent histories (concurrent.py): operations of several processes overlap,
sends and polls mix in txns, consumers assign or subscribe (with rebalances), processes crash,
and the final reads are told where each log ends. The engines' rules are Jepsen's Kafka
checker's (issue 14; concurrent.py's docstring lists the ones its predictions follow).

- A correct history shows exactly what its concurrency explains: the chain witnesses of its
  rebalances (each backed by a rebalance_log that took the key away, or by the process joining
  the group), the int-send-skips of interleaved sends (by the version order, for sends of any
  outcome), the precommitted-reads of txns that read their own sends (concurrent.py says why each
  is correct for clients without transactions), every witness predicted one by one; no int- poll
  type (the rebalance_log names every key a rebalance moved inside an operation); the final reads
  reach every key's end_offsets.
- One injected fault per scenario shows exactly that fault's types (plus the above), with the
  witnesses that name it. A member whose membership expired overlaps the members that took its
  keys (ownership-overlap, each pair of holdings predicted).
- A group whose members process and commit explicitly shows exactly the duplicate- and
  lost-consumption its commits and crashes cause, every witness predicted.
- The verdict (faultline.checker.check.check, plain-Python engine, the model a real run of the
  project's default producer and consumer gets): plain sends and polls (no operation both sends
  and polls) from a correct log, with any interleaving and any rebalances, are valid; one
  injected fault makes the run invalid with exactly that fault's types bad.
- The Spark and plain-Python engines agree exactly (counts, examples, stats, notes, final_reads,
  dependencies, hubs) on every generated history.
- Cycles: none where every operation takes effect at one moment (but for a fault that places a
  write in the past); elsewhere G0, G1c-ww and G1c cycles are legal (no write isolation, no
  transactions), and which of them a run allows is the models' business, so only that a cycle
  stays within one scenario is asserted. Every dependency the engines derive (writers and readers
  of any outcome, joined directly) is a real order of effects in the simulated broker.

Examples per property come from the Hypothesis profile (tests/conftest.py). The Python-engine
properties take milliseconds a history; the Spark one packs many scenarios (own keys, own process
numbers) into each history, since one Spark analysis costs seconds whatever its size.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from faultline.checker.check import check
from faultline.checker.cycles import add_cycles
from faultline.history_analysis.reference import analyse as analyse_python
from faultline.history_analysis.result import TYPES, Analysis
from faultline.models.guarantees import for_history, model_for_settings
from faultline.models.history import read_history, write_history
from faultline.models.spec import DEFAULT_CONSUMER, DEFAULT_PRODUCER

from .concurrent import (FAULT_EXTRA, FAULT_TYPES, FAULTS, PREDICTED, PROCESS_SPAN, Recorder, Run, generate,
                         witness_id)
from .conftest import by_scenario

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                       HealthCheck.function_scoped_fixture])
# One Spark analysis costs seconds however small the history (about 5-15 s on 2 cores), so the
# agreement property runs one example per SPARK_SHARE examples of the profile (8 under `ci`), each
# a history of SPARK_BATCH scenarios: it checks at least as many scenarios as the profile's count.
SPARK_SHARE = 25
SPARK_BATCH = (25, 45)
SPARK_EXAMPLES = max(2, settings.default.max_examples // SPARK_SHARE)


def build(faults: list[str | None], seed: int, scale: int, atomic: float,
          subscribe: float, consume: float = 0.0, typed: float = 0.7, **shape) -> tuple[Recorder, list[Run]]:
    """One history of len(faults) scenarios one after another, each its own shape drawn from the seed:
    1 to scale + 1 workers running 5 * scale to 20 * scale operations, all effects of each operation
    at one moment with probability `atomic`, typed rebalance logs with probability `typed`, a group that
    processes and commits explicitly with probability `consume`; `shape`: further Scenario arguments
    (txns, first_ok). Hypothesis shrinks `scale` (smaller histories), the faults and the
    probabilities, and replays a seed exactly."""
    rnd = random.Random(seed)
    group = random.Random(seed + 1)  # its own stream, so that the others' stay as they were
    rec = Recorder()
    runs = [generate(rec, f"c{i}", rnd, fault, i * PROCESS_SPAN, concurrency=rnd.randint(1, scale + 1),
                     ops=rnd.randint(5 * scale, 20 * scale), atomic=rnd.random() < atomic, subscribe=subscribe,
                     typed=group.random() < typed, consume=group.random() < consume, **shape)
            for i, fault in enumerate(faults)]
    return rec, runs


def write(rec: Recorder, directory: str) -> Path:
    path = Path(directory) / "history.jsonl"
    write_history(path, rec.lines)
    read_history(path)  # the generator writes valid histories
    return path


def judge(analysis: Analysis, rec: Recorder, runs: list[Run]) -> None:
    """What every property asserts of an analysis of a generated history."""
    assert analysis.stats == rec.expected_stats()
    assert not any(n.startswith("uncommitted-read not judged") for n in analysis.notes), analysis.notes
    assert set(analysis.counts) <= set(TYPES)
    found = by_scenario(analysis.examples)
    lines = rec.lines
    owner = {r.name: r for r in runs}
    finals = {f["key"]: f for f in analysis.final_reads}
    for run in runs:
        got = found.get(run.name, {})
        what = (run.fault, run.injected, run.detail)
        if currently_in_test_context():  # what the examples covered (--hypothesis-show-statistics)
            event(f"fault {run.fault} {'injected' if run.injected else 'not injected'}")
            for kind, ws in run.witnesses.items():
                for cause in set(ws.values()):
                    event(f"{kind} from {cause}")
        assert set(got) == run.expected, (what, {t: ws[:3] for t, ws in got.items()})
        for kind in PREDICTED:
            predicted = run.witnesses.get(kind, {})
            assert {witness_id(kind, w) for w in got.get(kind, [])} == set(predicted), (kind, what)
            for wid, cause in predicted.items():
                # (Inside one operation a rebalance is no cause: the engines skip the keys the
                # operation's rebalance_log names, and it names every key a rebalance moved.)
                assert cause != "unexplained", (kind, wid, what)
                if cause == "rebalance":
                    explained_by_rebalance(lines, kind, wid)
        fault_witnesses(run, got)
        # The final reads reach every key's end, but for a lost record at the end of its key: the
        # readers step over it, short of the end the broker gave (the verdict is unknown there).
        for k in run.keys:
            end, _ = run.final_logs[k]
            f = finals[k]
            short = run.fault == "lost" and run.injected and (k, end - 1) == (run.detail["key"], run.detail["offset"])
            assert f["assign"] is not None and f["end"] == end, (k, f, what)
            assert f["complete"] == (not short) and f["read_to"] == end - short, (k, f, what)
    # Cycles belong to the scenario whose keys their steps name; none where operations are atomic,
    # but for the "inconsistent" fault, whose failed send the engines place at an old offset.
    cycles = add_cycles(Analysis(dependencies=analysis.dependencies, hubs=analysis.hubs), limit=100_000)
    for kind, witnesses in cycles.examples.items():
        if kind in TYPES:
            continue
        for w in witnesses:
            names = {s["key"].split("-t/")[0] for s in w["steps"] if s["key"]}
            assert len(names) == 1, (kind, w)
            run = owner[names.pop()]
            assert not run.atomic or run.fictional, (kind, w)
    # The dependencies and their nodes are exactly those predicted, scenario by scenario.
    for run in runs:
        assert {e for e in analysis.dependencies if e[3].split("-t/")[0] == run.name} == run.dependencies, run.name
        span = range(run.first_process, run.first_process + PROCESS_SPAN)
        assert {h[0] for h in analysis.hubs if h[2].isdigit() and int(h[2]) in span} == run.nodes, run.name
    # Every dependency is a real order of effects (but those through a write that never happened).
    for src, dst, kind, key in analysis.dependencies:
        run = owner[key.split("-t/")[0]]
        effects = run.effects
        assert src in effects and dst in effects, (src, dst, kind, key)
        if {src, dst} & run.fictional:
            continue
        before = effects[src].first_append[key]
        after = effects[dst].first_append[key] if kind == "ww" else effects[dst].last_read[key]
        assert before < after, (src, dst, kind, key)


def explained_by_rebalance(lines: list[dict], kind: str, wid: tuple) -> None:
    """Between the records, a rebalance moved the key away from the process (an entry of a
    rebalance_log without it), or the process joined the group (an ok subscribe: its positions
    come from the group's commits)."""
    process, key, _, _, (first, last) = wid
    # An untyped entry is the key set after a change; a typed one names the keys given or taken.
    assert any(line["process"] == process and line["type"] != "invoke"
               and (any((key in e["keys"]) if e.get("type") else (key not in e["keys"])
                        for e in line.get("rebalance_log") or [])
                    or (line["type"] == "ok" and line["f"] == "subscribe"))
               for line in lines[first:last + 1]), (kind, wid)


def fault_witnesses(run: Run, got: dict) -> None:
    d = run.detail
    if not run.injected:
        return
    if run.fault == "duplicate":
        [w] = got["duplicate"]
        assert (w["key"], w["value"], len(w["offsets"])) == (d["key"], d["value"], 2)
    elif run.fault == "unexpected":
        [w] = got["unexpected"]
        assert (w["key"], w["value"]) == (d["key"], d["value"])
    elif run.fault == "aborted":
        assert sorted((w["key"], w["value"]) for w in got["G1a"]) == sorted(set(map(tuple, d["values"])))
    elif run.fault == "lost":
        [w] = got["unseen"]
        assert (w["key"], w["values"], w["offsets"]) == (d["key"], [d["value"]], [d["offset"]])
        for w in got.get("lost-write", []):
            assert (w["key"], w["value"], w["offset"]) == (d["key"], d["value"], d["offset"])
    elif run.fault == "truncated":
        [w] = got["lost-write"]
        assert (w["key"], w["value"], w["offset"], w["final_value"]) == (d["key"], d["value"], d["offset"], None)
        assert w["final_end"] == w["final_read_to"] == d["offset"]
        if d["read"]:
            [u] = got["uncommitted-read"]
            assert (u["key"], u["offset"], u["value"]) == (d["key"], d["offset"], d["value"])
        else:
            [u] = got["unseen"]
            assert (u["key"], u["values"]) == (d["key"], [d["value"]])
    elif run.fault == "inconsistent":
        [w] = got["inconsistent-offsets"]
        assert (w["key"], w["offset"], w["values"]) == (d["key"], d["offset"], d["values"])
        [g] = got["G1a"]
        assert (g["key"], g["value"], g["offset"]) == (d["key"], d["value"], d["offset"])
    elif run.fault == "int-send-reorder":
        [w] = got["int-nonmonotonic-send"]
        assert (w["key"], w["prev_offset"], w["next_offset"]) == (d["key"], *d["offsets"])


def analyse_both_ways(spark, path: Path) -> Analysis:
    from faultline.history_analysis.anomalies import analyse

    analysis = analyse(spark, str(path), limit=100_000)
    oracle = analyse_python(path, limit=100_000)
    assert analysis.counts == oracle.counts
    for kind in set(analysis.examples) | set(oracle.examples):
        assert analysis.examples.get(kind) == oracle.examples.get(kind), kind
    assert analysis.stats == oracle.stats
    assert analysis.notes == oracle.notes
    assert analysis.final_reads == oracle.final_reads
    assert analysis.dependencies == oracle.dependencies
    assert analysis.hubs == oracle.hubs
    return analysis


shape = dict(seed=st.integers(0, 2**32 - 1), scale=st.integers(1, 4), atomic=st.sampled_from([0.0, 0.5, 1.0]),
             subscribe=st.sampled_from([0.0, 0.3, 0.8]), consume=st.sampled_from([0.0, 0.6]))


@settings(**SETTINGS)
@given(scenarios=st.integers(1, 3), **shape)
def test_a_correct_concurrent_history_shows_only_what_concurrency_explains(scenarios, seed, scale, atomic,
                                                                           subscribe, consume):
    rec, runs = build([None] * scenarios, seed, scale, atomic, subscribe, consume)
    with tempfile.TemporaryDirectory() as tmp:
        judge(analyse_python(write(rec, tmp), limit=100_000), rec, runs)


@settings(**SETTINGS)
@given(faults=st.lists(st.sampled_from(FAULTS[1:]), min_size=1, max_size=4), **shape)
def test_one_fault_in_a_concurrent_history_shows_exactly_its_anomalies(faults, seed, scale, atomic,
                                                                       subscribe, consume):
    rec, runs = build(faults, seed, scale, atomic, subscribe, consume)
    with tempfile.TemporaryDirectory() as tmp:
        judge(analyse_python(write(rec, tmp), limit=100_000), rec, runs)


# Faults whose anomaly no model forbids: an ownership overlap is reported, never held against a run
# (what it costs shows as consumption anomalies).
HARMLESS = ("expelled",)


@settings(**SETTINGS)
@given(seed=shape["seed"], scale=st.integers(2, 4), atomic=shape["atomic"], consume=shape["consume"])
def test_an_expelled_member_that_goes_on_polling_overlaps_the_members_that_took_its_keys(seed, scale, atomic,
                                                                                       consume):
    """A member whose membership expired while it was paused still holds its keys, as it believes,
    until its next poll says they were lost; a member that took one of them before then overlaps
    it (ownership-overlap, each witness predicted), and what both of them processed may repeat."""
    rec, runs = build(["expelled"], seed, scale, atomic, 0.8, consume, typed=1.0)
    if currently_in_test_context():
        event(f"overlap {'shown' if runs[0].injected else 'not shown'}")
    with tempfile.TemporaryDirectory() as tmp:
        judge(analyse_python(write(rec, tmp), limit=100_000), rec, runs)


def run_model(consumer_mode: str):
    """The model a real run gets with the project's default producer (acks=all, idempotent) and
    consumer, this consumer mode, default broker settings and no faults."""
    return model_for_settings(DEFAULT_PRODUCER, consumer_mode, {}, [], DEFAULT_CONSUMER)


@settings(**SETTINGS)
@given(fault=st.one_of(st.none(), st.sampled_from([f for f in FAULTS[1:] if f not in HARMLESS])),
       consumer_mode=st.sampled_from(["assign", "subscribe"]),
       seed=shape["seed"], scale=shape["scale"], atomic=shape["atomic"],
       subscribe=st.sampled_from([0.3, 0.8]))
def test_plain_sends_and_polls_of_a_correct_log_pass_the_run_and_one_fault_fails_it(fault, consumer_mode, seed,
                                                                                     scale, atomic, subscribe):
    """Issue 14's verdict-level property: plain sends and polls (no operation both sends and polls),
    any interleaving of concurrent operations, any rebalances (under subscribe), from a correct log:
    valid. With one injected fault: invalid, and the bad types are exactly that fault's (those the
    run predicts that the model forbids: the fault's own, and what it may add, FAULT_EXTRA); unknown
    instead when they are only unseen values on keys whose final reads are short of the end."""
    rec, [run] = build([fault], seed, scale, atomic, subscribe if consumer_mode == "subscribe" else 0.0,
                       txns=False, first_ok=True)
    assert rec.stats["mixed"] == 0
    model = run_model(consumer_mode)
    with tempfile.TemporaryDirectory() as tmp:
        results = check(write(rec, tmp), model, engine="python")
    what = (fault, run.injected, run.detail, results.get("unknown_reasons"))
    assert results["stats"]["mixed"] == 0
    if currently_in_test_context():  # what the examples covered (--hypothesis-show-statistics)
        event(f"{consumer_mode}: fault {fault} {'injected' if run.injected else 'not injected'}")
        for t in sorted(set(results["anomaly_types"]) - set(results["bad_anomaly_types"])):
            event(f"{consumer_mode}: allowed {t}")
    if not run.injected:
        assert results["bad_anomaly_types"] == [], (what, results["counts"])
        assert results["valid"] is True, what
        return
    judged = for_history(model, results["stats"])
    bad = {t for t in run.expected if judged.forbids(t)}
    assert FAULT_TYPES[fault] <= bad <= FAULT_TYPES[fault] | FAULT_EXTRA.get(fault, set()), (what, bad)
    assert set(results["bad_anomaly_types"]) == bad, (what, results["counts"])
    if bad <= set(results.get("unproven_anomaly_types", [])):
        # A lost value that was its key's last leaves the final reads short of the end: unseen
        # alone, before the final reads are done, proves no loss, and the run is unknown.
        assert (fault, results["valid"]) == ("lost", "unknown") and results["unknown_reasons"], what
        return
    assert results["valid"] is False, what


@settings(max_examples=SPARK_EXAMPLES, **SETTINGS)
@given(faults=st.lists(st.sampled_from(FAULTS), min_size=SPARK_BATCH[0], max_size=SPARK_BATCH[1]), **shape)
# Once found: a writer whose lowest value stood at a conflicting offset was placed by its next
# value instead, after writers whose appends it preceded.
@example(faults=["inconsistent", "truncated", "int-rewind", None, "inconsistent", "int-skip", None, None, None,
                 "int-send-reorder", "inconsistent"] + [None] * 9, seed=0, scale=3, atomic=0.5, subscribe=0.0,
         consume=0.0)
def test_the_engines_agree_on_concurrent_histories(spark, faults, seed, scale, atomic, subscribe, consume):
    rec, runs = build(faults, seed, scale, atomic, subscribe, consume)
    with tempfile.TemporaryDirectory() as tmp:
        judge(analyse_both_ways(spark, write(rec, tmp)), rec, runs)


# --- found while building these properties: reported, not fixed here ------------------

STARTED_ABOVE = [
    {"index": 0, "time": 10, "process": 0, "type": "invoke", "f": "send",
     "mops": [{"f": "send", "key": "t/0", "value": 1}]},
    {"index": 1, "time": 20, "process": 0, "type": "ok", "f": "send",
     "mops": [{"f": "send", "key": "t/0", "value": 1, "offset": 0}]},
    # No seek_to_beginning: the consumer may start anywhere, here at the log end (offset 1).
    {"index": 2, "time": 30, "process": 1, "type": "invoke", "f": "assign", "keys": ["t/0"]},
    {"index": 3, "time": 40, "process": 1, "type": "ok", "f": "assign", "keys": ["t/0"]},
    {"index": 4, "time": 50, "process": 0, "type": "invoke", "f": "send",
     "mops": [{"f": "send", "key": "t/0", "value": 2}]},
    {"index": 5, "time": 60, "process": 0, "type": "ok", "f": "send",
     "mops": [{"f": "send", "key": "t/0", "value": 2, "offset": 1}]},
    {"index": 6, "time": 70, "process": 1, "type": "invoke", "f": "poll", "mops": [{"f": "poll"}]},
    {"index": 7, "time": 80, "process": 1, "type": "ok", "f": "poll",
     "mops": [{"f": "poll", "records": [{"key": "t/0", "offset": 1, "value": 2}]}]},
]


@pytest.mark.xfail(strict=True, reason=(
    "reported: lost-write's first rule (a committed value no poll returned while 'some ok poll returned an "
    "offset > o', anomalies.py/reference.py) counts a consumer that started above o (an assign without "
    "seek_to_beginning, at the log end) as one that passed o; with final reads cut short a correct run is "
    "then invalid instead of unknown"))
def test_a_consumer_that_started_above_an_unread_value_does_not_make_it_lost(tmp_path):
    path = tmp_path / "history.jsonl"
    write_history(path, STARTED_ABOVE)
    # Value 1 is unread (unseen), not lost: a reader from the beginning would still return it.
    assert set(analyse_python(path, limit=100).counts) == {"unseen"}
