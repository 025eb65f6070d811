"""JUnit XML for CI: verdicts -> one file CI systems show natively.

In: (name, results) pairs, one per checked run (results as results.json holds them). Out: a JUnit
XML document with one `testsuite` ("faultline") and one `testcase` per run: passing when the
verdict is valid; a `failure` naming the forbidden anomaly types and the first explanation of
each when invalid; an `error` (never a pass or a skip: the run showed nothing) with the reasons
when unknown.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterable


def _case(suite: ET.Element, name: str, results: dict[str, Any]) -> str:
    case = ET.SubElement(suite, "testcase", name=name, classname=f"faultline.{results.get('model', 'model')}")
    stats = results.get("stats") or {}
    out = ET.SubElement(case, "system-out")
    out.text = (f"model {results.get('model')}; {stats.get('ops', 0)} ops: {stats.get('ok', 0)} ok, "
                f"{stats.get('fail', 0)} fail, {stats.get('info', 0)} info; anomaly types: "
                f"{', '.join(results.get('anomaly_types') or []) or 'none'}")
    valid = results.get("valid")
    if valid is True:
        return "pass"
    if valid is False:
        bad = results.get("bad_anomaly_types") or []
        lines = []
        for kind in bad:
            first = (results.get("anomalies", {}).get(kind) or [{}])[0]
            lines.append(f"{kind} ({results.get('counts', {}).get(kind, 0)}): {first.get('explanation', '')}")
        failure = ET.SubElement(case, "failure", type="invalid",
                                message=f"anomalies the model {results.get('model')} forbids: {', '.join(bad)}")
        failure.text = "\n".join(lines)
        return "failure"
    reasons = results.get("unknown_reasons") or ([results["error"]] if results.get("error") else [])
    error = ET.SubElement(case, "error", type="unknown",
                          message="the verdict is unknown: the run cannot show what it claims")
    error.text = "\n".join(reasons)
    return "error"


def junit_xml(runs: Iterable[tuple[str, dict[str, Any]]]) -> str:
    """The JUnit XML document for `runs`."""
    suite = ET.Element("testsuite", name="faultline")
    outcomes = [_case(suite, name, results) for name, results in runs]
    suite.set("tests", str(len(outcomes)))
    suite.set("failures", str(outcomes.count("failure")))
    suite.set("errors", str(outcomes.count("error")))
    suite.set("skipped", "0")
    root = ET.Element("testsuites")
    root.append(suite)
    for name in ("tests", "failures", "errors"):
        root.set(name, suite.get(name))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: str | os.PathLike, runs: Iterable[tuple[str, dict[str, Any]]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(runs))
    return path
