"""The report's timeline from Spark (spark_timeline) against the plain-Python reader
(timeline.read_timeline): on concurrent histories of every shape (tests/analysis/concurrent.py,
spread over seconds) the two give the same operations, throughput, quantiles, realtime lags,
unseen counts and faults; past MAX_POINTS both thin the same way."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultline.history_analysis import timeline as timeline_module
from faultline.history_analysis.spark_timeline import spark_timeline
from faultline.history_analysis.timeline import read_timeline
from faultline.models.history import write_history

from .concurrent import FAULTS
from .test_concurrent import build


def spread(lines: list[dict], rnd: random.Random) -> list[dict]:
    """The same lines, their times gaps of up to 40 ms (several seconds in all, never decreasing)."""
    t = 0
    out = []
    for line in lines:
        t += rnd.randint(0, 40_000_000)
        out.append({**line, "time": t})
    return out


def same(spark, path: Path) -> None:
    py = read_timeline(path)
    witnesses = [o.op for o in py.known.values()][::7]
    sp = spark_timeline(spark, path, witnesses)
    assert (sp.end, sp.completed, sp.never) == (py.end, py.completed, py.never)
    assert sp.ops == py.ops
    assert sp.known == {o: py.known[o] for o in witnesses}
    assert sp.faults == py.faults
    assert sp.throughput == py.throughput
    assert [s for s, _ in sp.quantiles] == [s for s, _ in py.quantiles]
    for (_, a), (_, b) in zip(sp.quantiles, py.quantiles):
        assert a == pytest.approx(b, abs=1e-9)
    assert [(x.time, x.process, x.key) for x in sp.lag] == [(x.time, x.process, x.key) for x in py.lag]
    assert [x.lag for x in sp.lag] == pytest.approx([x.lag for x in py.lag], abs=1e-9)
    assert sp.unseen == py.unseen


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                               HealthCheck.function_scoped_fixture])
@given(faults=st.lists(st.sampled_from([None, *FAULTS]), min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1),
       scale=st.integers(1, 3), subscribe=st.sampled_from([0.0, 0.5]))
def test_spark_draws_the_same_timeline_as_plain_python(spark, faults, seed, scale, subscribe):
    rec, _ = build(faults, seed, scale, atomic=0.5, subscribe=subscribe, consume=0.3, txns=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        write_history(path, spread(rec.lines, random.Random(seed)))
        same(spark, path)


def test_past_max_points_both_thin_the_same_way(spark, monkeypatch, tmp_path):
    rec, _ = build([None, None, "lost-write"], 11, 3, atomic=0.5, subscribe=0.5, txns=True)
    path = tmp_path / "history.jsonl"
    write_history(path, spread(rec.lines, random.Random(11)))
    full = read_timeline(path)
    # Low enough that every series is thinned.
    points = min(len(full.lag), sum(map(len, full.unseen.values())), full.completed) - 1
    monkeypatch.setattr(timeline_module, "MAX_POINTS", points)
    monkeypatch.setattr(timeline_module, "SLOWEST", max(1, points // 20))
    monkeypatch.setattr(timeline_module, "BINS", 20)
    monkeypatch.setattr("faultline.history_analysis.spark_timeline.MAX_POINTS", points)
    monkeypatch.setattr("faultline.history_analysis.spark_timeline.SLOWEST", max(1, points // 20))
    thin = read_timeline(path)
    assert len(thin.lag) < len(full.lag) and len(thin.ops) < len(full.ops)
    assert sum(map(len, thin.unseen.values())) < sum(map(len, full.unseen.values()))
    same(spark, path)


def test_a_history_too_large_for_memory_is_drawn_from_sparks_figures(spark, monkeypatch, tmp_path):
    from faultline.checker.check import check_paths
    from tests.test_report import PLOTS, invalid_run_with_faults

    folder = invalid_run_with_faults(tmp_path / "run")
    monkeypatch.setenv("FAULTLINE_REPORT_MAX_MB", "0.001")
    [checked] = check_paths([folder], spark=spark)
    text = (folder / "report.html").read_text()
    assert checked.results["valid"] is False and 'id="verdict">INVALID' in text
    assert "No plots" not in text
    assert all(f'id="plot-{p}"' in text and f'id="{p}-fault-1"' in text for p in PLOTS)
    assert 'id="witness-lost-write-0"' in text


def test_throughput_over_a_clock_gone_wrong_lists_only_busy_seconds_between_zeros():
    from faultline.history_analysis.timeline import Op, throughput_of

    # A history whose last completion is 31 years in: a list per second would not fit in memory.
    ops = [Op(1, 0, "send", "ok", 0.5, 2.5), Op(3, 0, "send", "info", 3.0, 1e9 + 0.5)]
    got = throughput_of(ops, 1e9 + 1)
    assert got["ok"] == [(1, 0), (2, 1), (3, 0), (999_999_999, 0), (1_000_000_000, 0)]
    assert got["info"] == [(1, 0), (2, 0), (3, 0), (999_999_999, 0), (1_000_000_000, 1)]
    assert got["fail"] == [(1, 0), (2, 0), (3, 0), (999_999_999, 0), (1_000_000_000, 0)]
    # A normal run: every second.
    assert throughput_of(ops[:1], 4.0)["ok"] == [(0, 0), (1, 0), (2, 1), (3, 0)]
