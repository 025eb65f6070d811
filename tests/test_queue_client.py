"""The queue workload's client against a real broker: what it records is what the broker did,
a partly acknowledged send and the final reads' end offsets included.

A history is only as good as its client: a consumer that rewinds by itself would
show a correct broker as out of order (int-nonmonotonic-poll).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from faultline.models.spec import DEFAULT_CONSUMER
from faultline.workloads.queue import QueueClient

KEY = "q/0"


def fill(bootstrap: str, n: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its futures
    admin.create_topics([NewTopic("q", 1, 1)])["q"].result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(n):
        producer.produce("q", str(i).encode(), partition=0)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def poll_offsets(client: QueueClient, seconds: float) -> list[int]:
    offsets = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done = client.invoke({"f": "poll", "mops": [{"f": "poll"}]})
        offsets += [r["offset"] for r in done["mops"][0]["records"]]
    return offsets


def first_records(client: QueueClient) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        records = client.invoke({"f": "poll", "mops": [{"f": "poll"}]})["mops"][0]["records"]
        if records:
            return [r["offset"] for r in records]
    raise AssertionError("no records within 10 s")


def test_a_consumer_reassigned_while_an_earlier_start_is_resolved_never_rewinds(broker):
    # Two starts from the beginning while the broker is slow to answer leave librdkafka (2.16)
    # an outdated answer to the first ListOffsets; it then re-queries that logical start half a
    # second later, even after the client has moved to a concrete offset, and rewinds the
    # consumer to 0. Seen in leader-kill runs as int-nonmonotonic-poll on a correct broker.
    fill(broker.bootstrap, 5000)
    client = QueueClient(broker.bootstrap, {}, dict(DEFAULT_CONSUMER), "rewind", max_poll_records=10)
    client.open()
    beginning = {"f": "assign", "keys": [KEY], "seek_to_beginning": True}
    try:
        assert client.invoke(beginning)["type"] == "ok"
        time.sleep(0.2)  # the consumer learns the partition's leader, and has fetched nothing yet
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                assert client.invoke(beginning)["type"] == "ok"
                time.sleep(0.2)  # each start has sent what it needs before the next replaces it
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        first = first_records(client)
        assert first[0] == 0, first
        assert client.invoke({"f": "assign", "keys": [KEY], "seek_to_beginning": False})["type"] == "ok"
        later = poll_offsets(client, 2.0)
        assert later, "no records after the assign"
        read = first + later
        jumps = [(a, b) for a, b in zip(read, read[1:]) if b != a + 1]
        assert not jumps, f"the consumer did not read on in order: offset {jumps[0][0]} was followed by {jumps[0][1]}"
    finally:
        client.close()


def test_a_send_partly_refused_keeps_the_acknowledged_offset_and_says_why_the_rest_was_not(broker):
    fill(broker.bootstrap, 3)
    client = QueueClient(broker.bootstrap, {"acks": "all", "message.timeout.ms": "2000"}, dict(DEFAULT_CONSUMER), "p")
    client.open()
    try:
        done = client.invoke({"f": "send", "mops": [{"f": "send", "key": KEY, "value": 10},
                                                    {"f": "send", "key": "q/7", "value": 11}]})
    finally:
        client.close()
    # q/7 does not exist: librdkafka refuses it, at produce() or in its delivery report; q/0 was
    # acknowledged, so the operation as a whole happened in part.
    assert done["type"] == "info", done
    acknowledged, refused = done["mops"]
    assert acknowledged == {"f": "send", "key": KEY, "value": 10, "offset": 3}
    assert refused["offset"] is None and "Unknown partition" in refused["error"], refused


def test_final_reads_name_the_keys_whose_end_the_broker_cannot_say_and_start_fresh_clients(broker):
    fill(broker.bootstrap, 4)
    client = QueueClient(broker.bootstrap, {}, dict(DEFAULT_CONSUMER), "f")
    client.open()
    try:
        assert client.invoke({"f": "crash", "final": True})["type"] == "info", "the process ends: a new client"
        done = client.invoke({"f": "assign", "keys": [KEY, "q/5"], "seek_to_beginning": True, "final": True})
        assert done["type"] == "ok" and done["end_offsets"] == {KEY: 4}
        assert set(done["unavailable"]) == {"q/5"}
        record = [{"key": KEY, "end": 4, "read_to": 4, "outcome": "reached"}]
        assert client.invoke({"f": "final-reads", "final": True, "_final_reads": record}) == {
            "type": "ok", "final_reads": record}
    finally:
        client.close()


def test_a_final_reader_that_found_no_broker_learns_the_ends_once_one_listens(broker_factory):
    # Final reads start right after the heal, often while restarted brokers are not yet listening.
    broker = broker_factory(start=False)
    client = QueueClient(broker.bootstrap, {}, dict(DEFAULT_CONSUMER), "late")
    client.open()
    try:
        assert client.invoke({"f": "crash", "final": True})["type"] == "info"
        done = client.invoke({"f": "assign", "keys": [KEY], "seek_to_beginning": True, "final": True})
        assert (done["type"], done["end_offsets"]) == ("ok", {}), done
        assert done["unavailable"][KEY].startswith("no metadata for q: "), done["unavailable"]
        broker.start()
        fill(broker.bootstrap, 3)
        again = client.invoke({"f": "assign", "keys": [KEY], "seek_to_beginning": True, "final": True})
        assert (again["type"], again["end_offsets"], again.get("unavailable")) == ("ok", {KEY: 3}, None), again
    finally:
        client.close()


def test_a_final_assign_of_many_keys_learns_every_end_while_its_consumer_fetches(broker):
    # The consumer already fetches the keys of the first final assign when the second asks where
    # they end. Asked on the consumer's own connection, each question waited behind a long-poll
    # fetch (the broker answers one connection's requests in order): 500 ms a key, and the
    # 10 s budget named the last keys unavailable, which made every run of 32 keys unknown.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # held: a collected client cancels its futures
    admin.create_topics([NewTopic("many", 40, 1)])["many"].result(10)
    keys = [f"many/{i}" for i in range(40)]
    client = QueueClient(broker.bootstrap, {}, dict(DEFAULT_CONSUMER), "many")
    client.open()
    try:
        first = client.invoke({"f": "assign", "keys": keys, "seek_to_beginning": True, "final": True})
        assert first["type"] == "ok" and "unavailable" not in first, first.get("unavailable")
        client.invoke({"f": "poll", "mops": [{"f": "poll"}], "final": True})
        again = client.invoke({"f": "assign", "keys": keys, "seek_to_beginning": False, "final": True})
        assert (again["type"], again.get("unavailable")) == ("ok", None)
        assert again["end_offsets"] == {k: 0 for k in keys}
    finally:
        client.close()


def test_a_resend_client_sends_through_a_producer_process_of_its_own_that_a_kill_ends(broker, tmp_path):
    from faultline.nemesis.clients import KillClientNemesis
    from faultline.workloads.resend import ResendClient

    fill(broker.bootstrap, 1)
    client = ResendClient(broker.bootstrap, {"acks": "all", "enable.idempotence": "true", "message.timeout.ms": "3000"},
                          dict(DEFAULT_CONSUMER), "r", process=4, clients_dir=tmp_path)
    client.open()
    pid_file = tmp_path / "producer-4.pid"
    try:
        mops = [{"f": "send", "key": KEY, "value": v} for v in (10, 11)]
        assert client.invoke({"f": "send", "mops": mops}) == {
            "type": "ok", "mops": [{**mops[0], "offset": 1}, {**mops[1], "offset": 2}]}
        pid = int(pid_file.read_text())
        assert pid == client.session.proc.pid != os.getpid()
        assert KillClientNemesis("producer", tmp_path).invoke({"f": "kill-producer", "seed": 0}) == {
            "processes": [4], "pids": {"4": pid}, "signal": "SIGKILL"}
        assert client.session.proc.wait(10) == -signal.SIGKILL
        done = client.invoke({"f": "send", "mops": [{"f": "send", "key": KEY, "value": 12}]})
        assert done["type"] == "info" and done["mops"] == [{"f": "send", "key": KEY, "value": 12, "offset": None}]
        assert "dead (killed) before this send" in done["error"]
        # The consumer stays in the harness: it reads what the killed session wrote.
        client.invoke({"f": "assign", "keys": [KEY], "seek_to_beginning": True})
        assert poll_offsets(client, 3) == [0, 1, 2]
    finally:
        client.close()
    assert not pid_file.exists()


@pytest.mark.parametrize("kind", ["queue", "resend"])
def test_a_producer_that_fails_for_good_ends_its_process_and_its_successor_sends(broker, tmp_path, kind):
    # A real fatal error: the broker loses the tail of its log, which held an acknowledged batch of
    # an idempotent producer; the producer's next batch is out of sequence for the broker, and
    # librdkafka fails the producer for good (sequence desynchronisation). confluent-kafka raises
    # it from inside flush(), as a SystemError when a delivery report runs while it is pending.
    from faultline.workloads.resend import ResendClient

    fill(broker.bootstrap, 0)
    settings = {"acks": "all", "enable.idempotence": "true", "message.timeout.ms": "8000"}
    if kind == "queue":
        client = QueueClient(broker.bootstrap, settings, dict(DEFAULT_CONSUMER), "f")
    else:
        client = ResendClient(broker.bootstrap, settings, dict(DEFAULT_CONSUMER), "f", process=2, clients_dir=tmp_path)
    client.open()
    try:
        for v in range(3):
            mop = {"f": "send", "key": KEY, "value": v}
            assert client.invoke({"f": "send", "mops": [mop]}) == {"type": "ok", "mops": [{**mop, "offset": v}]}
        broker.kill()
        log = broker.data_dir / "q-0" / f"{0:020d}.log"
        os.truncate(log, log.stat().st_size - 5)  # the last batch (value 2, offset 2) is torn
        broker.start()
        mops = [{"f": "send", "key": KEY, "value": v} for v in (3, 4, 5)]
        done = client.invoke({"f": "send", "mops": mops})
    finally:
        client.close()
    # The worker's process ends (info), and no message is taken as written or as refused wrongly:
    # the broker refused the batch, and the one whose report the fatal error swallowed is unknown.
    assert done["type"] == "info", done
    assert "the producer failed for good" in done["error"], done
    assert [m["offset"] for m in done["mops"]] == [None, None, None]
    refused = "Broker: Broker received an out of order sequence number"
    errors = sorted(m["error"] for m in done["mops"])
    if "sequence desynchronization" in done["error"]:
        # The pending error cost the delivery report that ran next.
        assert errors == [refused] * 2 + [
            "no delivery report: the producer failed for good before it gave one; it may be written"], done
    else:
        # confluent-kafka lost the pending error (its log callback ran while it was pending), and
        # with it none of the reports: the completion points to librdkafka's FATAL line.
        assert "librdkafka's FATAL line" in done["error"] and errors == [refused] * 3, done
    # Its successor, a new producer session, sends.
    client.open()
    try:
        mop = {"f": "send", "key": KEY, "value": 6}
        assert client.invoke({"f": "send", "mops": [mop]}) == {"type": "ok", "mops": [{**mop, "offset": 2}]}
    finally:
        client.close()
