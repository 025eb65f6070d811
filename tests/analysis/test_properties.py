"""Property tests: histories of a correct broker show no anomaly; one injected
fault shows exactly its anomaly types (see generate.py for what each fault
must produce, and which types necessarily come with it); and the Spark and
plain-Python engines agree on every count, witness and note.

Each Spark analysis costs seconds, so one generated history holds several
independent scenarios (own keys, own processes), each with its own fault or
none, and the expectation is checked per scenario.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from unittest import mock

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from faultline.checker.cycles import add_cycles
from faultline.history_analysis import anomalies
from faultline.history_analysis.anomalies import analyse, analyse_many
from faultline.history_analysis.result import Analysis
from faultline.history_analysis.reference import analyse as analyse_python
from faultline.models.history import read_history, write_history

from .conftest import by_scenario, read_full
from .generate import FAULTS, generate
from .histories import Builder

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                       HealthCheck.function_scoped_fixture])


def check(spark, faults, rnd, steps):
    b = Builder()
    runs = [generate(b, f"s{i}", rnd, fault, steps) for i, fault in enumerate(faults)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        write_history(path, b.lines)
        read_history(path)  # the generator writes valid histories
        analysis = analyse(spark, str(path), limit=100_000)
        # Differential: the plain-Python engine, written separately, finds exactly the same.
        oracle = analyse_python(path, limit=100_000)
        assert analysis.counts == oracle.counts
        for kind in set(analysis.examples) | set(oracle.examples):
            assert analysis.examples.get(kind) == oracle.examples.get(kind), kind
        assert (analysis.stats, analysis.notes) == (oracle.stats, oracle.notes)
        assert analysis.dependencies == oracle.dependencies
        assert analysis.hubs == oracle.hubs
        assert analysis.final_reads == oracle.final_reads
        found = by_scenario(analysis.examples)
        # Cycles span keys: a cycle belongs to the scenario owning the keys of its steps.
        for kind, witnesses in add_cycles(Analysis(dependencies=analysis.dependencies, hubs=analysis.hubs),
                                            limit=100_000).examples.items():
            for w in witnesses:
                owners = {st["key"].split("-t/")[0] for st in w["steps"] if st["key"]}
                assert len(owners) == 1, w
                found.setdefault(owners.pop(), {}).setdefault(kind, []).append(w)
        for run in runs:
            got = found.get(run.name, {})
            assert set(got) == run.expected, (run.fault, run.detail, got)
            yield run, got
        assert analysis.stats == b.stats()
        assert not any(n.startswith("uncommitted-read not judged") for n in analysis.notes)


@settings(max_examples=5, **SETTINGS)
@given(scenarios=st.integers(1, 5), seed=st.integers(0, 2**32 - 1), steps=st.integers(5, 40))
def test_a_correct_broker_shows_no_anomaly(spark, scenarios, seed, steps):
    for run, got in check(spark, [None] * scenarios, random.Random(seed), steps):
        assert got == {}


# Each example is one Spark analysis (seconds): 7 drawn, besides the explicit examples below, each
# a history of up to 8 scenarios.
@settings(max_examples=7, **SETTINGS)
@given(faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1),
       steps=st.integers(5, 30))
# Once found: a failed send's value read at an offset that holds another value gave its writer a
# place in the version order, and a ww edge that closed a G0-realtime cycle with real time;
@example(faults=[None, None, "inconsistent"], seed=0, steps=5)
# and a failed poll's read of a failed send's value was expected to be no G1a (rule 9 makes it one).
@example(faults=["inconsistent"], seed=1, steps=8)
def test_one_fault_shows_exactly_its_anomalies(spark, faults, seed, steps):
    # The generator's choices come from the seed: Hypothesis shrinks the
    # faults and the length, and replays a failing seed exactly.
    for run, got in check(spark, faults, random.Random(seed), steps):
        d = run.detail
        if run.fault == "lost" and d:
            unseen = got["unseen"]
            assert [(w["key"], w["values"], w["offsets"]) for w in unseen] == [(d["key"], [d["value"]], [d["offset"]])]
            if "lost-write" in got:
                [w] = got["lost-write"]
                assert (w["key"], w["value"], w["offset"]) == (d["key"], d["value"], d["offset"])
                assert w["read_offset"] > d["offset"]
            for w in got.get("poll-skip", []):
                assert w["skipped"] == [d["offset"]] and w["skipped_count"] == 1
        elif run.fault == "duplicate" and d:
            [w] = got["duplicate"]
            assert (w["key"], w["value"], len(w["offsets"])) == (d["key"], d["value"], 2)
        elif run.fault == "unexpected":
            [w] = got["unexpected"]
            assert (w["key"], w["value"]) == (d["key"], d["value"])
        elif run.fault == "inconsistent" and d:
            [w] = got["inconsistent-offsets"]
            assert (w["key"], w["offset"], w["values"]) == (d["key"], d["offset"], d["values"])
            if d["poll"] == "ok":
                [u] = got["uncommitted-read"]
                assert (u["key"], u["offset"], u["value"]) == (d["key"], d["offset"], d["values"][1])
        elif run.fault == "truncated" and d:
            [w] = got["lost-write"]
            assert (w["key"], w["value"], w["offset"], w["final_value"]) == (d["key"], d["value"], d["offset"], None)
            assert w["final_end"] == w["final_read_to"] == d["offset"]
            if d["read"]:
                [u] = got["uncommitted-read"]
                assert (u["key"], u["offset"], u["value"], u["final_end"]) == (d["key"], d["offset"], d["value"],
                                                                              d["offset"])
        elif run.fault == "write-cycle" and d:
            [w] = got["G0"]
            assert w["size"] == 2 and {st["key"] for st in w["steps"]} == set(d["keys"])
            assert {st["type"] for st in w["steps"]} == {"ww"}


# Several histories in one analysis (analyse_many): each built alike (the same scenario names, so
# the same keys, processes and operation indices in every one), so that anything one history's
# answer took from another's would show against the plain-Python engine's answer for it alone.
@settings(max_examples=4, **SETTINGS)
@given(histories=st.lists(st.lists(st.sampled_from(FAULTS), min_size=1, max_size=3), min_size=2, max_size=5),
       seed=st.integers(0, 2**32 - 1), steps=st.integers(5, 20), limit=st.sampled_from([1, 100_000]))
def test_histories_analysed_together_each_get_what_they_get_alone(spark, histories, seed, steps, limit):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        paths, full = [], []
        for i, faults in enumerate(histories):
            b = Builder()
            for j, fault in enumerate(faults):
                generate(b, f"s{j}", rnd, fault, steps)
            paths.append(Path(tmp) / f"history-{i}.jsonl")
            full.append(Path(tmp) / f"full-{i}")
            write_history(paths[-1], b.lines)
        together = analyse_many(spark, [str(p) for p in paths], limit=limit, full_dirs=[str(d) for d in full])
        assert len(together) == len(paths)
        for path, directory, analysis in zip(paths, full, together):
            oracle_dir = directory.with_name(directory.name + "-python")
            oracle = analyse_python(path, limit=limit, full_dir=oracle_dir)
            assert analysis == oracle, path.name
            assert read_full(directory) == read_full(oracle_dir), path.name


# The facts join each event to its offset's row in a hash table while the offsets fit
# (anomalies._HASHED_OFFSETS), and by sorting both sides otherwise: the same answer either way.
@settings(max_examples=3, **SETTINGS)
@given(faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1),
       steps=st.integers(5, 20))
def test_the_offsets_joined_by_hash_or_by_sort_give_the_same_analysis(spark, faults, seed, steps):
    rnd = random.Random(seed)
    b = Builder()
    for i, fault in enumerate(faults):
        generate(b, f"s{i}", rnd, fault, steps)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        write_history(path, b.lines)
        hashed = analyse(spark, str(path), limit=100_000)
        with mock.patch.object(anomalies, "_HASHED_OFFSETS", -1):
            merged = analyse(spark, str(path), limit=100_000)
        assert hashed == merged == analyse_python(path, limit=100_000)
