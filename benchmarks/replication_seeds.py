"""The reference broker's replication claims over many seeds: the safe configuration loses nothing,
the unsafe ones show their loss, on the same seeds.

Per seed, four `faultline run`s on a three-broker reference cluster (RF 3):
- safe: acks=all, idempotence, min.insync.replicas=2, no unclean election, under partitions,
  kills and pauses: must be valid with no lost-write;
- acks=1: leaders killed while followers trail by up to 2 s of writes (as the e2e test);
- unclean: a stale replica elected after the ISR is killed (`stale-election`, unclean on);
- high-watermark truncation: `faultline.truncation=high-watermark` under leader kills and pauses.
Printed per run: verdict, exit status, lost-write and unseen counts, offsets that replicas disagree
on (inconsistent-offsets, reused-offset: divergence), duration; then a JSON summary.
Needs root (network namespaces). A run of 10 seeds takes about 30 minutes on 2 cores.

    .venv/bin/python benchmarks/replication_seeds.py --seeds 1-10 --time-limit 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULTLINE = [sys.executable, "-m", "faultline.runner.cli"]

COMMON = ["--nodes", "3", "--replication-factor", "3", "--no-progress"]
EXPERIMENTS = {
    "safe": ["--rate", "1000", "--concurrency", "8", "--nemesis", "partition,kill,pause",
             "--nemesis-interval", "4", "--broker-set", "min.insync.replicas=2"],
    "acks=1": ["--rate", "3000", "--concurrency", "16", "--nemesis", "kill-leader", "--nemesis-interval", "2.5",
               "--producer", "acks=1", "--producer", "enable.idempotence=false",
               "--broker-set", "replica.fetch.min.bytes=100000000", "--broker-set", "replica.fetch.wait.max.ms=2000"],
    "unclean": ["--rate", "200", "--nemesis", "stale-election", "--nemesis-interval", "8",
                "--broker-set", "unclean.leader.election.enable=true", "--broker-set", "replica.lag.time.max.ms=3000"],
    # Leader kills 1.5 s apart: a follower that truncated to its stale high watermark on a leader
    # change is elected at the next kill before it fetched again (KIP-101's first scenario).
    "high-watermark truncation": ["--rate", "3000", "--concurrency", "16", "--nemesis", "kill-leader,pause",
                                  "--nemesis-interval", "1.5", "--broker-set", "faultline.truncation=high-watermark",
                                  "--broker-set", "replica.fetch.min.bytes=100000000",
                                  "--broker-set", "replica.fetch.wait.max.ms=2000"],
}
EXPECTED_LOSS = {"safe": False, "acks=1": True, "unclean": True, "high-watermark truncation": True}


def seeds_of(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def run(name: str, seed: int, time_limit: float, store: Path) -> dict:
    started = time.monotonic()
    # The stale election takes two nemesis rounds of 8 s and its setup: 25 s at least.
    limit = max(time_limit, 25) if name == "unclean" else time_limit
    cmd = [*FAULTLINE, "run", *COMMON, "--seed", str(seed), "--time-limit", str(limit),
           "--store", str(store), *EXPERIMENTS[name]]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    results = json.loads(((store / "latest").resolve() / "results.json").read_text())
    counts = results.get("counts", {})
    return {"experiment": name, "seed": seed, "exit": proc.returncode, "valid": results["valid"],
            "lost-write": counts.get("lost-write", 0), "unseen": counts.get("unseen", 0),
            "diverged": counts.get("inconsistent-offsets", 0) + counts.get("reused-offset", 0),
            "anomaly_types": results.get("anomaly_types", []), "seconds": round(time.monotonic() - started),
            "run_dir": str((store / "latest").resolve())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1-10", help="seeds, as 1-10 or 1,4,7 (default 1-10)")
    parser.add_argument("--time-limit", type=float, default=20, help="seconds of workload per run (default 20)")
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS),
                        help=f"which, comma-separated (default all: {', '.join(EXPERIMENTS)})")
    parser.add_argument("--store", type=Path, default=None, help="where runs are kept (default: a temporary folder)")
    args = parser.parse_args()
    names = [n.strip() for n in args.experiments.split(",")]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}; choose from {list(EXPERIMENTS)}")
    root = args.store or Path(tempfile.mkdtemp(prefix="faultline-seeds-"))
    rows = []
    for seed in seeds_of(args.seeds):
        for name in names:
            row = run(name, seed, args.time_limit, root / name.replace(" ", "-").replace("=", "") / str(seed))
            rows.append(row)
            print(f"seed {seed:3d}  {name:26s} valid={str(row['valid']):7s} exit={row['exit']} "
                  f"lost-write={row['lost-write']:5d} unseen={row['unseen']:5d} "
                  f"inconsistent/reused offsets={row['diverged']:5d} {row['seconds']:4d} s", flush=True)
    summary = {}
    for name in names:
        mine = [r for r in rows if r["experiment"] == name]
        lossy = [r["seed"] for r in mine if r["lost-write"] or r["unseen"]]
        diverged = [r["seed"] for r in mine if r["diverged"]]
        summary[name] = {"runs": len(mine), "seeds with loss": lossy, "seeds with divergence": diverged,
                         "valid": sum(r["valid"] is True for r in mine),
                         "unknown": sum(r["valid"] == "unknown" for r in mine),
                         "loss expected": EXPECTED_LOSS[name]}
    print(json.dumps({"time_limit": args.time_limit, "store": str(root), "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
