"""Reading a history from its JSON against reading its side-car, in one warm Spark session.

Loads one history (`history_analysis.load.load_histories`) in turn, each round: from its JSON;
from its JSON with the side-car written (a check's first reading of a large history without
one); from that side-car (written by Spark); and from the side-car the harness's writer builds
(pyarrow; built once, first). Prints wall time and the JVM's CPU time of each. The history's
side-car is left as the harness's writer builds it.

    .venv/bin/python benchmarks/sidecar_load.py /tmp/faultline-check-scale/ops-1000000/history.jsonl --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from faultline.history_analysis import session
from faultline.history_analysis.load import file_size, load_histories
from faultline.models import operations_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("history", help="a history.jsonl of 64 MB or more (smaller ones get no side-car from a check)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    path = str(Path(args.history).resolve())
    spark = session.get_session("local[2]", inputs=[file_size(path)])
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()

    def jvm_cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    folder = operations_table.path_for(path)
    harness = folder.with_name(folder.name + ".harness")
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    built = operations_table.build(path)
    if built.problem:
        print(f"{path}: no side-car: {built.problem}", file=sys.stderr)
        return 1
    print(json.dumps({"built_seconds": round(time.perf_counter() - started, 1)}), flush=True)
    folder.replace(harness)

    def timed(what: str, sidecars: bool) -> None:
        cpu, started = jvm_cpu(), time.perf_counter()
        loaded = load_histories(spark, [path], sidecars=sidecars)
        seconds = time.perf_counter() - started
        print(json.dumps({"round": r, "read": what, "from_sidecar": loaded.ops is None, "seconds": round(seconds, 1),
                          "jvm_cpu_seconds": round(jvm_cpu() - cpu, 1)}), flush=True)
        loaded.unpersist()

    try:
        for r in range(1, args.rounds + 1):
            timed("json", False)
            shutil.rmtree(folder, ignore_errors=True)
            timed("json, writing the side-car", True)
            timed("side-car written by the check", True)
            shutil.rmtree(folder)
            shutil.copytree(harness, folder)
            timed("side-car written by the harness", True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        harness.replace(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
