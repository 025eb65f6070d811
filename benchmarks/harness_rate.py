"""How many client operations per second the harness records: `faultline run` at a high asked rate.

For each system (the reference broker; Apache Kafka with --kafka), 1 and 3 nodes, without faults
and under kill-leader, one run of --time-limit seconds asking for --rate ops/s with --concurrency
workers; prints one JSON line per run (the rate achieved in the main phase, the harness's CPU
per operation and the machine's busy share over it, from the run's harness.json, and the verdict)
and a table at the end. Needs root (network namespaces).

    .venv/bin/python benchmarks/harness_rate.py [--kafka] [--rate 5000] [--concurrency 16] [--time-limit 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(args: argparse.Namespace, store: Path, system: str, nodes: int, nemesis: str | None) -> dict:
    cmd = [sys.executable, "-m", "faultline.runner.cli", "run", "--db", system, "--nodes", str(nodes),
           "--rate", str(args.rate), "--concurrency", str(args.concurrency), "--time-limit", str(args.time_limit),
           "--seed", "5", "--engine", "python", "--no-progress", "--no-report", "--store", str(store)]
    if nemesis:
        cmd += ["--nemesis", nemesis, "--nemesis-interval", "6"]
    print(f"running: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    run_dir = (store / "latest").resolve()
    harness = json.loads((run_dir / "harness.json").read_text()) if (run_dir / "harness.json").exists() else {}
    results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else {}
    row = {"system": system, "nodes": nodes, "nemesis": nemesis or "none", "asked": args.rate,
           "achieved": harness.get("achieved"), "invocations": harness.get("invocations"),
           # Where the CPU goes: the harness's CPU per operation, and how busy the whole machine was
           # (brokers, ZooKeeper and harness together); a machine near 1.0 has no cores to give.
           "harness_cpu_ms_per_op": harness.get("cpu_ms_per_op"),
           "machine_busy": harness.get("machine_busy"),
           "valid": results.get("valid"), "exit": proc.returncode, "wall_s": round(time.monotonic() - started)}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kafka", action="store_true", help="also run Apache Kafka (its jars from setup)")
    parser.add_argument("--rate", type=float, default=5000, help="ops/s asked (default 5000)")
    parser.add_argument("--concurrency", type=int, default=16, help="client workers (default 16)")
    parser.add_argument("--time-limit", type=float, default=20, help="seconds of the main phase (default 20)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="faultline-harness-rate-") as tmp:
        for system in ("reference", "kafka") if args.kafka else ("reference",):
            for nodes in (1, 3):
                for nemesis in (None, "kill-leader"):
                    rows.append(run(args, Path(tmp) / f"{system}-{nodes}-{nemesis}", system, nodes, nemesis))
    print("\n| system | nodes | faults | asked ops/s | achieved ops/s | harness CPU ms/op | machine busy | verdict |"
          "\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['nodes']} | {r['nemesis']} | {r['asked']:g} | {r['achieved']} | "
              f"{r['harness_cpu_ms_per_op']} | {r['machine_busy']} | {r['valid']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
