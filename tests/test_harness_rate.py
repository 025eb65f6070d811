"""The rate a run reached, as the checker reports it: harness.json -> results.json's `rate`, and a
warning exactly when the harness fell more than 20% short of the rate asked."""

from __future__ import annotations

import json
import time

import pytest

from faultline.checker.check import HARNESS, harness_rate, record_rate
from faultline.checker.verdict import summary
from faultline.runner.interpreter import Invoked


@pytest.mark.parametrize("invocations, warned", [(800, False), (799, True), (2000, False)])
def test_a_shortfall_of_more_than_a_fifth_is_warned_about(tmp_path, invocations, warned):
    record_rate(tmp_path, 100.0, invocations, 10.0)
    rate, warning = harness_rate(tmp_path)
    assert rate == {"asked": 100.0, "achieved": invocations / 10}
    assert (warning is not None) == warned
    if warned:
        assert warning.startswith("warning: the harness invoked 79.9 client operations per second in the main "
                                  "phase, 80% of the 100 asked")


def test_no_rate_without_a_readable_harness_json(tmp_path):
    assert harness_rate(tmp_path) == (None, None)
    (tmp_path / HARNESS).write_text("{not json")
    assert harness_rate(tmp_path) == (None, None)


def test_the_summary_says_the_rate_beside_the_one_asked():
    results = {"valid": True, "model": "exactly-once", "anomaly_types": [], "bad_anomaly_types": [], "counts": {},
               "anomalies": {}, "stats": {"ops": 10, "ok": 10}, "rate": {"asked": 5000.0, "achieved": 159.2}}
    assert "  rate: 159.2 client operations/s in the main phase, of 5000 asked" in summary(results).splitlines()


def test_a_phase_s_cost_is_the_harness_cpu_per_operation_and_the_machine_s_busy_share(tmp_path):
    invoked = Invoked()
    invoked.add("main", 0.0)
    spent = time.process_time()
    while time.process_time() - spent < 0.3:  # the harness busy on one core
        pass
    invoked.add("main", 0.5)  # no new sample within a second of the last
    assert invoked.cost("main") == {}
    invoked.add("main", 1.5)
    cost = invoked.cost("main")
    assert 150 <= cost["cpu_ms_per_op"] < 500, cost  # 0.3 s or more over two operations
    assert 0 < cost["machine_busy"] <= 1, cost
    assert invoked.cost("final") == {}
    record_rate(tmp_path, 100.0, 3, 1.5, cost)
    assert json.loads((tmp_path / HARNESS).read_text()) == {"phase": "main", "asked": 100.0, "invocations": 3,
                                                           "seconds": 1.5, "achieved": 2.0, **cost}
    assert harness_rate(tmp_path)[0] == {"asked": 100.0, "achieved": 2.0}
