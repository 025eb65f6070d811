"""`faultline claims`: each claim's configurations run over many seeds, judged, and tabled.

In: the claims (models.claims), the systems (the reference broker, Apache Kafka at one or more
versions), a number of seeds, quick or not, how many runs at once. Out: a folder
`store/claims/<timestamp>/` holding every run (a normal store folder each, under runs/; each run's
own output under logs/), `claims.json` (every judgement, as data), `claims.md` (a Markdown table,
one row per claim and system) and `claims.html`; the exit status is 1 when a claim is
CONTRADICTED, 130 when the runs were interrupted (the tables then judge the runs that finished),
else 0.

Each run is a `faultline run` of its own, in a child process (`python -m faultline.runner.claims
SPEC RESULT`): its cluster has its own namespaces and subnet, so `parallel` runs can go at once.
Ctrl-C or SIGTERM stops them all: each child is told once (SIGINT), cleans up, checks what it
recorded, and the tables are written from what finished.

A claims run can be resumed (`faultline claims --resume DIR`): `claims-run.json` keeps what was
asked (systems, seeds, claims, quick), and `finished.jsonl` one line per run judged (its spec,
exit status and folder, and whether the claims run was being interrupted as it ended). A resumed
run plans the same runs, takes each finished one whose spec is unchanged and was not cut short by
the interrupt, runs the rest, and tables them all: a 20-seed run on both systems (hours) can be
done in parts.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..models.claims import CONTRADICTED, NA, Claim, Outcome, Side, judge_claim, judge_side
from ..models.spec import TestSpec, spec_from_fields

QUICK_SEEDS = 1
INTERRUPTED = 130
ASKED = "claims-run.json"
FINISHED = "finished.jsonl"
# A run of 3 Kafka brokers wants about a core and 3 GB; fewer runs at once than that skews timing.
CORES_PER_RUN = 2
GIB_PER_RUN = 6


def default_parallel() -> int:
    """Runs at once this machine allows: one per CORES_PER_RUN cores and GIB_PER_RUN GiB of memory."""
    cores = os.cpu_count() or 1
    try:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError):
        gib = GIB_PER_RUN
    return max(1, min(cores // CORES_PER_RUN, int(gib // GIB_PER_RUN)))


@dataclass
class Row:
    """A claim on one system, judged: per side its Outcome and run folders; `verdict`."""
    claim: Claim
    system: str
    verdict: str
    na: str | None = None
    note: str | None = None
    sides: dict[str, tuple[Side, Outcome, list[str]]] = dataclasses.field(default_factory=dict)
    interrupted: bool = False  # the claims run was stopped: some runs may be missing


@dataclass(frozen=True)
class Job:
    """One run: the row and side it counts for, its seed and spec."""
    number: int
    row: int
    side: Side
    seed: int
    spec: TestSpec
    what: str  # "<claim> on <system>, <side> side, seed <seed>"


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


def plan_jobs(claims: list[Claim], systems: list[tuple[str, str | None]], seeds: int, quick: bool,
              out: Path) -> tuple[list[Row], list[Job]]:
    """The rows of the table (n/a ones already judged) and every run they need: seed 1 of every
    configuration in table order, then seed 2, and so on, so that a claims run stopped part way has
    as many seeds of each configuration, give or take one."""
    rows: list[Row] = []
    configurations: list[tuple[int, Claim, str, Side]] = []
    for claim in claims:
        for system, version in systems:
            plan = claim.plan(system, version, quick)
            name = label(system, version)
            if plan.na:
                rows.append(Row(claim, name, NA, na=plan.na))
                continue
            rows.append(Row(claim, name, "", note=plan.note))
            configurations += [(len(rows) - 1, claim, name, side) for side in plan.sides]
    jobs: list[Job] = []
    for seed in range(1, seeds + 1):
        for row, claim, name, side in configurations:
            fields = {**side.fields, "seed": seed, "store": str(out / "runs"),
                      "name": f"{claim.name}-{side.name}-{name.replace(' ', '-')}"}
            jobs.append(Job(len(jobs) + 1, row, side, seed, spec_from_fields(fields),
                            f"{claim.name} on {name}, {side.name} side, seed {seed}"))
    return rows, jobs


def start_order(rows: list[Row], jobs: list[Job]) -> list[Job]:
    """The order runs start in: for each seed, the systems' runs taken in turn (reference, Kafka,
    reference, ...), each system's in table order. In table order a claim's Kafka sides came
    together, and two or three Kafka clusters (three or four JVMs each) starting at once on a
    small machine starved every client in them (2-17 of 100 operations a second asked)."""
    out: list[Job] = []
    for seed in sorted({j.seed for j in jobs}):
        queues: dict[str, list[Job]] = {}
        for job in jobs:
            if job.seed == seed:
                queues.setdefault(rows[job.row].system, []).append(job)
        lanes = list(queues.values())
        while any(lanes):
            for lane in lanes:
                if lane:
                    out.append(lane.pop(0))
    return out


def write_asked(out: Path, asked: dict[str, Any]) -> None:
    """Keep what a claims run was asked (db, kafka_versions, seeds, quick, only) for --resume."""
    out.mkdir(parents=True, exist_ok=True)
    (out / ASKED).write_text(json.dumps(asked, indent=2) + "\n")


def read_asked(out: Path) -> dict[str, Any]:
    """What the claims run in `out` was asked; ValueError saying what is wrong and what to give."""
    try:
        asked = json.loads((out / ASKED).read_text())
    except FileNotFoundError:
        raise ValueError(f"{out} is not a claims run's folder: it has no {ASKED}. Give the folder "
                         f"`faultline claims` printed at its start (store/claims/<timestamp>)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{out / ASKED} cannot be read ({exc}); start a new claims run instead") from None
    missing = [k for k in ("db", "kafka_versions", "seeds", "quick", "only") if k not in asked]
    if missing:
        raise ValueError(f"{out / ASKED} lacks {', '.join(missing)}; start a new claims run instead")
    return asked


def finished_before(out: Path, jobs: list[Job]) -> dict[int, tuple[dict[str, Any], str]]:
    """The jobs an earlier part of this claims run finished: job number -> (results, run folder),
    for each line of finished.jsonl whose spec is the job's (a changed claim file runs again), that
    ended before any interrupt and whose folder still has its results.json."""
    path = out / FINISHED
    if not path.exists():
        return {}
    by_spec = {json.dumps(j.spec.to_json(), sort_keys=True): j for j in jobs}
    done: dict[int, tuple[dict[str, Any], str]] = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            job = by_spec.get(json.dumps(entry["spec"], sort_keys=True))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short when the claims run was killed
        if job is None or entry.get("interrupted") or not (Path(entry["run_dir"]) / "results.json").is_file():
            continue
        done[job.number] = (_results(Path(entry["run_dir"])), entry["run_dir"])
    return done


class ChildRuns:
    """Runs a spec as `faultline run` in a child process of its own session (so a terminal's
    Ctrl-C reaches the children only through `stop`, once each); its output goes to
    `<out>/logs/<job>.log`."""

    def __init__(self, out: Path):
        self.logs = out / "logs"
        self.live: dict[int, subprocess.Popen] = {}
        self.stopped = False
        self.lock = threading.Lock()

    def __call__(self, spec: TestSpec, number: int = 0) -> tuple[int, Path | None]:
        self.logs.mkdir(parents=True, exist_ok=True)
        base = f"{number:04d}-{spec.name}-seed{spec.seed}"
        spec_file, result_file = self.logs / f"{base}.spec.json", self.logs / f"{base}.result.json"
        spec_file.write_text(json.dumps(spec.to_json()))
        with open(self.logs / f"{base}.log", "wb") as log, self.lock:
            if self.stopped:
                return INTERRUPTED, None
            child = subprocess.Popen([sys.executable, "-m", "faultline.runner.claims", str(spec_file),
                                      str(result_file)], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            self.live[child.pid] = child
        try:
            child.wait()
        finally:
            with self.lock:
                self.live.pop(child.pid, None)
        try:
            result = json.loads(result_file.read_text())
            return int(result["status"]), Path(result["run_dir"])
        except (OSError, ValueError, KeyError):
            return child.returncode, None

    def stop(self) -> None:
        """Tell every live run to stop (once), and start no more."""
        with self.lock:
            self.stopped = True
            for child in self.live.values():
                try:
                    child.send_signal(signal.SIGINT)
                except ProcessLookupError:
                    pass


def run_claims(claims: list[Claim], systems: list[tuple[str, str | None]], seeds: int, quick: bool, out: Path,
               run: Callable | None = None, say: Callable[[str], None] = print, parallel: int = 1,
               resume: bool = False) -> list[Row]:
    """Run and judge every claim on every system, `parallel` runs at once; `run(spec) -> (status,
    run_dir)` (a ChildRuns by default). Returns the rows; on Ctrl-C or SIGTERM the runs are
    stopped, the rows judge what finished, and each row's `interrupted` is true. With `resume`,
    the runs `out` finished before are taken, not run again."""
    rows, jobs = plan_jobs(claims, systems, seeds, quick, out)
    out.mkdir(parents=True, exist_ok=True)
    said = threading.Lock()
    tell = say

    def say(text: str) -> None:  # one line at a time from the pool's threads
        with said:
            tell(text)
    children = ChildRuns(out) if run is None else None
    results: dict[int, tuple[dict[str, Any], str | None]] = dict(finished_before(out, jobs)) if resume else {}
    if resume:
        say(f"resuming {out}: {len(results)} of {len(jobs)} runs finished before; {len(jobs) - len(results)} to run")
    ledger = open(out / FINISHED, "a")
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            raise KeyboardInterrupt(signal.Signals(signum).name)
        previous = signal.signal(signal.SIGTERM, on_term)
    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="claim-run")
    started: dict[int, float] = {}

    def one(job: Job) -> tuple[Job, int, Path | None]:
        started[job.number] = time.monotonic()
        say(f"[{job.number}/{len(jobs)}] {job.what}: started")
        status, run_dir = children(job.spec, job.number) if children else run(job.spec)
        return job, status, run_dir

    def finish(job: Job, status: int, run_dir: Path | None, interrupted: bool = False) -> None:
        # Judged once: the interrupt's clean-up finishes every run again, as one may have ended
        # while this was under way for it (the signal lands between any two steps).
        if job.number in results:
            return
        if run_dir is None:
            # Never started, or ended before making a store folder: not a run to judge.
            say(f"[{job.number}/{len(jobs)}] {job.what}: no run (exit status {status})")
            return
        result = _results(run_dir)
        say(f"[{job.number}/{len(jobs)}] {job.what}: {_said(result)} "
            f"({time.monotonic() - started[job.number]:.0f} s): {run_dir}")
        results[job.number] = (result, str(run_dir))
        # A run that ended during the interrupt may have been cut short: a resumed run does it again.
        ledger.write(json.dumps({"job": job.number, "spec": job.spec.to_json(), "status": status,
                                 "run_dir": str(run_dir), "interrupted": interrupted}) + "\n")
        ledger.flush()

    futures: list = []
    interrupted = False
    try:
        for job in start_order(rows, jobs):
            if job.number not in results:
                futures.append(pool.submit(one, job))
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                finish(*future.result())
    except KeyboardInterrupt as exc:
        interrupted = True
        say(f"interrupted ({str(exc) or 'SIGINT'}): stopping the runs under way; each cleans up and checks what it "
            f"recorded, then the tables judge the {len(results)} finished run(s) and those")
        for future in futures:
            future.cancel()  # those not started; a run under way or ended is not cancelled
        # Runs that ended before the stop are whole; those under way now are told to stop.
        ended = {future for future in futures if future.done()}
        if children:
            children.stop()
        for future in futures:
            if not future.cancelled():
                try:
                    finish(*future.result(), interrupted=future not in ended)
                except Exception:  # noqa: BLE001 - an interrupted run that left nothing is simply not judged
                    continue
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        ledger.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for i, row in enumerate(rows):
        if row.na:
            continue
        sides = {j.side.name: j.side for j in jobs if j.row == i}
        for name, side in sides.items():
            mine = [results[j.number] for j in jobs if j.row == i and j.side.name == name and j.number in results]
            row.sides[name] = (side, judge_side(side, [r for r, _ in mine]), [f for _, f in mine])
        row.verdict = judge_claim({n: (s, o) for n, (s, o, _) in row.sides.items()})
    if interrupted:
        for row in rows:
            row.interrupted = True
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
    lines = [f"# Claims ({seeds} seed{'s' if seeds != 1 else ''} per configuration)", ""]
    if any(r.interrupted for r in rows):
        lines += ["Interrupted: each side is judged from the runs that finished.", ""]
    lines += [
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
            "<h1>faultline claims</h1>" + ("<p><b>Interrupted</b>: each side is judged from the runs that "
                                            "finished.</p>" if any(r.interrupted for r in rows) else "")
            + f"<p>{seeds} seed(s) per configuration. A claim is CONFIRMED when its unsafe "
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
    """1 when a claim is CONTRADICTED; else INTERRUPTED when the runs were stopped; else 0."""
    if any(r.verdict == CONTRADICTED for r in rows):
        return 1
    return INTERRUPTED if any(r.interrupted for r in rows) else 0


def main(argv: list[str]) -> int:
    """The child process of one run: `python -m faultline.runner.claims SPEC.json RESULT.json`
    runs the spec as `faultline run` does and writes {"status", "run_dir"} to RESULT.json."""
    from .run import run_test

    spec_file, result_file = argv
    status, run_dir = run_test(TestSpec.from_json(json.loads(Path(spec_file).read_text())), show_progress=False)
    Path(result_file).write_text(json.dumps({"status": status, "run_dir": str(run_dir)}))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

