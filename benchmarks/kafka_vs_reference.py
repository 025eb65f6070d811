"""Produce and consume throughput of Apache Kafka and of the reference broker, side by side.

Each system runs as `faultline run` runs it (a network namespace per node, the db's own
settings: `db/kafka.py`, `db/reference.py`), for 1 node and for 3 nodes with RF 3; the same
measurement as broker_throughput.py then runs against each (confluent-kafka, acks=all with
idempotence, 100-byte values), after a warm-up run on the same cluster that is not counted: messages/s and p50/p99 produce latency of a saturated run, then
consumption by assign; and a paced run (--latency-rate) for latency without a full client queue.
The figures of both, and the ratio Kafka / reference, are printed as JSON. Needs root.

    .venv/bin/python benchmarks/kafka_vs_reference.py --messages 50000 --kafka-version 4.3.1
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_throughput import bench  # noqa: E402

from faultline.control.local_cluster import LocalCluster  # noqa: E402
from faultline.db import DBS  # noqa: E402
from faultline.models.spec import TestSpec  # noqa: E402
from faultline.runner import testmap  # noqa: E402


def measure(db_name: str, nodes: int, args) -> dict:
    extra = {"kafka_version": args.kafka_version} if db_name == "kafka" else {}
    spec = TestSpec(broker=db_name, nodes=nodes, partitions=args.partitions, **extra)
    names, support = testmap.node_names(spec)
    workdir = Path(tempfile.mkdtemp(prefix=f"faultline-bench-{db_name}-"))
    cluster = LocalCluster.create(f"bench-{secrets.token_hex(3)}", names + support, workdir)
    db = DBS[db_name](spec, cluster.remotes, workdir)
    try:
        db.setup()
        rf = spec.effective_replication_factor
        if args.warmup:
            # Not counted: Kafka's JIT compiles its hot paths, both systems fill their caches.
            print(f"{db_name}, {nodes} node(s): warm-up of {args.warmup} messages (not counted)", file=sys.stderr)
            bench(db.bootstrap, args.warmup, args.partitions, args.value_bytes, replication_factor=rf)
        print(f"{db_name}, {nodes} node(s): saturated run of {args.messages} messages", file=sys.stderr)
        result = {"saturated": bench(db.bootstrap, args.messages, args.partitions, args.value_bytes,
                                     replication_factor=rf)}
        if args.latency_rate:
            n = int(args.latency_rate * 10)
            print(f"{db_name}, {nodes} node(s): paced run of {n} messages at {args.latency_rate:g}/s",
                  file=sys.stderr)
            result["paced"] = bench(db.bootstrap, n, args.partitions, args.value_bytes, args.latency_rate,
                                    replication_factor=rf)
        return result
    finally:
        try:
            db.teardown(workdir / "store")
        finally:
            cluster.destroy()


def ratios(kafka: dict, reference: dict) -> dict:
    out = {}
    for run in ("saturated", "paced"):
        if run in kafka and run in reference:
            out[run] = {k: round(kafka[run][k] / reference[run][k], 2) if reference[run][k] else None
                        for k in ("produce_msgs_per_s", "produce_latency_p50_ms", "produce_latency_p99_ms",
                                  "consume_msgs_per_s")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000, help="messages of the saturated run (default 50000)")
    parser.add_argument("--warmup", type=int, default=20_000,
                        help="messages produced and consumed on each cluster before anything is counted "
                             "(default 20000; 0 skips it)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the topic (default 3)")
    parser.add_argument("--value-bytes", type=int, default=100, help="size of each value (default 100)")
    parser.add_argument("--latency-rate", type=float, default=2000,
                        help="messages/s of the paced run (default 2000; 0 skips it)")
    parser.add_argument("--kafka-version", default="4.3.1", help="Apache Kafka version (default 4.3.1)")
    parser.add_argument("--nodes", type=int, action="append", help="cluster sizes (default: 1 and 3)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("kafka_vs_reference: the nodes are network namespaces, which needs root", file=sys.stderr)
        return 2
    result: dict = {"kafka_version": args.kafka_version, "cpus": os.cpu_count(), "runs": {}}
    ok = True
    for nodes in args.nodes or [1, 3]:
        pair = {db: measure(db, nodes, args) for db in ("kafka", "reference")}
        pair["ratio_kafka_over_reference"] = ratios(pair["kafka"], pair["reference"])
        result["runs"][f"{nodes} node(s), RF {min(3, nodes)}"] = pair
        ok &= all(r["produce_errors"] == 0 and r["consumed"] == r["messages"]
                  for db in ("kafka", "reference") for r in pair[db].values())
        print(json.dumps(pair, indent=2), file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
