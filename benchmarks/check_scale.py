"""How `faultline check` scales with the size of a history.

Writes synthetic, valid queue histories of the requested sizes (operations =
invocations; each is two lines), then times `faultline check` on each, with
each engine (Spark, and plain Python where the history fits in memory), in a
fresh process, and reports operations/s and which engine was faster at each
size. With --small N, also N histories of --small-ops operations (a default
run's size) checked in one `faultline check` call, as a user re-checking a
store does. Histories are kept in --dir, so a second run can skip generation
with --reuse. Every figure is one process from start to results.json, JVM
start included: what a user waits for. With --compare-archive, every Spark figure is taken twice,
without and with the class archive (history_analysis/class_archive.py; build it first), in turn.
With --server, every Spark figure is also taken through a check server (`faultline check-server`)
started once, warmed up, before the first: the wait of a user who keeps one running.
Synthetic histories get their side-car (models/operations_table.py), as the harness's writer
gives a run's history; with --compare-sidecar, every Spark figure is taken twice, reading the
JSON (FAULTLINE_SIDECAR=0) and then the side-car. With --histories, also the histories of real runs (store folders, or history.jsonl files), each
timed alike: a run's consumers re-read partitions from the start, so its history holds far more
records per operation than a synthetic one (a default run's 3k operations: 5.9 MB). Checking one
rewrites its results.json, as `faultline check` does.

    .venv/bin/python benchmarks/check_scale.py --ops 1500 1000000 10000000 --small 30
    .venv/bin/python benchmarks/check_scale.py --ops 1000000 --reuse --engines spark --compare-sidecar
    .venv/bin/python benchmarks/check_scale.py --histories store/queue/20261127T225859.812
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from faultline.models import operations_table
from faultline.models.history import read_history
from faultline.models.synthetic_history import write_history


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, nargs="+", default=None,
                        help="synthetic history sizes in operations (default 100000 1000000, or none "
                             "with --histories)")
    parser.add_argument("--histories", nargs="+", default=[], metavar="PATH",
                        help="also time these runs' histories (store folders or history.jsonl files)")
    parser.add_argument("--dir", default="/tmp/faultline-check-scale", help="where histories are written")
    parser.add_argument("--reuse", action="store_true", help="reuse histories already in --dir")
    parser.add_argument("--engines", nargs="+", choices=("spark", "python"), default=["spark", "python"],
                        help="checker engines to time on each history (default: both)")
    parser.add_argument("--python-max-ops", type=int, default=3_000_000,
                        help="skip the python engine above this many operations: it holds the whole "
                             "history in memory (default 3000000)")
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--small", type=int, default=0, metavar="N",
                        help="also check N small histories in one call (default: none)")
    parser.add_argument("--small-ops", type=int, default=1500,
                        help="operations in each small history (default 1500, a default 30 s run)")
    parser.add_argument("--compare-archive", action="store_true",
                        help="time each Spark check without and with the class archive, in turn")
    parser.add_argument("--compare-sidecar", action="store_true",
                        help="time each Spark check reading the JSON and then the side-car, in turn")
    parser.add_argument("--server", action="store_true",
                        help="also time each Spark check sent to a check server (faultline check-server, "
                             "started once here and warmed up; its start is reported apart)")
    args = parser.parse_args()
    rows = []
    args.server_env = None
    if args.server:
        args.server_env = {**os.environ, "FAULTLINE_CHECK_SERVER": str(Path(args.dir) / "server" / "socket")}
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check-server", "start",
                               "--spark-master", args.spark_master], env=args.server_env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            return 1
        print(json.dumps({"server_start_seconds": round(time.perf_counter() - started, 1)}), flush=True)
    try:
        return run(args, rows)
    finally:
        if args.server_env is not None:
            subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check-server", "stop"],
                           env=args.server_env, capture_output=True)


def run(args: argparse.Namespace, rows: list[dict]) -> int:
    if args.small:
        folders = [history_for(args, args.small_ops, seed).parent for seed in range(args.small)]
        for engine in args.engines:
            rows.extend(measured(args, folders, args.small_ops, engine))
    for path in map(Path, args.histories):
        history = path / "history.jsonl" if path.is_dir() else path
        if not history.is_file():
            print(f"{path}: no history.jsonl there; give a store folder of a run or a history.jsonl file",
                  file=sys.stderr)
            return 1
        invocations = sum(op["type"] == "invoke" and op["process"] != "nemesis" for op in read_history(history).ops)
        print(json.dumps({"history": str(history), "ops": invocations}), flush=True)
        for engine in args.engines:
            rows.extend(measured(args, history, invocations, engine))
    ops = args.ops if args.ops is not None else ([] if args.histories else [100_000, 1_000_000])
    for n in ops:
        history = history_for(args, n)
        for engine in args.engines:
            if engine == "python" and n > args.python_max_ops:
                print(f"skipping the python engine on {n} operations (--python-max-ops {args.python_max_ops})",
                      file=sys.stderr, flush=True)
                continue
            rows.extend(measured(args, history, n, engine))
    faster = {}
    for r in rows:
        if "histories" not in r and not r.get("server") and r["exit"] == 0 and (r["ops"] not in faster or r["seconds"] < faster[r["ops"]]["seconds"]):
            faster[r["ops"]] = r
    print(json.dumps({"faster_engine_by_ops": {n: r["engine"] for n, r in sorted(faster.items())}}), flush=True)
    return 0 if all(r["valid"] is True for r in rows) else 1


def history_for(args: argparse.Namespace, n: int, seed: int | None = None) -> Path:
    folder = Path(args.dir) / (f"ops-{n}" if seed is None else f"small-{n}-{seed}")
    folder.mkdir(parents=True, exist_ok=True)
    history = folder / "history.jsonl"
    if not (args.reuse and history.exists()):
        started = time.perf_counter()
        print(f"generating {n} operations into {history}", file=sys.stderr, flush=True)
        write_history(history, n, seed=seed or 0)
        print(f"  generated in {time.perf_counter() - started:.1f}s "
              f"({history.stat().st_size / 1e6:.0f} MB)", file=sys.stderr, flush=True)
    if operations_table.fresh(history) is None:
        started = time.perf_counter()
        built = operations_table.build(history)
        print(f"  side-car built in {time.perf_counter() - started:.1f}s"
              + (f" (none: {built.problem})" if built.problem else ""), file=sys.stderr, flush=True)
    return history


def measured(args: argparse.Namespace, target: Path | list[Path], n: int, engine: str) -> list[dict]:
    """measure(), once; for Spark with --compare-archive, without and then with the class archive;
    for Spark with --server, then once more through the check server."""
    if engine != "spark":
        return [measure(args, target, n, engine)]
    if args.compare_sidecar:
        rows = [measure(args, target, n, engine, sidecar=False), measure(args, target, n, engine, sidecar=True)]
    else:
        rows = ([measure(args, target, n, engine, archive=False), measure(args, target, n, engine, archive=True)]
                if args.compare_archive else [measure(args, target, n, engine)])
    if args.server_env is not None:
        rows.extend([measure(args, target, n, engine, server=True, sidecar=False),
                     measure(args, target, n, engine, server=True, sidecar=True)]
                    if args.compare_sidecar else [measure(args, target, n, engine, server=True)])
    return rows


def measure(args: argparse.Namespace, target: Path | list[Path], n: int, engine: str,
            archive: bool | None = None, server: bool = False, sidecar: bool | None = None) -> dict:
    """One `faultline check` of a history (`target`, its path) or of several store folders in one
    call (a list): seconds from process start to exit. `archive`: False to start Spark's JVM
    without the class archive (None: as configured). `sidecar`: False to read the JSON even where
    a fresh side-car is (None: as configured). `server`: sent to the check server (else
    checked in the process, even if a server runs)."""
    folders = target if isinstance(target, list) else [target.parent]
    cmd = [sys.executable, "-m", "faultline.runner.cli", "check", *map(str, folders), "--spark-master",
           args.spark_master, "--engine", engine, "--no-progress", "--no-report",
           *([] if server else ["--no-server"])]
    print(f"checking {len(folders)} x {n} operations with {engine}{' (check server)' if server else ''}",
          file=sys.stderr, flush=True)
    env = {**(args.server_env if server else os.environ),
           **({"FAULTLINE_SPARK_ARCHIVE": "0"} if archive is False else {}),
           **({"FAULTLINE_SIDECAR": "0"} if sidecar is False else {})}
    # Hidden as well, for a check server, which reads its own environment.
    hidden = []
    for f in (folders if sidecar is False else []):
        shown = operations_table.path_for(f / "history.jsonl")
        if shown.exists():
            hidden.append((shown, shown.with_name(shown.name + ".hidden")))
            shown.replace(hidden[-1][1])
    used = sidecar is not False and all(operations_table.fresh(f / "history.jsonl") for f in folders)
    try:
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - started
    finally:
        for shown, aside in hidden:
            shutil.rmtree(shown, ignore_errors=True)  # one the check wrote meanwhile
            aside.replace(shown)
    verdicts = {json.loads((f / "results.json").read_text()).get("valid") if (f / "results.json").exists()
                else None for f in folders}
    row = {"ops": n, **({"histories": len(folders)} if isinstance(target, list) else {}), "engine": engine,
           **({"archive": archive} if archive is not None else {}), **({"server": True} if server else {}),
           "sidecar": used,
           "seconds": round(elapsed, 1), "ops_per_s": round(n * len(folders) / elapsed),
           "valid": verdicts.pop() if len(verdicts) == 1 else None, "exit": proc.returncode,
           "history_mb": round(sum((f / "history.jsonl").stat().st_size for f in folders) / 1e6)}
    print(json.dumps(row), flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    return row


if __name__ == "__main__":
    sys.exit(main())
