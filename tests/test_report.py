"""report.html, JUnit XML and `faultline serve`: the timeline's figures worked out by hand, the
report of an invalid run with faults loaded in real headless Chromium, JUnit files read by a real
consumer (junitparser), and the store served over HTTP with paths outside it refused."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml

from faultline.checker.check import check_paths
from faultline.checker.junit import junit_xml, write_junit
from faultline.history_analysis.timeline import Lag, read_timeline
from faultline.models.faults import ENDS, HEAL, WHOLE, Fault, fault_intervals
from faultline.models.spec import TestSpec
from faultline.runner.serve import make_server

from .browser import load

REPO = Path(__file__).resolve().parents[1]
S = 1_000_000_000  # nanoseconds in a second


class History:
    """A history written by hand: times in seconds, an index per line."""

    def __init__(self):
        self.lines: list[dict] = []

    def line(self, t: float, process, type_: str, f: str, **fields) -> int:
        self.lines.append({"index": len(self.lines), "time": round(t * S), "process": process, "type": type_,
                           "f": f, **fields})
        return len(self.lines) - 1

    def op(self, process, f: str, t0: float, t1: float, type_: str = "ok", invoke=None, complete=None) -> int:
        self.line(t0, process, "invoke", f, **(invoke or {}))
        return self.line(t1, process, type_, f, **(complete if complete is not None else invoke or {}))

    def send(self, process, t0, t1, sends, type_="ok") -> int:
        return self.op(process, "send", t0, t1, type_, {"mops": [{"f": "send", "key": k, "value": v} for k, v, _ in sends]},
                       {"mops": [{"f": "send", "key": k, "value": v, "offset": o if type_ == "ok" else None}
                                 for k, v, o in sends]})

    def poll(self, process, t0, t1, records) -> int:
        return self.op(process, "poll", t0, t1, "ok", {"mops": [{"f": "poll"}]},
                       {"mops": [{"f": "poll", "records": [{"key": k, "offset": o, "value": v}
                                                           for k, o, v in records]}]})

    def assign(self, process, t0, t1, keys, seek=True, ends=None) -> int:
        """ends: the completion's end_offsets (the final reads' assign)."""
        fields = {"keys": keys, "seek_to_beginning": seek}
        return self.op(process, "assign", t0, t1, "ok", fields, {**fields, **({"end_offsets": ends} if ends else {})})

    def nemesis(self, f: str, t0: float, t1: float, value=None) -> None:
        self.line(t0, "nemesis", "invoke", f)
        self.line(t1, "nemesis", "info", f, value=value)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        return path


def test_realtime_lag_and_unseen_follow_jepsen_worked_out_by_hand(tmp_path):
    h = History()
    h.send(0, 0.5, 1.0, [("k", 10, 0)])
    h.assign(1, 1.2, 1.3, ["k"])
    h.poll(1, 1.5, 2.0, [("k", 0, 10)])  # read the newest write: no lag
    h.send(0, 2.5, 3.0, [("k", 11, 1)])  # offset 1 exists from t = 3
    h.poll(1, 4.0, 5.0, [])  # still at offset 0, invoked at 4: 1 s behind
    h.poll(1, 6.0, 6.5, [("k", 1, 11)])
    t = read_timeline(h.write(tmp_path / "history.jsonl"))
    assert t.lag == [Lag(1.5, 1, "k", 0.0), Lag(4.0, 1, "k", 1.0), Lag(6.0, 1, "k", 0.0)]
    # 10: acknowledged at 1, first read at 2; 11: acknowledged at 3, read at 6.5.
    assert t.unseen == {"k": [(0.0, 0), (1.0, 1), (2.0, 0), (3.0, 1), (6.5, 0)]}


def test_a_rewinding_assign_starts_the_lag_over_and_a_subscribe_forgets_the_keys(tmp_path):
    h = History()
    h.send(0, 0.0, 0.5, [("k", 1, 0), ("k", 2, 1)])
    h.assign(1, 1.0, 1.1, ["k"])
    h.poll(1, 1.2, 1.3, [("k", 0, 1), ("k", 1, 2)])
    h.assign(1, 2.0, 2.1, ["k"], seek=True)  # back to the start: offset 0 was no longer the end at 0.5
    h.poll(1, 3.0, 3.1, [])
    h.op(1, "subscribe", 4.0, 4.1, invoke={"keys": ["k"]})
    h.poll(1, 5.0, 5.1, [])  # owns nothing it has read: no lag to report
    t = read_timeline(h.write(tmp_path / "history.jsonl"))
    assert t.lag == [Lag(1.2, 1, "k", 0.0), Lag(3.0, 1, "k", 2.5)]


def test_latency_quantiles_and_throughput_per_second_worked_out_by_hand(tmp_path):
    h = History()
    for i, latency in enumerate((0.1, 0.4, 0.2, 0.3)):  # four invoked in second 0
        h.send(i, 0.1 * i, 0.1 * i + latency, [("k", i, i)])
    h.send(0, 1.5, 2.5, [("k", 9, None)], type_="info")  # second 1: one, 1 s
    h.line(2.6, 7, "invoke", "poll", mops=[{"f": "poll"}])  # never completes
    t = read_timeline(h.write(tmp_path / "history.jsonl"))
    # nearest rank: p50 of four is the 2nd smallest, p95 and p99 the 4th
    [(s0, q0), (s1, q1)] = t.quantiles
    assert (s0, s1) == (0, 1)
    assert q0 == pytest.approx({0.5: 0.2, 0.95: 0.4, 0.99: 0.4, 1.0: 0.4})
    assert q1 == pytest.approx({0.5: 1.0, 0.95: 1.0, 0.99: 1.0, 1.0: 1.0})
    # completions at 0.1, 0.5, 0.4, 0.6 (second 0) and 2.5 (info, second 2); the history ends at 2.6
    assert t.throughput == {"ok": [(0, 4), (1, 0), (2, 0)], "fail": [(0, 0), (1, 0), (2, 0)],
                              "info": [(0, 0), (1, 0), (2, 1)]}
    never = t.op(h.lines[-1]["index"])
    assert (never.type, never.complete, never.latency) == ("info", None, None)


def test_faults_last_from_their_start_to_the_completion_of_what_ends_them():
    ops = [("invoke", "start-partition", 1.0, None), ("info", "start-partition", 1.1, {"grudge": {}}),
           ("invoke", "kill", 2.0, None), ("info", "kill", 2.2, {"nodes": ["n1"]}),
           ("invoke", "stop-partition", 3.0, None), ("info", "stop-partition", 3.2, None),
           ("invoke", "rolling-restart", 4.0, None), ("info", "rolling-restart", 6.0, {}),
           ("invoke", "pause", 7.0, None), ("info", "pause", 7.1, {"nodes": ["n2"]}),
           ("invoke", "heal", 8.0, None), ("info", "heal", 8.5, {}),
           ("invoke", "power-off", 9.0, None), ("info", "power-off", 9.1, {})]
    assert fault_intervals(ops) == [
        Fault("start-partition", 1.0, 3.2, {"grudge": {}}), Fault("kill", 2.0, 8.5, {"nodes": ["n1"]}),
        Fault("rolling-restart", 4.0, 6.0, {}), Fault("pause", 7.0, 8.5, {"nodes": ["n2"]}),
        Fault("power-off", 9.0, None, {})]


def test_every_fault_the_nemeses_start_is_in_the_table_with_what_ends_it():
    from faultline.nemesis import clients, partition, process

    pairs = [(c.fs[0], c.fs[1] if len(c.fs) > 1 else None) for c in (
        process.KillNemesis, process.PauseNemesis, process.PowerLossNemesis, process.RollingRestartNemesis,
        process.StaleElectionNemesis, process.LoneLeaderNemesis, partition.PartitionNemesis)]
    pairs += list(process.ClockNemesis.pairs)
    pairs += [(f"kill-{role}", end) for role, end in clients.ENDS.items()]
    assert {start: end for start, end in pairs if end} == ENDS
    assert {start for start, end in pairs if end is None} == WHOLE
    assert HEAL == "heal"


def invalid_run_with_faults(folder: Path) -> Path:
    """A store folder: an acknowledged write lost while a partition and a kill were on."""
    h = History()
    h.assign(1, 0.05, 0.1, ["t/0"], seek=False)
    h.send(0, 0.2, 0.3, [("t/0", 1, 0)])
    h.nemesis("start-partition", 0.4, 0.5, {"grudge": {"n1": ["n2", "n3"]}})
    h.send(0, 0.6, 0.9, [("t/0", 2, 1)])
    h.nemesis("kill", 1.0, 1.1, {"nodes": ["n1"]})
    h.send(2, 1.2, 1.4, [("t/0", 3, 2)])
    h.nemesis("stop-partition", 1.5, 1.6, {})
    h.nemesis("start", 1.7, 1.9, {"nodes": ["n1"]})
    h.poll(1, 2.0, 2.2, [("t/0", 0, 1), ("t/0", 2, 3)])
    h.assign(3, 2.3, 2.4, ["t/0"], seek=True, ends={"t/0": 3})
    h.poll(3, 2.6, 2.8, [("t/0", 0, 1), ("t/0", 2, 3)])
    h.write(folder / "history.jsonl")
    spec = TestSpec(seed=42, nodes=3, nemesis=["partition", "kill"], time_limit=2.0,
                    broker_settings={"min.insync.replicas": "2"})
    (folder / "test.json").write_text(json.dumps(spec.to_json(), indent=2))
    (folder / "nodes" / "n1").mkdir(parents=True)
    (folder / "nodes" / "n1" / "broker.log").write_text("started\n")
    return folder


PLOTS = ["latency", "quantiles", "throughput", "lag", "unseen"]


def test_the_report_of_an_invalid_run_with_faults_opens_in_chromium_with_every_plot_and_witness(tmp_path):
    folder = invalid_run_with_faults(tmp_path / "store" / "queue" / "20261125T000000.000")
    [checked] = check_paths([folder], engine="python")
    assert checked.results["valid"] is False and "lost-write" in checked.results["bad_anomaly_types"]
    report = folder / "report.html"
    selectors = ["#verdict", "#repro", *[f"#plot-{p} svg" for p in PLOTS],
                 *[f"[id^='{p}-fault-']" for p in PLOTS], "[id^='witness-lost-write-'] svg",
                 "a[href='history.jsonl']", "a[href='results.json']", "a[href='anomalies/lost-write.jsonl']",
                 "a[href='nodes/n1/broker.log']", "#anomaly-lost-write"]
    page = load(report.as_uri(), "report-invalid-with-faults.png", selectors, text_of=("#verdict", "#repro"))
    assert page.console == [] and page.errors == []
    assert page.requests == [report.as_uri()]  # nothing fetched: no script, font, style or image
    assert {s: n for s, n in page.counts.items() if n == 0} == {}
    # The two faults (a partition; a kill until its restart) shade every plot.
    assert {p: page.counts[f"[id^='{p}-fault-']"] for p in PLOTS} == {p: 2 for p in PLOTS}
    assert page.texts == {"#verdict": "INVALID", "#repro": f"faultline repro {folder}"}
    assert page.screenshot.stat().st_size > 10_000


def test_a_run_whose_test_json_is_broken_is_unknown_and_its_report_says_why(tmp_path):
    folder = invalid_run_with_faults(tmp_path / "run")
    (folder / "test.json").write_text("{not json")
    [checked] = check_paths([folder], engine="python")
    assert checked.results["valid"] == "unknown"
    text = (folder / "report.html").read_text()
    assert 'id="verdict">UNKNOWN' in text and "test.json could not be read" in text
    assert 'id="plot-latency"' in text  # the history is still drawn


def test_a_run_stopped_before_any_client_operation_is_unknown_and_reported_without_warnings(tmp_path):
    # What a claims run stopped during a run's set-up leaves: the nemesis' heal, no client operation.
    folder = tmp_path / "run"
    history = History()
    history.nemesis("heal", 0.1, 0.2, {})
    history.write(folder / "history.jsonl")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels" among them
        [checked] = check_paths([folder], engine="python")
    assert checked.results["valid"] == "unknown"
    assert 'id="verdict">UNKNOWN' in (folder / "report.html").read_text()


def test_a_history_refused_for_a_line_nested_too_deep_still_gets_its_report(tmp_path):
    folder = invalid_run_with_faults(tmp_path / "run")
    with open(folder / "history.jsonl", "a") as history:
        history.write("[" * 100_000 + "]" * 100_000 + "\n")  # deeper than Python's JSON reader goes
    [checked] = check_paths([folder], engine="python")
    assert checked.results["valid"] == "unknown" and "nested deeper than" in checked.results["error"]
    text = (folder / "report.html").read_text()
    assert 'id="verdict">UNKNOWN' in text and 'id="plot-latency"' in text  # the lines before it are drawn


def test_a_report_that_cannot_be_made_is_skipped_with_a_warning_naming_where_it_failed(tmp_path, caplog):
    from faultline.checker.report import write_report

    folder = invalid_run_with_faults(tmp_path / "run")
    # results.json is read as given: stats that are not a map cannot be shown.
    with caplog.at_level("WARNING", logger="faultline.checker"):
        assert write_report(folder, {"valid": False, "stats": ["not", "a", "map"]}) is None
    assert not (folder / "report.html").exists()
    # Only the checker's own: a client of an earlier test's broker may warn from its thread meanwhile.
    [message] = [r.getMessage() for r in caplog.records if r.name == "faultline.checker"]
    assert message.startswith(f"could not write {folder / 'report.html'}: AttributeError: ")
    assert message.endswith(", in render)") and "(at checker/report.py:" in message


def test_a_history_too_large_to_draw_in_memory_is_reported_without_plots(tmp_path, monkeypatch):
    folder = invalid_run_with_faults(tmp_path / "run")
    monkeypatch.setenv("FAULTLINE_REPORT_MAX_MB", "0.001")  # 1 kB
    [checked] = check_paths([folder], engine="python")
    text = (folder / "report.html").read_text()
    assert checked.results["valid"] is False and 'id="verdict">INVALID' in text
    assert ("No plots: the history is 0 MB, and without Spark the plots are drawn in memory for histories up to "
            "0.001 MB") in text
    assert 'id="plot-' not in text and "lost-write" in text


def results_of(valid, bad=(), reasons=()):
    return {"valid": valid, "model": "exactly-once", "anomaly_types": list(bad), "bad_anomaly_types": list(bad),
            "counts": {b: 3 for b in bad}, "stats": {"ops": 10, "ok": 9, "fail": 0, "info": 1},
            "anomalies": {b: [{"explanation": f"first {b}"}] for b in bad},
            **({"unknown_reasons": list(reasons)} if reasons else {})}


def test_junit_has_a_case_per_run_failing_when_invalid_and_erring_when_unknown(tmp_path):
    path = write_junit(tmp_path / "out" / "junit.xml", [
        ("store/a", results_of(True)), ("store/b", results_of(False, ["lost-write", "duplicate"])),
        ("store/c", results_of("unknown", reasons=["the final reads did not finish"]))])
    xml = JUnitXml.fromfile(str(path))
    [suite] = list(xml)
    assert (suite.name, suite.tests, suite.failures, suite.errors, suite.skipped) == ("faultline", 3, 1, 1, 0)
    cases = {c.name: c for c in suite}
    assert cases["store/a"].is_passed
    [failure] = cases["store/b"].result
    assert isinstance(failure, Failure)
    assert failure.message == "anomalies the model exactly-once forbids: lost-write, duplicate"
    assert failure.text == "lost-write (3): first lost-write\nduplicate (3): first duplicate"
    [error] = cases["store/c"].result
    assert isinstance(error, Error) and error.text == "the final reads did not finish"
    assert junit_xml([]).startswith('<?xml version="1.0" encoding="UTF-8"?>')


def test_faultline_check_junit_writes_every_verdict_and_exits_with_the_worst(tmp_path):
    bad = invalid_run_with_faults(tmp_path / "bad")
    good = tmp_path / "good"
    h = History()
    h.send(0, 0.1, 0.2, [("t/0", 1, 0)])
    h.assign(1, 0.3, 0.4, ["t/0"], seek=True, ends={"t/0": 1})
    h.poll(1, 0.6, 0.7, [("t/0", 0, 1)])
    h.write(good / "history.jsonl")
    junit = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", "--engine", "python",
                           "--no-progress", "--junit", str(junit), str(good), str(bad)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [suite] = list(JUnitXml.fromfile(str(junit)))
    assert {c.name: c.is_passed for c in suite} == {str(good): True, str(bad): False}
    assert (good / "report.html").exists() and (bad / "report.html").exists()


@pytest.fixture
def served(tmp_path):
    store = tmp_path / "store"
    check_paths([invalid_run_with_faults(store / "queue" / "20261125T000000.000")], engine="python")
    valid = store / "queue" / "20261125T000100.000"
    (valid / "nodes").mkdir(parents=True)
    (valid / "results.json").write_text(json.dumps(results_of(True)))
    (valid / "test.json").write_text(json.dumps(TestSpec(seed=7).to_json()))
    (tmp_path / "secret.txt").write_text("not the store's\n")
    os.symlink(tmp_path / "secret.txt", store / "queue" / "escape")
    server = make_server(store, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def get(port: int, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)  # sent as written: no client-side normalisation of ".."
    response = conn.getresponse()
    body = response.read().decode(errors="replace")
    conn.close()
    return response.status, response.getheader("Content-Type") or "", body


def test_serve_lists_the_runs_newest_first_and_filters_by_verdict(served):
    status, kind, body = get(served, "/")
    assert (status, kind) == (200, "text/html; charset=utf-8")
    assert body.index("20261125T000100.000") < body.index("20261125T000000.000")
    assert '<a href="/queue/20261125T000000.000/report.html">report</a>' in body
    _, _, invalid = get(served, "/?verdict=invalid")
    assert "20261125T000000.000" in invalid and "20261125T000100.000" not in invalid
    status, kind, report = get(served, "/queue/20261125T000000.000/report.html")
    assert (status, kind) == (200, "text/html; charset=utf-8") and 'id="verdict">INVALID' in report
    status, kind, history = get(served, "/queue/20261125T000000.000/history.jsonl")
    assert (status, kind) == (200, "text/plain; charset=utf-8") and history.startswith('{"index": 0')


def test_the_index_opens_in_chromium_and_links_each_report(served):
    page = load(f"http://127.0.0.1:{served}/", "serve-index.png", ["#runs tr", "a[href$='report.html']"])
    assert page.console == [] and page.errors == []
    assert page.counts == {"#runs tr": 3, "a[href$='report.html']": 1}


@pytest.mark.parametrize("path", ["/../secret.txt", "/queue/../../secret.txt", "/%2e%2e/secret.txt",
                                  "/queue/%2E%2E/%2e%2e/secret.txt", "/..%2fsecret.txt", "/queue/escape",
                                  "/queue\\..\\..\\secret.txt"])
def test_serve_refuses_every_path_outside_the_store(served, path):
    status, _, body = get(served, path)
    assert (status, body) == (403, "outside the store\n")


def test_serve_says_what_is_missing(served, tmp_path):
    assert get(served, "/queue/nothing-here")[0] == 404
    with pytest.raises(FileNotFoundError, match="no store folder at"):
        make_server(tmp_path / "absent", port=0)
