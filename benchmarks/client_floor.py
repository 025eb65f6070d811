"""The most operations per second bare Kafka clients get from a cluster, one operation at a time each.

What `faultline run` could record at best on this machine, with no harness at all: N client
processes (not threads: each its own interpreter and librdkafka handles), each sending one value
and waiting for its acknowledgement before the next (`produce` then `flush`, acks=all, idempotent,
as the queue workload sends), against a cluster started as `faultline run` starts it (a network
namespace per node, the db's own settings; replication factor = nodes). No history, no
generator, no nemesis. Prints one JSON line per client count: acknowledged sends per second, the
clients' CPU per send (from /proc/PID/stat) and the rest of the machine's (brokers, ZooKeeper or
controllers: /proc/stat's busy time less the clients'), over the measured window. If this floor
is below a rate, no harness can record that rate of sends here. Needs root.

    .venv/bin/python benchmarks/client_floor.py [--db reference|kafka] [--nodes 3] [--clients 16 32 64]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from faultline.control.local_cluster import LocalCluster
from faultline.db import DBS
from faultline.models.spec import TestSpec
from faultline.runner import testmap
from faultline.runner.interpreter import machine_jiffies

TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (the harness's own reading)."""
    return machine_jiffies()[0] / TICKS


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU of these processes and their threads, in seconds (0 for a gone one)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def client(bootstrap: str, topic: str, partitions: int, index: int, start, stop, count) -> None:
    """One client: send, wait for the acknowledgement, send again, until told to stop."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "message.timeout.ms": 10000})
    value = b"x" * 16
    for _ in range(20):  # connect and learn the leaders before the clock starts
        producer.produce(topic, value, partition=index % partitions)
        producer.flush(10)
    start.wait()
    sent = 0
    while not stop.is_set():
        producer.produce(topic, value, partition=(index + sent) % partitions)
        producer.flush(10)
        sent += 1
    with count.get_lock():
        count.value += sent


def measure(bootstrap: str, topic: str, partitions: int, clients: int, seconds: float) -> dict:
    start, stop, count = mp.Event(), mp.Event(), mp.Value("q", 0)
    procs = [mp.Process(target=client, args=(bootstrap, topic, partitions, i, start, stop, count))
             for i in range(clients)]
    for p in procs:
        p.start()
    time.sleep(3 + clients * 0.2)  # every client warmed up (20 sends each)
    client_pids = [p.pid for p in procs]
    busy0, client0, wall0 = machine_busy_seconds(), cpu_seconds(client_pids), time.monotonic()
    start.set()
    time.sleep(seconds)
    busy1, client1 = machine_busy_seconds(), cpu_seconds(client_pids)
    stop.set()
    wall = time.monotonic() - wall0
    for p in procs:
        p.join(30)
    sends = count.value
    return {"clients": clients, "sends": sends, "sends_per_s": round(sends / wall, 1),
            "client_cpu_ms_per_send": round((client1 - client0) * 1000 / max(sends, 1), 3),
            "rest_cpu_ms_per_send": round((busy1 - busy0 - (client1 - client0)) * 1000 / max(sends, 1), 3),
            "machine_cores_busy": round((busy1 - busy0) / wall, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=sorted(DBS), default="reference", help="system under test (default reference)")
    parser.add_argument("--kafka-version", default=None, help="Kafka version, with --db kafka (default: the db's)")
    parser.add_argument("--nodes", type=int, default=3, help="brokers, and the replication factor (default 3)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the topic (default 3)")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 32, 64],
                        help="client process counts to measure, each in turn (default 16 32 64)")
    parser.add_argument("--seconds", type=float, default=15, help="measured window per count (default 15)")
    args = parser.parse_args()
    extra = {"kafka_version": args.kafka_version} if args.db == "kafka" and args.kafka_version else {}
    spec = TestSpec(broker=args.db, nodes=args.nodes, partitions=args.partitions, **extra)
    names, support = testmap.node_names(spec)
    workdir = Path(tempfile.mkdtemp(prefix=f"faultline-floor-{args.db}-"))
    cluster = LocalCluster.create(f"floor-{secrets.token_hex(3)}", names + support, workdir)
    db = DBS[args.db](spec, cluster.remotes, workdir)
    try:
        print(f"starting {args.db}, {args.nodes} node(s)", file=sys.stderr, flush=True)
        db.setup()
        topic = "floor"
        admin = AdminClient({"bootstrap.servers": db.bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, spec.effective_replication_factor)])[topic].result(60)
        for clients in args.clients:
            print(f"{clients} clients: warm-up, then {args.seconds:g} s measured", file=sys.stderr, flush=True)
            row = measure(db.bootstrap, topic, args.partitions, clients, args.seconds)
            row.update(db=args.db, nodes=args.nodes)
            print(json.dumps(row), flush=True)
    finally:
        try:
            db.teardown(workdir / "store")
        finally:
            cluster.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
