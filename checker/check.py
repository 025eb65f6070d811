"""Check stored runs: history.jsonl (+ test.json) -> results.json, in one Spark session.

In: store folders (or history files), the engine (Spark, with its master, or
plain Python); optionally a model name that overrides the one derived from
each run's test.json.
Out: for each path, its results (written to results.json beside the
history, with report.html) and exit status. A checker never crashes the run: an unreadable
history or an analysis error becomes an `unknown` verdict with the reason.

The reports are drawn in a thread of their own (`Reports`) while the analyses go on (a report's
plots over time need only the history); several small histories are checked two at a time
(CONCURRENT_CHECKS).
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


# Small histories checked at once, each in a Spark session of its own over one SparkContext: a
# small history's analysis is mostly planning in one driver thread and tasks of one partition, so
# a second one at a time uses the other core. 30 histories of 1,500 operations on 2 cores took
# 3.84 s each one at a time, 2.71 s two at a time, 2.58 s three at a time.
CONCURRENT_CHECKS = 2


def _concurrent(paths: list[str | Path], engine: str) -> int:
    """How many of `paths` to check at once: CONCURRENT_CHECKS when Spark checks several distinct
    histories all known to be small (two large analyses at once would need twice the memory),
    else 1."""
    if engine != "spark" or len(paths) < 2 or len({locate(p)[0].resolve() for p in paths}) < len(paths):
        return 1
    from ..history_analysis.session import SMALL_INPUT_BYTES

    sizes = history_sizes(paths)
    return CONCURRENT_CHECKS if sizes is not None and max(sizes) < SMALL_INPUT_BYTES else 1


def check_paths(paths: list[str | Path], spark_master: str = "local[2]", model: str | None = None,
                progress=None, spark=None, engine: str = "spark", report: bool = True) -> list[Checked]:
    """`spark`: a session to use; by default one is started on the first readable history.
    `engine`: "spark", or "python" (the plain-Python analysis, for histories that fit in memory).
    `report`: also write report.html into each store folder (checker.report); every report is
    written when this returns. Small histories are checked CONCURRENT_CHECKS at a time."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    reports = Reports() if report else None
    workers = _concurrent(paths, engine)
    base = {"spark": spark}
    starting = threading.Lock()
    mine = threading.local()

    def session():
        """This thread's session: the base one (started by the first history that needs it,
        tuned for all `paths`), or with several threads a new session over its SparkContext,
        whose settings (session.sized_for) no other thread changes."""
        with starting:
            if base["spark"] is None:
                from ..history_analysis.session import get_session

                base["spark"] = get_session(spark_master, inputs=history_sizes(paths))
        if workers == 1:
            return base["spark"]
        if getattr(mine, "spark", None) is None:
            mine.spark = base["spark"].newSession()
        return mine.spark

    def one(numbered: tuple[int, str | Path]) -> Checked:
        i, path = numbered
        directory, history = locate(path)
        if progress:
            progress(f"checking {history} ({i + 1}/{len(paths)})")
        if reports is not None:
            reports.start(directory)
        results, used = _results(directory, history, model, engine, session if engine == "spark" else None,
                                 spark_master)
        if directory.is_dir():
            write_results(directory, results)
            if reports is not None:
                if progress:
                    progress(f"writing {directory / REPORT}")
                reports.finish(directory, results, used)
        return Checked(directory, results)

    try:
        if workers == 1:
            return [one(numbered) for numbered in enumerate(paths)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="faultline-check") as pool:
            return list(pool.map(one, enumerate(paths)))
    finally:
        if reports is not None:
            reports.close()


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
        return results, spark
    except HistoryError as exc:
        return unknown(model_name, f"the history could not be read: {exc}"), spark
    except ValueError as exc:
        return unknown(model_name, str(exc)), spark
    except Exception as exc:  # noqa: BLE001 - a checker error is an unknown verdict, not a crash
        log.exception("checking %s failed", history)
        reason = f"the checker failed: {type(exc).__name__}: {one_line(exc)}"
        if "stopped SparkContext" in str(exc):
            # Spark's JVM stops itself when its heap runs out, and says so only in its own log.
            reason = ("the Spark JVM stopped during the analysis, most likely out of memory: give it "
                      "more with FAULTLINE_SPARK_DRIVER_MEMORY (for example 12g) or use a Spark "
                      "cluster (--spark-master). " + reason)
        return unknown(model_name, reason), spark
