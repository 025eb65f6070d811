"""The Spark engine at the edges of its rules, held to the Python engine: offsets at the top of
64 bits (the highest offset, one below the largest long, and end offsets at the largest: no
arithmetic may overflow, Spark's ANSI mode would fail the analysis), the final-reads
record's outcome per key, and the stats' `mixed`. One history holds every scenario (each with its
own keys and processes), so one Spark analysis checks them all."""

from __future__ import annotations

import pytest

from faultline.checker.cycles import add_cycles
from faultline.history_analysis import session
from faultline.history_analysis.anomalies import analyse
from faultline.history_analysis.reference import analyse as analyse_python
from faultline.models.history import read_history, write_history

from .conftest import read_full
from .histories import Catalog

MAX = 2**63 - 1
TOP = MAX - 1  # the highest offset a record can have: one past it, where the log ends, is a long too

scenario = Catalog()


@scenario
def top_of_the_log(s):
    # A log ending at the highest offset: acknowledged sends and reads around it, a poll that skips
    # an offset another read showed, a send order that skips one, and a final chain that reads to
    # the end, which the broker puts at the largest long.
    k, p, q, c, f = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, TOP - 3), (k, 3, TOP - 1)])
    s.send(q, [(k, 2, TOP - 2), (k, 4, TOP)])
    s.assign(c, [k])
    s.poll(c, [(k, TOP - 3, 1)])
    s.poll(c, [(k, TOP - 1, 3), (k, TOP, 4)])
    s.poll(c, [(k, TOP, 4)])
    s.assign(f, [k], seek=True, ends={k: MAX})
    s.poll(f, [(k, TOP - 3, 1), (k, TOP - 2, 2), (k, TOP - 1, 3), (k, TOP, 4)])


@scenario
def read_beyond_a_top_final_log(s):
    # The final log holds TOP - 1 and its end is TOP: a value read at TOP is beyond the end; one
    # acknowledged at TOP is lost.
    k, p, c, f = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, TOP - 1)])
    s.poll(c, [(k, TOP, 9)])
    s.send(p, [(k, 2, TOP)])
    s.assign(f, [k], seek=True, ends={k: TOP})
    s.poll(f, [(k, TOP - 1, 1)])


@scenario
def final_read_outcomes(s):
    # The latest completed final-reads operation naming a key gives its outcome, passing over a
    # reader that learned nothing of the key (its predecessor's crash outlasted the final phase)
    # unless no other names it; one never completed says nothing; a key only a final-reads record
    # names is summarised too.
    k, j, m, only = s.key("0"), s.key("1"), s.key("2"), s.key("3")
    p, c, d = s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (j, 2, 0), (m, 3, 0)])
    s.assign(c, [k, j], seek=True)
    s.poll(c, [(k, 0, 1), (j, 0, 2)])
    first = [{"key": k, "end": 1, "read_to": 1, "outcome": "reached"},
             {"key": j, "end": None, "read_to": 1, "outcome": "unavailable"}]
    s.op(c, "final-reads", "ok", {}, {"final_reads": first})
    later = [{"key": k, "end": None, "read_to": 0, "outcome": "timeout"},
             {"key": j, "end": 1, "read_to": 0, "outcome": "timeout"},
             {"key": m, "read_to": 0, "outcome": "timeout"},  # `end` may be left out
             {"key": only, "end": None, "read_to": 0, "outcome": "unavailable"}]
    s.op(d, "final-reads", "info", {}, {"final_reads": later})
    s.op(s.process(), "final-reads", "ok", {}, completed=False)
    return {"k": k, "j": j, "m": m, "only": only}


@scenario
def a_later_readers_end(s):
    # Two final readers: the later rewind (reader a) is the final chain; it reads past a marker to
    # the end it heard (3) and hears it again. Then a transaction's coordinator writes another
    # marker, and reader b, still reading, hears of the end 4: the chain's log is whole to where
    # its own reader heard the log ends (and no record showed beyond), not short of another's.
    k, p, a, b = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1)])
    s.assign(b, [k], seek=True, ends={k: 3})
    chain = s.assign(a, [k], seek=True, ends={k: 3})
    s.poll(a, [(k, 0, 1), (k, 1, 2)], positions={k: 3})
    s.assign(a, [k], ends={k: 3})
    s.poll(b, [(k, 0, 1), (k, 1, 2)], positions={k: 4})
    s.assign(b, [k], ends={k: 4})
    return {"chain": chain}


@scenario
def mixed_operations(s):
    # Two operations that both send and poll (one failed), one that only sends.
    k, p, q = s.key(), s.process(), s.process()
    s.op(p, "txn", "ok", {"mops": [{"f": "send", "key": k, "value": 1}, {"f": "poll"}]},
         {"mops": [{"f": "send", "key": k, "value": 1, "offset": 0}, {"f": "poll", "records": []}]})
    s.op(q, "txn", "fail", {"mops": [{"f": "poll"}, {"f": "send", "key": k, "value": 2}]})
    s.send(p, [(k, 3, 1)])


@pytest.fixture(scope="module", params=["interpreted", "generated", "generated-one-partition"])
def both(request, spark, tmp_path_factory):
    # Histories below 1 MB run interpreted (session.sized_for); larger ones in generated code,
    # where Spark has bugs of its own (element_at(array, NULL) gave the last element), in one
    # shuffle partition below 64 MB: every way.
    builder, facts = scenario.build()
    path = tmp_path_factory.mktemp("edges") / "history.jsonl"
    write_history(path, builder.lines)
    read_history(path)
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "generated":
            # And in more shuffle partitions than a small history's one, as a large history is.
            mp.setattr(session, "SMALL_INPUT_BYTES", 0)
            mp.setattr(session, "shuffle_partitions_for", lambda nbytes: 7)
        elif request.param == "generated-one-partition":
            mp.setattr(session, "INTERPRETED_INPUT_BYTES", 0)
        spark_result = analyse(spark, str(path), limit=1000)
    return spark_result, analyse_python(path, limit=1000), builder, facts


def test_the_engines_agree_at_the_edges(both):
    spark_result, python_result, builder, _ = both
    assert spark_result.counts == python_result.counts
    assert spark_result.examples == python_result.examples
    assert (spark_result.stats, spark_result.notes) == (python_result.stats, python_result.notes)
    assert spark_result.dependencies == python_result.dependencies
    assert spark_result.hubs == python_result.hubs
    assert spark_result.final_reads == python_result.final_reads
    assert spark_result.stats == builder.stats()


def _of(analysis, name):
    return {kind: [w for w in ws if w["key"].startswith(f"{name}-t/")] for kind, ws in analysis.examples.items()
            if any(w["key"].startswith(f"{name}-t/") for w in ws)}


def test_offsets_at_the_top_of_64_bits(both):
    spark_result = both[0]
    found = _of(spark_result, "top_of_the_log")
    assert set(found) == {"poll-skip", "nonmonotonic-poll", "int-send-skip"}
    assert [(w["prev_offset"], w["next_offset"], w["skipped"]) for w in found["poll-skip"]] == \
        [(TOP - 3, TOP - 1, [TOP - 2])]
    assert [(w["prev_offset"], w["next_offset"]) for w in found["nonmonotonic-poll"]] == [(TOP, TOP)]
    assert sorted((w["prev_offset"], w["next_offset"], w["skipped"]) for w in found["int-send-skip"]) == \
        [(TOP - 3, TOP - 1, [TOP - 2]), (TOP - 2, TOP, [TOP - 1])]
    [summary] = [r for r in spark_result.final_reads if r["key"] == "top_of_the_log-t/0"]
    assert (summary["end"], summary["read_to"], summary["known_end"], summary["complete"]) == (MAX, MAX, MAX, True)
    found = _of(spark_result, "read_beyond_a_top_final_log")
    assert [(w["offset"], w["final_end"], w["final_read_to"]) for w in found["uncommitted-read"]] == \
        [(TOP, TOP, TOP)]
    assert [(w["offset"], w["final_value"], w["final_read_to"]) for w in found["lost-write"]] == [(TOP, None, TOP)]


def test_the_latest_completed_final_reads_record_that_says_anything_gives_the_outcome(both):
    spark_result, _, _, facts = both
    ix = facts["final_read_outcomes"]
    outcomes = {r["key"]: r["outcome"] for r in spark_result.final_reads}
    assert [outcomes[ix[k]] for k in ("k", "j", "m", "only")] == ["reached", "timeout", "timeout", "unavailable"]
    [only] = [r for r in spark_result.final_reads if r["key"] == ix["only"]]
    assert only == {"key": ix["only"], "assign": None, "end": None, "read_to": 0, "known_end": 0,
                    "late_end": 0, "complete": False, "outcome": "unavailable"}
    assert all(r["outcome"] is None for r in spark_result.final_reads if r["key"].startswith("top_of_the_log"))


def test_the_final_chain_is_read_to_where_its_own_reader_heard_the_log_ends(both):
    spark_result, _, _, facts = both
    [summary] = [r for r in spark_result.final_reads if r["key"] == "a_later_readers_end-t/0"]
    assert summary == {"key": "a_later_readers_end-t/0", "assign": facts["a_later_readers_end"]["chain"], "end": 3,
                       "read_to": 3, "known_end": 2, "late_end": 2, "complete": True, "outcome": None}
    assert not _of(spark_result, "a_later_readers_end")


def test_mixed_counts_operations_that_both_send_and_poll(both):
    assert both[0].stats["mixed"] == both[2].counts["mixed"] == 2


def test_the_engines_agree_on_the_catalog_in_generated_code(spark, tmp_path, monkeypatch):
    # test_anomalies.py holds the engines to each other on its catalog as Spark runs it there,
    # interpreted (a small history); here the same catalog in generated code.
    from .test_anomalies import scenario as catalog

    builder, _ = catalog.build()
    path = tmp_path / "history.jsonl"
    write_history(path, builder.lines)
    monkeypatch.setattr(session, "SMALL_INPUT_BYTES", 0)
    spark_result = add_cycles(analyse(spark, str(path), limit=2, full_dir=str(tmp_path / "spark")), limit=2,
                              full_dir=tmp_path / "spark")
    python_result = add_cycles(analyse_python(path, limit=2, full_dir=tmp_path / "python"), limit=2,
                               full_dir=tmp_path / "python")
    assert read_full(tmp_path / "spark") == read_full(tmp_path / "python")
    for field in ("counts", "examples", "stats", "notes", "dependencies", "hubs", "final_reads"):
        assert getattr(spark_result, field) == getattr(python_result, field), field
