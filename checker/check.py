"""Check stored runs: history.jsonl (+ test.json) -> results.json, in one Spark session.

In: store folders (or history files), the engine (Spark, with its master, or
plain Python); optionally a model name that overrides the one derived from
each run's test.json.
Out: for each path, its results (written to results.json beside the
history, with report.html) and exit status. A checker never crashes the run: an unreadable
history or an analysis error becomes an `unknown` verdict with the reason.

The reports are drawn in a thread of their own (`Reports`) while the analyses go on (a report's
plots over time need only the history); small histories are analysed together, in one Spark plan
(`batches`).
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..models.guarantees import STRICTEST, Model, for_history, model_for_settings, model_named
from ..models.history import HistoryError, one_line
from ..models.spec import WORKLOADS
from ..models.spec_schema import SpecFileError, read_spec_file
from .cycles import add_cycles
from .report import REPORT, Drawn, draw, needs_results, write_report
from .verdict import exit_status, fail_closed, unknown, verdict, write_results

log = logging.getLogger("faultline.checker")


@dataclass
class Checked:
    directory: Path
    results: dict[str, Any]

    @property
    def status(self) -> int:
        return exit_status(self.results)


def locate(path: str | Path) -> tuple[Path, Path]:
    """(folder, history file) for a store folder or a history file path."""
    path = Path(path)
    if path.is_dir():
        return path, path / "history.jsonl"
    return path.parent, path


def history_sizes(paths: list[str | Path]) -> list[int] | None:
    """The sizes in bytes of the histories of `paths` (store folders or history files), None when
    one is not a local file whose size can be read: the Spark session is tuned for them."""
    sizes = []
    for path in paths:
        try:
            sizes.append(locate(path)[1].stat().st_size)
        except OSError:
            return None
    return sizes


def read_spec(directory: Path) -> dict[str, Any] | None:
    """The run's test.json beside its history, checked against its schema (models/spec_schema.py),
    or None when there is none; a SpecFileError (a ValueError) naming test.json and the field."""
    spec_path = directory / "test.json"
    if not spec_path.exists():
        return None
    return read_spec_file(spec_path)


def model_for(directory: Path, override: str | None) -> tuple[Model, str | None]:
    """The run's model and, when test.json is absent, a note saying so. A model name (`override`, or
    test.json's `model`) sets the promises; otherwise they come from test.json's producer, consumer
    and broker settings and its nemesis list. How consumers read (test.json's consumer_mode, assign
    when absent) is a fact of the run, under any model."""
    spec = read_spec(directory)
    traits = WORKLOADS.get((spec or {}).get("workload") or "queue", WORKLOADS["queue"])
    mode = (spec or {}).get("consumer_mode") or traits.consumer_mode
    if override:
        return model_named(override, mode), None
    if spec is None:
        return model_named(STRICTEST), f"no test.json beside the history: judged by the strictest model, {STRICTEST}"
    if spec.get("model"):
        try:
            return model_named(spec["model"], mode), None
        except ValueError as exc:
            raise SpecFileError(directory / "test.json", f"field model: {exc}; correct it in test.json, or give "
                                                         f"--model", field="model") from None
    return model_for_settings(spec.get("producer") or {}, mode, spec.get("broker_settings") or {},
                              spec.get("nemesis") or [], spec.get("consumer") or {},
                              transactions=traits.transactions, commit=traits.commit), None


ENGINES = ("spark", "python")
# Beside a history: the failures of the harness during its run (one JSON object a line), which
# make its verdict unknown whatever the history shows.
HARNESS_ERRORS = "harness-errors.jsonl"


def record_harness_error(directory: Path, error: str, trace: str) -> None:
    with open(directory / HARNESS_ERRORS, "a") as f:
        f.write(json.dumps({"error": error, "traceback": trace}) + "\n")


# Beside a history: what the harness achieved (harness.json: the rate asked and the rate of client
# invocations reached in the main phase), which results.json repeats under `rate`.
HARNESS = "harness.json"
# A rate more than this far below the one asked is warned about: the run tested less than it said.
SHORTFALL = 0.2


def record_rate(directory: Path, asked: float, invocations: int, seconds: float,
                cost: dict[str, float] | None = None) -> None:
    """Write harness.json: the rate asked and reached in the main phase, and what it cost
    (`cpu_ms_per_op`, the harness's CPU per operation; `machine_busy`, the machine's busy share)
    when measured."""
    achieved = invocations / seconds if seconds > 0 else None
    (directory / HARNESS).write_text(json.dumps({"phase": "main", "asked": asked, "invocations": invocations,
                                                 "seconds": round(seconds, 3),
                                                 "achieved": None if achieved is None else round(achieved, 1),
                                                 **(cost or {})}) + "\n")


def harness_rate(directory: Path) -> tuple[dict[str, Any] | None, str | None]:
    """results.json's `rate` from harness.json ({asked, achieved}, ops/s), and a warning when the
    rate achieved fell short of the one asked by more than SHORTFALL; (None, None) without one."""
    try:
        found = json.loads((directory / HARNESS).read_text())
        asked, achieved = float(found["asked"]), found.get("achieved")
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    rate = {"asked": asked, "achieved": achieved}
    if achieved is not None and achieved < (1 - SHORTFALL) * asked:
        return rate, (f"warning: the harness invoked {achieved:g} client operations per second in the main phase, "
                      f"{100 * achieved / asked:.0f}% of the {asked:g} asked: the run drove the system less hard "
                      f"than its spec says (fewer clients' operations around each fault); ask for a rate it can "
                      f"reach, or raise --concurrency")
    return rate, None


def harness_errors(directory: Path) -> list[str]:
    path = directory / HARNESS_ERRORS
    if not path.exists():
        return []
    return [json.loads(line)["error"] for line in path.read_text().splitlines() if line.strip()]


def check(history: Path, model: Model, engine: str = "spark", spark=None, spark_master: str = "local[2]",
          full_dir: Path | None = None) -> dict[str, Any]:
    """The checker as one call: a history and a model -> results (the dict results.json holds).
    Composes the analysis engine (Spark, or plain Python), the cycle search and the verdict;
    raises HistoryError for a history that cannot be read."""
    if engine == "python":
        from ..history_analysis.reference import analyse as analyse_python

        analysis = analyse_python(history, full_dir=full_dir)
    else:
        from ..history_analysis.anomalies import analyse
        from ..history_analysis.session import get_session

        spark = spark or get_session(spark_master, inputs=history_sizes([history]))
        analysis = analyse(spark, str(history), full_dir=str(full_dir) if full_dir else None)
    return judge(analysis, model, full_dir)


def judge(analysis, model: Model, full_dir: Path | None = None) -> dict[str, Any]:
    """An engine's Analysis of a history and its model -> results: the cycle search, then the
    verdict."""
    # What the history shows of its consumers and operations refines the model (rule 10 of the
    # Jepsen semantics: the consumer mode comes from the history, under any model).
    return verdict(add_cycles(analysis, full_dir=full_dir), for_history(model, analysis.stats))


class Reports:
    """report.html of each checked folder, made in one thread of its own (matplotlib is not
    thread-safe), in the order asked: `start` draws a folder's plots over time as its check begins,
    `finish` writes its report once its results are in; `close` waits for every report. Safe to
    call from several threads."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="faultline-report")
        self.lock = threading.Lock()
        self.drawing: dict[Path, Future] = {}
        self.writing: list[Future] = []

    def start(self, directory: Path) -> None:
        if directory.is_dir() and not needs_results(directory):
            with self.lock:
                self.drawing[directory] = self.pool.submit(self._draw, directory)

    @staticmethod
    def _draw(directory: Path) -> Drawn | None:
        try:
            return draw(directory)
        except Exception:  # noqa: BLE001 - write_report draws again, and says why it cannot
            log.debug("drawing %s's plots failed", directory, exc_info=True)
            return None

    def finish(self, directory: Path, results: dict[str, Any], spark) -> None:
        with self.lock:
            drawing = self.drawing.pop(directory, None)
            # The same thread drew the plots before: they are ready when this runs.
            self.writing.append(self.pool.submit(
                lambda: write_report(directory, results, spark, drawing.result() if drawing else None)))

    def close(self) -> None:
        for future in self.writing:
            future.result()
        self.pool.shutdown(wait=True, cancel_futures=True)


def batches(paths: list[str | Path], engine: str) -> list[list[int]]:
    """The places of `paths`, grouped into the analyses that check them: with Spark, consecutive
    distinct histories known to be small (session.SMALL_INPUT_BYTES) go together, as many as
    stay under that size in all, into one analysis (analyse_many: one plan for all; 30 histories
    of a default run's size took 39 s of CPU so, 123 s one by one); any other path alone."""
    if engine != "spark":
        return [[i] for i in range(len(paths))]
    from ..history_analysis.session import SMALL_INPUT_BYTES

    out: list[list[int]] = []
    batch: list[int] | None = None
    seen: set[Path] = set()
    total = 0
    for i, path in enumerate(paths):
        history = locate(path)[1]
        try:
            size, real = history.stat().st_size, history.resolve()
        except OSError:
            size = real = None
        if size is None or size >= SMALL_INPUT_BYTES:
            out.append([i])
            batch = None
            continue
        if batch is None or total + size >= SMALL_INPUT_BYTES or real in seen:
            batch, seen, total = [], set(), 0
            out.append(batch)
        batch.append(i)
        seen.add(real)
        total += size
    return out


def check_paths(paths: list[str | Path], spark_master: str = "local[2]", model: str | None = None,
                progress=None, spark=None, engine: str = "spark", report: bool = True) -> list[Checked]:
    """`spark`: a session to use; by default one is started on the first readable history.
    `engine`: "spark", or "python" (the plain-Python analysis, for histories that fit in memory).
    `report`: also write report.html into each store folder (checker.report); every report is
    written when this returns. Small histories are analysed together (`batches`)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    reports = Reports() if report else None
    base = {"spark": spark}

    def session():
        """The Spark session, started by the first history that needs it, tuned for all `paths`."""
        if base["spark"] is None:
            from ..history_analysis.session import get_session

            base["spark"] = get_session(spark_master, inputs=history_sizes(paths))
        return base["spark"]

    out: list[Checked | None] = [None] * len(paths)
    try:
        for batch in batches(paths, engine):
            if progress:
                first, last = batch[0] + 1, batch[-1] + 1
                what = (f"checking {locate(paths[batch[0]])[1]} ({first}/{len(paths)})" if len(batch) == 1 else
                        f"checking histories {first}-{last} of {len(paths)} together")
                progress(what)
            located = [(i, *locate(paths[i])) for i in batch]
            if reports is not None:
                for _, directory, _ in located:
                    reports.start(directory)
            found = _checked_together(located, model, session, progress) if len(batch) > 1 else None
            for i, directory, history in located:
                if found is not None and i in found:
                    results, used = found[i], base["spark"]
                else:
                    results, used = _results(directory, history, model, engine,
                                             session if engine == "spark" else None, spark_master)
                if directory.is_dir():
                    write_results(directory, results)
                    if reports is not None:
                        if progress:
                            progress(f"writing {directory / REPORT}")
                        reports.finish(directory, results, used)
                out[i] = Checked(directory, results)
        return out  # type: ignore[return-value] - every place is filled
    finally:
        if reports is not None:
            reports.close()


def _checked_together(located: list[tuple[int, Path, Path]], model: str | None, session,
                      progress) -> dict[int, dict[str, Any]] | None:
    """The results of several histories from one Spark analysis (analyse_many), by place; those
    whose model cannot be known, or with no history file, are left out (checked alone, which
    says why). None when the analysis itself failed: each is then checked alone, so that a
    failure names its own history."""
    from ..history_analysis.anomalies import analyse_many

    ready = []
    for i, directory, history in located:
        try:
            chosen, note = model_for(directory, model)
        except ValueError:
            continue
        if history.exists():
            ready.append((i, directory, history, chosen, note))
    if len(ready) < 2:
        return None
    try:
        analyses = analyse_many(session(), [str(h) for _, _, h, _, _ in ready],
                                full_dirs=[str(d / "anomalies") for _, d, _, _, _ in ready])
    except Exception:  # noqa: BLE001 - each is checked alone next, and says its own failure
        log.warning("checking %d histories together failed; checking them one by one", len(ready), exc_info=True)
        if progress:
            progress("checking the histories one by one")
        return None
    out = {}
    for (i, directory, history, chosen, note), analysis in zip(ready, analyses):
        try:
            if isinstance(analysis, HistoryError):
                raise analysis
            out[i] = _completed(directory, judge(analysis, chosen, directory / "anomalies"), note)
        except Exception as exc:  # noqa: BLE001 - a checker error is an unknown verdict, not a crash
            out[i] = _failed(chosen.name, history, exc)
    return out


def _completed(directory: Path, results: dict[str, Any], note: str | None) -> dict[str, Any]:
    """A history's results with what its folder adds: the harness's failures (which make the
    verdict unknown), the note on its model, its rate."""
    failures = harness_errors(directory)
    if failures:
        fail_closed(results, [f"the harness failed during the run ({e}); see {HARNESS_ERRORS}"
                              for e in failures])
    if note:
        results.setdefault("notes", []).append(note)
    rate, warning = harness_rate(directory)
    if rate is not None:
        results["rate"] = rate
    if warning:
        results.setdefault("notes", []).append(warning)
    return results


def _results(directory: Path, history: Path, model: str | None, engine: str, session,
             spark_master: str) -> tuple[dict[str, Any], Any]:
    """The results of one history (an unknown verdict with the reason when it cannot be checked),
    and the Spark session it used (None when none): `session()` gives it, started when first
    needed."""
    model_name = model or STRICTEST
    spark = None
    try:
        chosen, note = model_for(directory, model)
        model_name = chosen.name
        if not history.exists():
            raise HistoryError(history, None, "no such file: give a store folder holding history.jsonl, "
                                              "or the path of a history file")
        if session is not None:
            spark = session()
        results = check(history, chosen, engine, spark, spark_master, full_dir=directory / "anomalies")
        return _completed(directory, results, note), spark
    except Exception as exc:  # noqa: BLE001 - a checker error is an unknown verdict, not a crash
        return _failed(model_name, history, exc), spark


def _failed(model_name: str, history: Path, exc: Exception) -> dict[str, Any]:
    """The unknown verdict of a history that could not be checked, saying why."""
    if isinstance(exc, HistoryError):
        return unknown(model_name, f"the history could not be read: {exc}")
    if isinstance(exc, ValueError):
        return unknown(model_name, str(exc))
    log.error("checking %s failed", history, exc_info=exc)
    reason = f"the checker failed: {type(exc).__name__}: {one_line(exc)}"
    if "stopped SparkContext" in str(exc):
        # Spark's JVM stops itself when its heap runs out, and says so only in its own log.
        reason = ("the Spark JVM stopped during the analysis, most likely out of memory: give it "
                  "more with FAULTLINE_SPARK_DRIVER_MEMORY (for example 12g) or use a Spark "
                  "cluster (--spark-master). " + reason)
    return unknown(model_name, reason)
