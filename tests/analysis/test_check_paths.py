"""`check_paths` of several small histories: analysed together in one Spark plan
(history_analysis.anomalies.analyse_many), every folder gets exactly the results it gets alone
(from the plain-Python engine, which gives the Spark analysis's results:
tests/analysis/test_jepsen_verdicts.py and the differential tests hold them to that); a history
that cannot be read, or a folder without one, gets its own unknown verdict and changes nothing for
the others; and when the analysis together fails, each is checked alone."""

from __future__ import annotations

import json
import random

from faultline.checker.check import batches, check_paths
from faultline.history_analysis import anomalies
from faultline.models.history import write_history

from .generate import generate
from .histories import Builder

FAULTS = [None, "duplicate", "lost", "write-cycle", "int-rewind", "aborted"]


def generated(fault: str | None, seed: int) -> tuple[Builder, set[str]]:
    b = Builder()
    return b, generate(b, "s", random.Random(seed), fault, 30).expected


def folders_with_faults(tmp_path) -> tuple[list, list[set[str]]]:
    folders, expected = [], []
    for i, fault in enumerate(FAULTS):
        # The first seed whose run the fault shows in (some faults need a write it can touch).
        seeds = (generated(fault, seed) for seed in range(50))
        b, kinds = next((b, kinds) for b, kinds in seeds if bool(kinds) == bool(fault))
        expected.append(kinds)
        folder = tmp_path / f"run-{i}"
        folder.mkdir()
        write_history(folder / "history.jsonl", b.lines)
        folders.append(folder)
    return folders, expected


def test_histories_checked_together_get_the_results_each_gets_alone(spark, tmp_path, monkeypatch):
    folders, expected = folders_with_faults(tmp_path)
    # A history refused at its third line, and a folder without one, among them.
    broken = tmp_path / "run-broken"
    broken.mkdir()
    lines = (folders[1] / "history.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"index":2', '"index":7')
    (broken / "history.jsonl").write_text("\n".join(lines) + "\n")
    empty = tmp_path / "run-empty"
    empty.mkdir()
    paths = [*folders[:3], broken, *folders[3:], empty]

    alone = [check_paths([f], engine="python", report=False)[0].results for f in paths]
    assert alone[3]["valid"] == "unknown" and f"{broken / 'history.jsonl'}:3: " in alone[3]["error"]
    assert alone[-1]["valid"] == "unknown" and "no such file" in alone[-1]["error"]

    calls = []
    real = anomalies.analyse_many

    def spied(spark, histories, *args, **kwargs):
        calls.append(list(histories))
        return real(spark, histories, *args, **kwargs)

    monkeypatch.setattr(anomalies, "analyse_many", spied)
    together = check_paths(paths, spark=spark)

    # One analysis of every folder with a history file, in the order given.
    assert calls == [[str(p / "history.jsonl") for p in paths[:-1]]]
    assert [c.directory for c in together] == paths
    assert [c.results for c in together] == alone
    assert [json.loads((f / "results.json").read_text()) for f in paths] == alone
    assert all((f / "report.html").exists() for f in paths)
    # Each history shows its own fault's anomalies, and the fault-free one none: results swapped
    # between folders, or mixed within the one analysis, would show here.
    assert alone[0]["valid"] is True and alone[0]["anomaly_types"] == []
    for results, kinds in zip(alone[1:3] + alone[4:-1], expected[1:]):
        assert kinds and kinds <= set(results["anomaly_types"]), (kinds, results["anomaly_types"])
    assert len({json.dumps(r["anomaly_types"]) for r in alone}) >= 4


def test_when_the_analysis_together_fails_each_history_is_checked_alone(spark, tmp_path, monkeypatch):
    folders, _ = folders_with_faults(tmp_path)
    folders = folders[:3]
    alone = [check_paths([f], engine="python", report=False)[0].results for f in folders]

    real = anomalies.analyse_many
    asked = []

    def failing(spark, histories, *args, **kwargs):
        asked.append(len(histories))
        if len(histories) > 1:
            raise RuntimeError("the executor was lost")
        return real(spark, histories, *args, **kwargs)

    monkeypatch.setattr(anomalies, "analyse_many", failing)
    together = check_paths(folders, spark=spark, report=False)
    assert asked == [3, 1, 1, 1]
    assert [c.results for c in together] == alone


def test_only_small_distinct_histories_are_batched(tmp_path, monkeypatch):
    from faultline.history_analysis import session as spark_session

    sizes = [10, 10, 200, 10, 10, 10, None]
    paths = []
    for i, size in enumerate(sizes):
        folder = tmp_path / f"run-{i}"
        folder.mkdir()
        if size is not None:
            (folder / "history.jsonl").write_bytes(b"x" * size)
        paths.append(folder)
    paths.append(paths[3])  # the same history twice
    monkeypatch.setattr(spark_session, "SMALL_INPUT_BYTES", 100)
    # Under 100 bytes in all per analysis; the large one, the absent one and the repeat alone.
    assert batches(paths, "spark") == [[0, 1], [2], [3, 4, 5], [6], [7]]
    assert batches(paths, "python") == [[i] for i in range(len(paths))]
