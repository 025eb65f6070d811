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
    # Forbidden by the model, or unknown to the anomaly registry (fail closed: nobody judged it).
    bad = sorted(t for t in found if model.forbids(t))
    stats = dict(analysis.stats)
    unproven = unproven_types(analysis, found)
    valid: Any = not [t for t in bad if t not in unproven]
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
    if unproven:
        results["unproven_anomaly_types"] = unproven
    if analysis.notes:
        results["notes"] = list(analysis.notes)
    return fail_closed(results, unknown_reasons(analysis))


def unproven_types(analysis, found: list[str]) -> list[str]:
    """Types found that prove nothing yet: `unseen` when every key it was found on (as far as its
    examples show) lacks complete final reads. Unseen values are a loss once the final reads are
    done; before that they may simply not have been read yet (the verdict is then unknown, unless
    another forbidden type proves it invalid)."""
    if "unseen" not in found:
        return []
    incomplete = {r["key"] for r in analysis.final_reads
                  if not r["complete"] or r.get("outcome") not in (None, "reached")}
    keys = {w["key"] for w in analysis.examples.get("unseen", [])}
    return ["unseen"] if incomplete and keys <= incomplete else []


# Client operations whose never succeeding means the run cannot show what it claims.
JUDGED_FS = ("send", "poll", "txn", "assign", "subscribe")
SHOWN_KEYS = 5
OUTCOMES = {"unavailable": "the final reader could not read the key (its leader or its end offset was unavailable)",
            "timeout": "the final reads ran out of time before reaching the key's end"}


def unknown_reasons(analysis) -> list[str]:
    """Why the history cannot show what the run claims (empty when it can): nothing succeeded, a
    kind of operation the clients issued never succeeded, the heal failed, or the final reads did
    not reach the end of every key (result.FINAL_READS)."""
    stats = analysis.stats
    if stats.get("ops", 0) == 0:
        return ["the history holds no client operations: nothing to judge"]
    if stats.get("ok", 0) == 0:
        return [f"no client operation completed ok ({stats['ops']} invoked): nothing happened that could be judged"]
    reasons = []
    for f, n in sorted(stats.get("by_f", {}).items()):
        if f in JUDGED_FS and n["invoked"] and not n["ok"]:
            reasons.append(f"no {f} completed ok ({n['invoked']} invoked): the run cannot show what its {f}s do")
    for heal in stats.get("heal_errors", []):
        reasons.append(f"the heal failed (op {heal['op']}: {heal['error']}): faults may have lasted into the "
                       f"final reads")
    # The final reader's own record (history-format.md, Final reads): a key it could not read, or
    # ran out of time on, cannot show its tail, whatever the polls before suggest.
    cut = [r for r in analysis.final_reads if r.get("outcome") not in (None, "reached")]
    if cut:
        shown = "; ".join(f"{r['key']}: {OUTCOMES.get(r['outcome'], r['outcome'])}" for r in cut[:SHOWN_KEYS])
        reasons.append(f"the final reads say they did not read {len(cut)} key(s) to the end: {shown}"
                       + ("; ..." if len(cut) > SHOWN_KEYS else ""))
    missing = [r for r in analysis.final_reads if r["assign"] is None]
    short = [r for r in analysis.final_reads if r["assign"] is not None and not r["complete"]]
    if missing:
        keys = ", ".join(r["key"] for r in missing[:SHOWN_KEYS]) + (", ..." if len(missing) > SHOWN_KEYS else "")
        reasons.append(f"no final read of {len(missing)} key(s) ({keys}): an assign with seek_to_beginning, then "
                       f"polls to the end of the log, shows whether the tail of a log was lost")
    if short:
        def where(r):
            if r.get("late_end", 0) > r["read_to"] and (r["end"] is None or r["read_to"] >= r["end"]):
                end = f"offset {r['late_end'] - 1}, which operations that completed after that assign show exists"
            elif r["end"] is not None:
                end = f"the broker's end offset {r['end']}"
            else:
                end = f"offset {r['known_end'] - 1}, which other operations show exists"
            return f"{r['key']} read to offset {r['read_to'] - 1} (final assign op {r['assign']}), short of {end}"

        shown = "; ".join(where(r) for r in short[:SHOWN_KEYS]) + ("; ..." if len(short) > SHOWN_KEYS else "")
        reasons.append(f"the final reads did not reach the end of {len(short)} key(s): {shown}")
    return reasons


def fail_closed(results: dict[str, Any], reasons: list[str]) -> dict[str, Any]:
    """Results that cannot be valid for `reasons`: a run that would be valid is unknown instead (an
    anomaly that was found stays proven: invalid stays invalid). The reasons go to `error` and to
    `unknown_reasons`."""
    if not reasons:
        return results
    if results["valid"] is True:
        results["valid"] = "unknown"
    results["unknown_reasons"] = results.get("unknown_reasons", []) + reasons
    results["error"] = "; ".join(results["unknown_reasons"])
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
    rate = results.get("rate")
    if rate and rate.get("achieved") is not None:
        lines.append(f"  rate: {rate['achieved']:g} client operations/s in the main phase, of {rate['asked']:g} asked")
    for reason in results.get("unknown_reasons") or ([results["error"]] if "error" in results else []):
        lines.append(f"  unknown: {reason}")
    for t in results["anomaly_types"]:
        mark = "BAD " if t in results["bad_anomaly_types"] else "ok  "
        lines.append(f"  {mark}{t}: {results['counts'][t]}")
        for w in results["anomalies"].get(t, [])[:2]:
            lines.append(f"        e.g. {w['explanation']}")
    for note in results.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)
