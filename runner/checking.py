"""Checking with a progress line: store folders -> verdicts, while showing
what Spark is doing.

In: paths, the Spark master and an optional model name. Out: the `Checked`
results of `checker.check.check_paths`, with a progress line on stderr
(elapsed, which history, Spark's active stage and its tasks) meanwhile.

A running check server (runner/check_server.py) with the same master checks
Spark's share instead, in its warm session; without one, or when it goes away,
the check runs in this process.

`start_spark_early(master, history)`: the Spark session started in a
background thread (for a run: while its cluster is torn down), so the check
that follows finds it running; not when a check server will take the check.
"""

from __future__ import annotations

import logging
import sys
import threading
from contextlib import nullcontext
from pathlib import Path

from ..checker.check import Checked, check_paths, history_sizes
from .progress import Progress


def spark_status(spark) -> str:
    tracker = spark.sparkContext.statusTracker()
    stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
    stages = [s for s in stages if s is not None]
    if not stages:
        return "between Spark jobs"
    done = sum(s.numCompletedTasks for s in stages)
    total = sum(s.numTasks for s in stages)
    return f"Spark stage {max(s.stageId for s in stages)}: {done}/{total} tasks"


def start_spark_early(spark_master: str, history: Path) -> threading.Thread:
    """Start the check's Spark session now, in a daemon thread, tuned for `history` as it is.

    The JVM takes seconds to start, time a run otherwise adds after its teardown; the check's own
    get_session then returns this session (getOrCreate waits for one being started). A failure
    here is only logged: the check starts the session again and reports why it cannot."""
    def start() -> None:
        from ..history_analysis.session import get_session
        from .check_server import serving

        if serving(spark_master) is not None:
            return

        try:
            get_session(spark_master, inputs=history_sizes([history]))
        except Exception:  # noqa: BLE001 - the check will say it, in its own words
            logging.getLogger("faultline.run").debug("starting Spark early failed", exc_info=True)

    thread = threading.Thread(target=start, name="faultline-spark-start", daemon=True)
    thread.start()
    return thread


def check_with_progress(paths: list[str | Path], spark_master: str, model: str | None,
                        show_progress: bool = True, engine: str = "spark", report: bool = True,
                        server: bool = True, sock: Path | None = None) -> list[Checked]:
    """`server`: let a running check server take a Spark check: the one at `sock` (a run's own), by
    default the user's (check_server.socket_path())."""
    if engine != "spark":
        return check_paths(paths, spark_master, model, engine=engine, report=report,
                           progress=(lambda text: print(text, file=sys.stderr)) if show_progress else None)
    from ..history_analysis.session import get_session

    state = {"what": "starting Spark", "spark": None, "server": None}

    def describe() -> str:
        if state["server"] is not None:
            return state["server"]
        spark = state["spark"]
        return f"{state['what']}: " + (spark_status(spark) if spark is not None else "starting")

    def note(text: str) -> None:
        state["what"] = text

    if server:
        from .check_server import checked_by_server, serving, socket_path

        running = serving(spark_master, sock)
        if running is not None:
            with Progress(describe) if show_progress else nullcontext():
                state["server"] = f"sent to the check server (pid {running['pid']})"
                checked = checked_by_server(paths, spark_master, model, report,
                                            lambda text: state.update(server=text), sock)
                state["server"] = ("checked by the check server" if checked is not None else
                                   "the check server did not finish the check: checking here")
            state["server"] = None
            if checked is not None:
                running = serving(spark_master, sock) or running
                which = (f"the run's own check server (pid {running['pid']}, after {running['warm_up_checks']} "
                         f"warm-up check(s) beside the run)" if sock is not None else
                         f"the check server at {socket_path()} (pid {running['pid']})")
                print(f"checked by {which}", file=sys.stderr)
                return checked
    if not show_progress:
        return check_paths(paths, spark_master, model, report=report)
    with Progress(describe):
        state["spark"] = get_session(spark_master, inputs=history_sizes(paths))
        return check_paths(paths, spark_master, model, progress=note, spark=state["spark"], report=report)
