"""Throughput of a replicated reference-broker cluster through confluent-kafka.

Starts a ZooKeeper and N `faultline broker` processes on localhost, creates a
topic with replication factor N (3 by default), and runs the same measurement
as broker_throughput.py: N messages of 100-byte values with acks=all and
idempotence, messages/s and p50/p99 produce latency, then consumption by
assign. A paced run at --latency-rate measures latency without a full client
queue. The target for a 3-node cluster is 5,000 msg/s.

    .venv/bin/python benchmarks/cluster_throughput.py --messages 100000
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_throughput import bench, report  # noqa: E402

from faultline.db.zookeeper import LocalZooKeeper  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(root: Path, zk_connect: str, nodes: int, settings: list[str]) -> tuple[list, str]:
    procs, addresses = [], []
    for i in range(1, nodes + 1):
        address = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "faultline.broker.main", "--node-id", str(i), "--listen", address,
               "--data-dir", str(root / f"b{i}"), "--log-level", "WARNING",
               "--set", f"zookeeper.connect={zk_connect}"]
        for item in settings:
            cmd += ["--set", item]
        procs.append(subprocess.Popen(cmd))
        addresses.append(address)
    for address in addresses:
        host, port = address.split(":")
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the broker on {address} did not start within 30 s")
                time.sleep(0.05)
    bootstrap = ",".join(addresses)
    # Ready once every broker has registered and one of them is the controller.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    while True:
        md = admin.list_topics(timeout=10)
        if len(md.brokers) == nodes and md.controller_id >= 0:
            return procs, bootstrap
        if time.monotonic() > deadline:
            raise SystemExit(f"the cluster did not form within 60 s: brokers {sorted(md.brokers)}, "
                             f"controller {md.controller_id}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="messages to produce (default 100000)")
    parser.add_argument("--nodes", type=int, default=3, help="brokers, and the replication factor (default 3)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the topic (default 3)")
    parser.add_argument("--value-bytes", type=int, default=100, help="size of each value (default 100)")
    parser.add_argument("--latency-rate", type=float, default=5000,
                        help="messages/s of the paced run that measures latency (default 5000; 0 skips it)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="broker setting for every broker (repeatable), e.g. min.insync.replicas=2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        zk = LocalZooKeeper(root / "zookeeper").start()
        procs = []
        try:
            procs, bootstrap = start_cluster(root, zk.connect, args.nodes, args.set)
            print(f"saturated run: {args.messages} messages, {args.nodes} brokers, RF {args.nodes}", file=sys.stderr)
            result = {"saturated": bench(bootstrap, args.messages, args.partitions, args.value_bytes,
                                         replication_factor=args.nodes)}
            if args.latency_rate:
                n = int(args.latency_rate * 10)
                print(f"paced run: {n} messages at {args.latency_rate:.0f}/s", file=sys.stderr)
                result["paced"] = bench(bootstrap, n, args.partitions, args.value_bytes, args.latency_rate,
                                        replication_factor=args.nodes)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
            zk.stop()
    result["nodes"] = args.nodes
    return report(result)


if __name__ == "__main__":
    sys.exit(main())
