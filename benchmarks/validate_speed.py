"""How fast the history validator runs, in each reader.

Writes a synthetic valid history of --ops operations (check_scale.generate: two lines an
operation), then times, in lines/s:
- json.loads of every line alone (the floor of any Python reader);
- the Python validator over every line (models/history_schema: parse_line + check_line);
- read_history (the Python engine's reader: the validator plus the checks across lines);
(the Python figures in CPU seconds of this process, so that other load on the machine counts less);
- with --spark, load_history (the Spark engine's loader: the generated schema and SQL checks,
  the checks across lines, the operations table), in a fresh session, twice (the first run
  includes the JVM's warm-up), in wall-clock seconds.

    .venv/bin/python benchmarks/validate_speed.py --ops 1000000 --spark
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_scale import generate  # noqa: E402

from faultline.models.history import read_history  # noqa: E402
from faultline.models.history_schema import check_line, parse_line  # noqa: E402


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} lines/s ({seconds:.1f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--dir", default="/tmp/faultline-bench")
    parser.add_argument("--spark", action="store_true", help="time the Spark loader too")
    args = parser.parse_args()
    path = Path(args.dir) / f"history-{args.ops}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        generate(path, args.ops)
    raw = path.read_bytes()
    lines = raw.split(b"\n")[:-1]
    n = len(lines)
    print(f"{path}: {n:,} lines, {len(raw) / 1e6:,.0f} MB; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")

    t = time.process_time()
    for line in lines:
        json.loads(line)
    print(f"json.loads alone          {rate(n, time.process_time() - t)}")
    t = time.process_time()
    for line in lines:
        check_line(parse_line(line))
    print(f"validator (Python)        {rate(n, time.process_time() - t)}")
    del lines, raw
    t = time.process_time()
    read = read_history(path)
    print(f"read_history              {rate(read.lines, time.process_time() - t)}")
    del read

    if args.spark:
        from faultline.history_analysis.load import load_history
        from faultline.history_analysis.session import get_session

        spark = get_session("local[2]")
        for attempt in (1, 2):
            t = time.perf_counter()
            history = load_history(spark, str(path))
            history.operations.count()
            print(f"load_history (Spark) #{attempt}   {rate(history.lines, time.perf_counter() - t)} wall")
            history.unpersist()


if __name__ == "__main__":
    main()
