"""Throughput of one reference broker through confluent-kafka (librdkafka).

Produces N messages of 100-byte values with acks=all and idempotence to a
fresh topic, measuring messages/s and the p50/p99 latency from produce() to
the delivery report; then consumes them all back by assign and measures
messages/s. Starts its own `faultline broker` in a temporary directory unless
--bootstrap names a running one.

    .venv/bin/python benchmarks/broker_throughput.py --messages 200000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def start_broker(data_dir: str, settings: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bootstrap = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "faultline.broker.main", "--node-id", "1", "--listen", bootstrap,
           "--data-dir", data_dir, "--log-level", "WARNING"]
    for item in settings:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, bootstrap
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the broker did not start within 20 s")


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(int(len(sorted_values) * q), len(sorted_values) - 1)]


def bench(bootstrap: str, n: int, partitions: int, value_size: int, rate: float | None = None,
          replication_factor: int = 1) -> dict:
    """Produce n messages (as fast as possible, or paced at `rate` per second), then consume them."""
    topic = f"bench-{time.time_ns()}"  # a topic of its own per call (a warm-up, then the measured run)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replication_factor)])[topic].result(10)
    # Wait for every partition's leader, so the first sends do not measure an election.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(parts) == partitions and all(p.leader >= 0 for p in parts.values()):
            break
        time.sleep(0.1)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    latencies: list[float] = []
    errors = 0
    payload = b"x" * value_size

    def delivered(err, msg, started=None):
        nonlocal errors
        if err:
            errors += 1

    # Warm up: the first send waits for metadata and a producer id, which is not what is measured.
    producer.produce(topic, payload, partition=0)
    producer.flush(30)
    start = time.perf_counter()
    last_report = start
    for i in range(n):
        if rate:
            # Paced: latency then measures the broker, not a queue the benchmark filled itself.
            ahead = start + i / rate - time.perf_counter()
            if ahead > 0:
                producer.poll(ahead)
        sent_at = time.perf_counter()
        producer.produce(topic, payload, partition=i % partitions,
                         on_delivery=lambda err, msg, t=sent_at: (latencies.append(time.perf_counter() - t),
                                                                  delivered(err, msg)))
        if i % 1000 == 0:
            producer.poll(0)
            now = time.perf_counter()
            if now - last_report > 2:
                print(f"  produce: {i}/{n} sent, {len(latencies)} acknowledged, {now - start:.1f}s",
                      file=sys.stderr)
                last_report = now
    producer.flush(120)
    produce_s = time.perf_counter() - start
    latencies.sort()

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         "check.crcs": True, "fetch.max.bytes": 52428800})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    start = time.perf_counter()
    while got < n + 1 and time.perf_counter() - start < 120:
        for m in consumer.consume(10000, 1.0):
            if m.error() is None:
                got += 1
    consume_s = time.perf_counter() - start
    consumer.close()
    return {
        "messages": n,
        "paced_rate": rate,
        "partitions": partitions,
        "replication_factor": replication_factor,
        "value_bytes": value_size,
        "produce_errors": errors,
        "produce_msgs_per_s": round(n / produce_s),
        "produce_latency_p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
        "produce_latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "consumed": got - 1,
        "consume_msgs_per_s": round(got / consume_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000, help="messages to produce (default 200000)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the topic (default 3)")
    parser.add_argument("--value-bytes", type=int, default=100, help="size of each value (default 100)")
    parser.add_argument("--latency-rate", type=float, default=15000,
                        help="messages/s of the paced run that measures latency (default 15000; 0 skips it)")
    parser.add_argument("--bootstrap", help="HOST:PORT of a running broker; default: start one")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="broker setting for the broker this starts")
    args = parser.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as data_dir:
        bootstrap = args.bootstrap
        if bootstrap is None:
            proc, bootstrap = start_broker(data_dir, args.set)
        try:
            print(f"saturated run: {args.messages} messages as fast as possible", file=sys.stderr)
            result = {"saturated": bench(bootstrap, args.messages, args.partitions, args.value_bytes)}
            if args.latency_rate:
                n = int(args.latency_rate * 10)
                print(f"paced run: {n} messages at {args.latency_rate:.0f}/s", file=sys.stderr)
                result["paced"] = bench(bootstrap, n, args.partitions, args.value_bytes, args.latency_rate)
        finally:
            if proc:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    return report(result)


def report(result: dict) -> int:
    """Print the figures; the exit status says whether every message was acknowledged and read back."""
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))
    runs = [r for r in (result.get("saturated"), result.get("paced")) if r]
    return 0 if all(r["produce_errors"] == 0 and r["consumed"] == r["messages"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
