"""Where a Spark check's time goes: each phase of the analysis of one history, timed apart in one
session.

The phases, in the order `faultline check` runs them: the session (JVM start), reading and
validating the history (load_history: parsing with the line checks, pairing completions with
invocations, the operations table), the facts (one shuffle by key and its windows), every witness
in one job, the dependency edges and the cycle-search hubs (computed, then brought to Python as
Arrow columns and sorted), and the cycle search. Each Spark phase is forced by an action of its own, so a
figure is that phase's work alone; a scan of the whole facts table shows what reading them again
costs. Prints one JSON line per phase (seconds, and the Spark jobs it ran), then the total. With
--rounds N the phases run N times over in the same session, each round's lines tagged with it: the
later rounds show a warm JVM's figures (a check server's, or a run's own).

    .venv/bin/python benchmarks/check_phases.py /tmp/faultline-check-scale/ops-1000000/history.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pyspark.sql import SparkSession

from faultline.checker.cycles import add_cycles
from faultline.history_analysis import anomalies as A
from faultline.history_analysis.load import file_size, load_histories
from faultline.history_analysis.result import DEPENDENCY_COLUMNS, HUB_COLUMNS, Analysis
from faultline.history_analysis.session import get_session, sized_for


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("history", help="a history.jsonl file")
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--rounds", type=int, default=1, help="times to run the phases, in one session (default 1)")
    args = parser.parse_args()
    total = 0.0
    rnd = 1

    def timed(phase: str, work):
        nonlocal total
        active = SparkSession.getActiveSession()  # none yet while the session phase starts it
        tracker = active.sparkContext.statusTracker() if active is not None else None
        if active is not None:
            active.sparkContext.setJobGroup(phase, phase)
        started = time.perf_counter()
        out = work()
        seconds = time.perf_counter() - started
        total += seconds
        jobs = {"jobs": len(tracker.getJobIdsForGroup(phase))} if tracker is not None else {}
        print(json.dumps({"round": rnd, "phase": phase, "seconds": round(seconds, 1), **jobs}), flush=True)
        return out

    size = file_size(args.history)
    spark = timed("session", lambda: get_session(args.spark_master, inputs=[size] if size is not None else None))
    for rnd in range(1, args.rounds + 1):
        if rnd > 1:
            total = 0.0
        round_of_phases(spark, size, args, timed)
        print(json.dumps({"round": rnd, "phase": "total", "seconds": round(total, 1)}), flush=True)
    return 0


def round_of_phases(spark, size, args, timed) -> None:
    with sized_for(spark, size):
        history = timed("load (read, check, pair, operations)", lambda: load_histories(spark, [args.history]))
        facts, keys = timed("facts", lambda: A._facts(history))
        timed("scan of every fact column", lambda: facts.selectExpr("sum(hash(*))").collect())
        timed("witnesses", lambda: A._all_witnesses(spark, history, facts, keys)[0].selectExpr("count(json)").collect())
        edges, hubs = A._dependencies(facts)
        timed("edges, computed", lambda: edges.selectExpr("sum(size(rows))").collect())
        deps = timed("edges, computed and collected as Arrow columns",
                     lambda: A._collected(edges, DEPENDENCY_COLUMNS, ("kind", "key"), [0])[0])
        hub_list = timed("hubs, computed and collected as Arrow columns",
                         lambda: A._collected(hubs, HUB_COLUMNS, ("process", "type"), [0])[0])
        timed("cycle search", lambda: add_cycles(Analysis(counts={}, examples={}, stats={}, notes=[],
                                                         dependencies=deps, hubs=hub_list)))


if __name__ == "__main__":
    sys.exit(main())
