"""`check_paths` of several small histories: checked two at a time, each in a Spark session of its
own, every folder gets exactly the results it gets alone (from the plain-Python engine, which
gives the Spark analysis's results: tests/analysis/test_jepsen_verdicts.py and the differential
tests hold them to that)."""

from __future__ import annotations

import json
import random
import threading
import time

from faultline.checker import check as check_module
from faultline.checker.check import CONCURRENT_CHECKS, check_paths
from faultline.models.history import write_history

from .generate import generate
from .histories import Builder

FAULTS = [None, "duplicate", "lost", "write-cycle", "int-rewind", "aborted"]


def generated(fault: str | None, seed: int) -> tuple[Builder, set[str]]:
    b = Builder()
    return b, generate(b, "s", random.Random(seed), fault, 30).expected


def test_histories_checked_at_once_get_the_results_each_gets_alone(spark, tmp_path, monkeypatch):
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

    alone = [check_paths([f], engine="python", report=False)[0].results for f in folders]

    live, most, lock = [0], [0], threading.Lock()
    real = check_module.check

    def counted(*args, **kwargs):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        try:
            time.sleep(0.2)  # so that two checks overlap even if one is quick
            return real(*args, **kwargs)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(check_module, "check", counted)
    together = check_paths(folders, spark=spark)

    assert most[0] == CONCURRENT_CHECKS == 2
    assert [c.directory for c in together] == folders
    assert [c.results for c in together] == alone
    assert [json.loads((f / "results.json").read_text()) for f in folders] == alone
    assert all((f / "report.html").exists() for f in folders)
    # Each history shows its own fault's anomalies, and the fault-free one none: results swapped
    # between folders, or mixed across sessions, would show here.
    assert alone[0]["valid"] is True and alone[0]["anomaly_types"] == []
    for results, kinds in zip(alone[1:], expected[1:]):
        assert kinds and kinds <= set(results["anomaly_types"]), (kinds, results["anomaly_types"])
    assert len({json.dumps(r["anomaly_types"]) for r in alone}) >= 4
