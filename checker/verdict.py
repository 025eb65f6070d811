"""The verdict: anomaly tables + guarantee model -> results.json.

In: an analysis (counts, example witnesses, stats, notes) and a `Model`.
Out: the results dict exactly as shared/anomalies.md specifies, a short
summary for the terminal, and the exit status (0 valid, 1 invalid,
2 unknown).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..models.guarantees import Model
from .explain import explain

EXIT = {True: 0, False: 1, "unknown": 2}


def verdict(analysis, model: Model) -> dict[str, Any]:
    counts = {t: int(n) for t, n in sorted(analysis.counts.items()) if n}
    found = sorted(counts)
    bad = sorted(t for t in found if t in model.forbidden)
    stats = dict(analysis.stats)
    if stats.get("ops", 0) == 0:
        valid: Any = "unknown"
    else:
        valid = not bad
    anomalies = {}
    for t in found:
        witnesses = []
        for w in analysis.examples.get(t, []):
            w = dict(w)
            w["explanation"] = explain(t, w)
            witnesses.append(w)
        anomalies[t] = witnesses
    results = {
        "valid": valid,
        "model": model.name,
        "anomaly_types": found,
        "bad_anomaly_types": bad,
        "counts": counts,
        "anomalies": anomalies,
        "stats": stats,
    }
    if analysis.notes:
        results["notes"] = list(analysis.notes)
    if valid == "unknown":
        results["error"] = "the history holds no client operations: nothing to judge"
    return results


def unknown(model_name: str, error: str) -> dict[str, Any]:
    """Results for a check that could not decide (unreadable history, checker error)."""
    return {"valid": "unknown", "model": model_name, "anomaly_types": [], "bad_anomaly_types": [],
            "counts": {}, "anomalies": {}, "stats": {}, "error": error}


def write_results(directory: Path, results: dict[str, Any]) -> Path:
    path = directory / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def exit_status(results: dict[str, Any]) -> int:
    return EXIT[results["valid"]]


def summary(results: dict[str, Any], where: str = "") -> str:
    valid = results["valid"]
    head = {True: "VALID", False: "INVALID", "unknown": "UNKNOWN"}[valid]
    stats = results.get("stats", {})
    lines = [f"{head}{' ' + where if where else ''} (model {results['model']}; "
             f"{stats.get('ops', 0)} ops: {stats.get('ok', 0)} ok, {stats.get('fail', 0)} fail, "
             f"{stats.get('info', 0)} info)"]
    if "error" in results:
        lines.append(f"  {results['error']}")
    for t in results["anomaly_types"]:
        mark = "BAD " if t in results["bad_anomaly_types"] else "ok  "
        lines.append(f"  {mark}{t}: {results['counts'][t]}")
        for w in results["anomalies"].get(t, [])[:2]:
            lines.append(f"        e.g. {w['explanation']}")
    for note in results.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)
