"""Kafka's own Java clients against a 3-node reference cluster: VerifiableProducer (from
kafka-tools, the producer Kafka's system tests use) with acks=all, then Kafka's console consumer
with --partition and --offset earliest (assign, no group) reading every record back.

The Java client negotiates request versions with ApiVersions and refuses a broker that answers
a version it did not offer; both tools running to completion against the reference broker show
that every version they pick is served as Kafka serves it. The jars are Kafka's own, from Maven
Central (db/kafka_jars.resolve_tools; scripts/setup resolves them ahead of time).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from faultline.db.kafka_jars import DEFAULT_VERSION, KafkaJarsError, resolve_tools

MESSAGES = 5000


@pytest.fixture(scope="module")
def tools_classpath() -> str:
    if shutil.which("java") is None:
        pytest.fail("java is not installed: run scripts/setup")
    try:
        return f"{resolve_tools(DEFAULT_VERSION)}/*"
    except KafkaJarsError as exc:
        pytest.fail(f"Kafka's tools could not be resolved: {exc}")


def java(classpath: str, main: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["java", "-Xmx256m", "-cp", classpath, main, *args], capture_output=True, text=True,
                          timeout=timeout)


def test_kafkas_verifiable_producer_and_console_consumer_round_trip_through_a_replicated_cluster(
        cluster_factory, tools_classpath):
    cluster = cluster_factory()
    cluster.create_topic("java", 1, 3)
    produced = java(tools_classpath, "org.apache.kafka.tools.VerifiableProducer",
                    "--bootstrap-server", cluster.bootstrap, "--topic", "java", "--max-messages", str(MESSAGES),
                    "--acks", "-1", "--producer.config", "/dev/null", timeout=180)
    events = [json.loads(line) for line in produced.stdout.splitlines() if line.startswith("{")]
    acked = [e for e in events if e["name"] == "producer_send_success"]
    errors = [e for e in events if e["name"] == "producer_send_error"]
    assert produced.returncode == 0, produced.stderr[-3000:]
    assert errors == [], errors[:5]
    # Every record acknowledged, each at its own offset of partition 0, in the order sent.
    assert [(e["partition"], e["offset"]) for e in acked] == [(0, i) for i in range(MESSAGES)]
    assert [e["value"] for e in acked] == [str(i) for i in range(MESSAGES)]
    [done] = [e for e in events if e["name"] == "shutdown_complete"]
    tool_stats = [e for e in events if e["name"] == "tool_data"]
    assert tool_stats and tool_stats[-1]["acked"] == MESSAGES and tool_stats[-1]["sent"] == MESSAGES

    consumed = java(tools_classpath, "org.apache.kafka.tools.consumer.ConsoleConsumer",
                    "--bootstrap-server", cluster.bootstrap, "--topic", "java", "--partition", "0",
                    "--offset", "earliest", "--max-messages", str(MESSAGES), "--timeout-ms", "60000",
                    "--property", "print.offset=true", timeout=180)
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    rows = [line for line in consumed.stdout.splitlines() if line.startswith("Offset:")]
    # "Offset:7\t7": the offset, then the value, in log order.
    assert [tuple(r.removeprefix("Offset:").split("\t")) for r in rows] == [(str(i), str(i))
                                                                            for i in range(MESSAGES)]
    assert f"Processed a total of {MESSAGES} messages" in consumed.stderr
