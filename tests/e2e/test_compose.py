"""docker/docker-compose.yml starts a 3-broker reference cluster with ZooKeeper that real Kafka
clients use: every broker registers, a topic of replication factor 3 takes acks=all writes, and
they read back; `down` leaves no container or network."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import time

import pytest

from faultline.control.docker_cluster import _docker_subnets, connect
from faultline.control.iproute import networks_in_use
from faultline.control.names import choose_subnet
from faultline.control.wait import wait_until
from tests.e2e.test_run import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the Docker backend's tests start a dockerd as root")


def test_the_compose_file_starts_a_replicated_cluster_that_kafka_clients_use(node_image, tmp_path):
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed: run scripts/setup --docker")
    client = connect()
    subnet = choose_subnet("compose", networks_in_use() + _docker_subnets(client))
    prefix = str(subnet.network_address).rsplit(".", 1)[0]
    env = dict(os.environ, FAULTLINE_SUBNET=prefix)
    compose = ["docker-compose", "-p", "fltestcompose", "-f", str(REPO / "docker" / "docker-compose.yml")]
    up = subprocess.run([*compose, "up", "-d"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        addresses = [f"{prefix}.{i}:9092" for i in (11, 12, 13)]
        try:
            use_the_cluster(addresses)
        except Exception as exc:
            # The containers go with `down`: keep what their brokers said in the failure.
            logs = subprocess.run([*compose, "logs", "--no-color", "--tail", "40"], env=env,
                                  capture_output=True, text=True, timeout=60)
            raise AssertionError(f"{exc!r}; the containers' logs end:\n{logs.stdout}{logs.stderr}") from exc
    finally:
        down = subprocess.run([*compose, "down", "-v"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not client.api.containers(all=True, filters={"label": "com.docker.compose.project=fltestcompose"})
    assert not [n for n in client.api.networks() if n["Name"].startswith("fltestcompose")]
    assert ipaddress.ip_network(f"{prefix}.0/24") == subnet


def use_the_cluster(addresses: list[str]) -> None:
    """Wait until every broker serves, create a topic of replication factor 3, write 100 values
    with acks=all, read them back, and wait for every replica to be in sync."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = ",".join(addresses)
    # Three containers' brokers starting at once on a busy 2-core machine: give them time. A
    # registration is not enough: a broker that exited at start leaves its ephemeral node for
    # zookeeper.session.timeout.ms while its next start waits for it to go. Each broker must
    # answer at its own address, and know the controller.
    seen: dict = {}

    def every_broker_serves() -> bool:
        for address in addresses:
            try:
                md = AdminClient({"bootstrap.servers": address}).list_topics(timeout=5)
            except Exception as exc:  # noqa: BLE001 - not serving yet
                seen[address] = repr(exc)
                continue
            seen[address] = {"brokers": sorted(md.brokers), "controller": md.controller_id}
        return all(isinstance(v, dict) and v["brokers"] == [1, 2, 3] and v["controller"] in (1, 2, 3)
                   for v in seen.values()) and len(seen) == len(addresses)
    wait_until(every_broker_serves, 120, lambda: f"not every broker served: {seen}", interval=0.5)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("t", 3, 3)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(100):
        producer.produce("t", key=str(i % 3), value=str(i))
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "by-hand", "enable.auto.commit": False})
    consumer.assign([TopicPartition("t", p, OFFSET_BEGINNING) for p in range(3)])
    got: set[bytes] = set()
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and not message.error():
            got.add(message.value())
    consumer.close()
    assert got == {str(i).encode() for i in range(100)}
    # A follower may be out of the ISR for a moment on a busy machine (replica.lag.time.max.ms);
    # a healthy cluster has every replica back in sync soon after.
    isr: dict = {}

    def every_replica_in_sync() -> bool:
        partitions = admin.list_topics("t", timeout=5).topics["t"].partitions.values()
        isr.update({p.id: sorted(p.isrs) for p in partitions})
        return isr == {0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 2, 3]}
    wait_until(every_replica_in_sync, 60, lambda: f"the ISRs stayed {isr}", interval=0.5)
