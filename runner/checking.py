"""Checking with a progress line: store folders -> verdicts, while showing
what Spark is doing.

In: paths, the Spark master and an optional model name. Out: the `Checked`
results of `checker.check.check_paths`, with a progress line on stderr
(elapsed, which history, Spark's active stage and its tasks) meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..checker.check import Checked, check_paths
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


def check_with_progress(paths: list[str | Path], spark_master: str, model: str | None,
                        show_progress: bool = True, engine: str = "spark") -> list[Checked]:
    if engine != "spark":
        return check_paths(paths, spark_master, model, engine=engine,
                           progress=(lambda text: print(text, file=sys.stderr)) if show_progress else None)
    from ..history_analysis.session import get_session

    state = {"what": "starting Spark", "spark": None}

    def describe() -> str:
        spark = state["spark"]
        return f"{state['what']}: " + (spark_status(spark) if spark is not None else "starting")

    def note(text: str) -> None:
        state["what"] = text

    if not show_progress:
        return check_paths(paths, spark_master, model)
    with Progress(describe):
        state["spark"] = get_session(spark_master)
        return check_paths(paths, spark_master, model, progress=note, spark=state["spark"])
