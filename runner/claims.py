"""`faultline claims`: each claim's configurations run over many seeds, judged, and tabled.

In: the claims (models.claims), the systems (the reference broker, Apache Kafka at one or more
versions), a number of seeds, quick or not. Out: a folder `store/claims/<timestamp>/` holding
every run (a normal store folder each, under runs/), `claims.json` (every judgement, as data),
`claims.md` (a Markdown table, one row per claim and system) and `claims.html`; the exit status
is 1 when a claim is CONTRADICTED, else 0.

Runs go one after another, in this process (each brings up its own cluster; a 2-core machine
has no room for two).
"""

from __future__ import annotations

import dataclasses
import html
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..models.claims import CONTRADICTED, NA, Claim, Outcome, Side, judge_claim, judge_side
from ..models.spec import spec_from_fields

QUICK_SEEDS = 1


@dataclass
class Row:
    """A claim on one system, judged: per side its Outcome and run folders; `verdict`."""
    claim: Claim
    system: str
    verdict: str
    na: str | None = None
    note: str | None = None
    sides: dict[str, tuple[Side, Outcome, list[str]]] = dataclasses.field(default_factory=dict)


def system_names(db: str, kafka_versions: list[str]) -> list[tuple[str, str | None]]:
    """(system, kafka version) pairs for --db and --kafka-version."""
    out: list[tuple[str, str | None]] = []
    if db in ("reference", "both"):
        out.append(("reference", None))
    if db in ("kafka", "both"):
        out += [("kafka", v) for v in kafka_versions]
    return out


def label(system: str, version: str | None) -> str:
    return system if version is None else f"kafka {version}"


def run_claims(claims: list[Claim], systems: list[tuple[str, str | None]], seeds: int, quick: bool, out: Path,
               run: Callable | None = None, say: Callable[[str], None] = print) -> list[Row]:
    """Run and judge every claim on every system; `run(spec) -> (status, run_dir)` (runner.run's
    run_test by default)."""
    if run is None:
        from .run import run_test

        def run(spec):
            return run_test(spec, show_progress=False)
    rows = []
    total = sum(len(c.plan(s, v, quick).sides) for c in claims for s, v in systems) * seeds
    done = 0
    for claim in claims:
        for system, version in systems:
            plan = claim.plan(system, version, quick)
            if plan.na:
                rows.append(Row(claim, label(system, version), NA, na=plan.na))
                continue
            row = Row(claim, label(system, version), "", note=plan.note)
            for side in plan.sides:
                results, folders = [], []
                for seed in range(1, seeds + 1):
                    done += 1
                    fields = {**side.fields, "seed": seed, "store": str(out / "runs"),
                              "name": f"{claim.name}-{side.name}-{label(system, version).replace(' ', '-')}"}
                    say(f"[{done}/{total}] {claim.name} on {label(system, version)}, {side.name} side, seed {seed}")
                    started = time.monotonic()
                    _, run_dir = run(spec_from_fields(fields))
                    result = _results(run_dir)
                    results.append(result)
                    folders.append(str(run_dir))
                    say(f"  {_said(result)} ({time.monotonic() - started:.0f} s): {run_dir}")
                row.sides[side.name] = (side, judge_side(side, results), folders)
            row.verdict = judge_claim({n: (s, o) for n, (s, o, _) in row.sides.items()})
            rows.append(row)
    return rows


def _results(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return {"valid": "unknown", "anomaly_types": [], "error": f"no readable results.json in {run_dir}"}


def _said(results: dict[str, Any]) -> str:
    head = {True: "valid", False: "invalid"}.get(results.get("valid"), "unknown")
    kinds = ", ".join(results.get("anomaly_types") or []) or "no anomaly"
    return f"{head}; {kinds}"


def _side_text(side: Side, outcome: Outcome) -> str:
    kinds = " or ".join(side.anomalies)
    if side.expect_anomaly:
        return f"{outcome.verdict}: {kinds} in {outcome.showing} of {outcome.known} seeds" + (
            f" ({outcome.runs - outcome.known} unknown)" if outcome.runs != outcome.known else "")
    return f"{outcome.verdict}: {kinds} in {outcome.showing} of {outcome.runs} seeds" + (
        f" ({outcome.runs - outcome.known} unknown)" if outcome.runs != outcome.known else "")


def _witness(row: Row) -> str | None:
    """The first run that showed what the claim is about: an unsafe side's reproduction, or a safe
    side's violation."""
    for name in ("safe", "unsafe"):
        if name in row.sides:
            side, outcome, folders = row.sides[name]
            if outcome.first is not None and (side.expect_anomaly or outcome.verdict != "HELD"):
                return folders[outcome.first]
    return None


def to_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [{"claim": r.claim.name, "text": r.claim.claim, "source": r.claim.source, "system": r.system,
             "verdict": r.verdict, "na": r.na, "note": r.note, "witness": _witness(r),
             "sides": {n: {"anomalies": list(s.anomalies), "expect_anomaly": s.expect_anomaly,
                           **dataclasses.asdict(o), "runs": folders} for n, (s, o, folders) in r.sides.items()}}
            for r in rows]


def markdown(rows: list[Row], seeds: int) -> str:
    lines = [f"# Claims ({seeds} seed{'s' if seeds != 1 else ''} per configuration)", "",
             "| claim | system | unsafe configuration | safe configuration | verdict | first witness |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r.na:
            lines.append(f"| {r.claim.name} | {r.system} | n/a | n/a | n/a: {r.na} | |")
            continue
        cells = [_side_text(*r.sides[n][:2]) if n in r.sides else "-" for n in ("unsafe", "safe")]
        witness = _witness(r)
        lines.append(f"| {r.claim.name} | {r.system} | {cells[0]} | {cells[1]} | **{r.verdict}** | "
                     + (f"`faultline repro {witness}`" if witness else "") + " |")
    lines += ["", "Claims:", ""] + [f"- **{c.name}**: {c.claim} ({c.source})" for c in _claims(rows)]
    return "\n".join(lines) + "\n"


def _claims(rows: list[Row]) -> list[Claim]:
    seen: dict[str, Claim] = {}
    for r in rows:
        seen.setdefault(r.claim.name, r.claim)
    return list(seen.values())


def html_page(rows: list[Row], seeds: int, out: Path) -> str:
    e = html.escape
    body = []
    for r in rows:
        if r.na:
            body.append(f"<tr class='na'><td>{e(r.claim.name)}</td><td>{e(r.system)}</td><td colspan=2>n/a: "
                        f"{e(r.na)}</td><td>n/a</td><td></td></tr>")
            continue
        cells = []
        for n in ("unsafe", "safe"):
            if n not in r.sides:
                cells.append("<td>-</td>")
                continue
            side, outcome, folders = r.sides[n]
            runs = " ".join(f"<a href='{e(str(Path(f).relative_to(out)))}/report.html'>{i + 1}</a>"
                            for i, f in enumerate(folders) if _inside(Path(f), out))
            cells.append(f"<td>{e(_side_text(side, outcome))}<br><small>runs: {runs}</small></td>")
        witness = _witness(r)
        body.append(f"<tr class='{r.verdict.lower()}'><td title='{e(r.claim.claim)}'>{e(r.claim.name)}</td>"
                    f"<td>{e(r.system)}</td>{''.join(cells)}<td><b>{e(r.verdict)}</b>"
                    + (f"<br><small>{e(r.note)}</small>" if r.note else "") + "</td><td>"
                    + (f"<code>faultline repro {e(witness)}</code>" if witness else "") + "</td></tr>")
    claims = "".join(f"<li><b>{e(c.name)}</b>: {e(c.claim)} <small>({e(c.source)})</small>"
                     + (f"<br><small>{e(c.why)}</small>" if c.why else "") + "</li>" for c in _claims(rows))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>faultline claims</title><style>"
            "body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse}"
            "th,td{text-align:left;padding:4px 12px 4px 0;vertical-align:top;border-bottom:1px solid #e3e7ee}"
            "tr.confirmed b{color:#2e8b57}tr.contradicted b{color:#c0392b}tr.undecided b{color:#b7791f}"
            "tr.na td{color:#718096}</style></head><body>"
            f"<h1>faultline claims</h1><p>{seeds} seed(s) per configuration. A claim is CONFIRMED when its unsafe "
            "configuration reproduced the anomaly and its safe one held, CONTRADICTED when the safe one showed "
            "an anomaly the claim says cannot happen, UNDECIDED otherwise.</p><table id='claims'><tr><th>claim</th>"
            "<th>system</th><th>unsafe configuration</th><th>safe configuration</th><th>verdict</th>"
            f"<th>first witness</th></tr>{''.join(body)}</table><h2>The claims</h2><ul>{claims}</ul></body></html>")


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def write_outputs(rows: list[Row], seeds: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "claims.json").write_text(json.dumps(to_json(rows), indent=2) + "\n")
    (out / "claims.md").write_text(markdown(rows, seeds))
    (out / "claims.html").write_text(html_page(rows, seeds, out))


def exit_status(rows: list[Row]) -> int:
    return 1 if any(r.verdict == CONTRADICTED for r in rows) else 0

