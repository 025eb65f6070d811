"""How the queue client classifies a send from librdkafka's delivery reports: ok only when every
message was acknowledged, fail only when none can have been written, info otherwise.

A `fail` says the write certainly did not happen (history-format.md), and the checker holds any
read of a failed value against the broker (G1a), so every error the workload can see is listed
here with the outcome it must give."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from faultline.workloads.queue import send_completion

MOPS = [{"f": "send", "key": "t/0", "value": 1}, {"f": "send", "key": "t/1", "value": 2}]

NEVER_WRITTEN = [KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError._PURGE_QUEUE,
                 KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_REQUIRED_ACKS, KafkaError.INVALID_MSG,
                 KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD]
REFUSED_BEFORE_APPEND = [KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.UNKNOWN_TOPIC_OR_PART,
                         KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                         KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER]
INDETERMINATE = [KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT,
                 KafkaError._TRANSPORT, KafkaError._PURGE_INFLIGHT, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                 KafkaError._FATAL, KafkaError._ALL_BROKERS_DOWN, KafkaError.NETWORK_EXCEPTION,
                 KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH]
PRODUCERS = {"idempotent": (True, 2147483647), "retrying": (False, 2147483647), "one attempt": (False, 0)}


def outcome(code: int, producer: str) -> str:
    idempotent, retries = PRODUCERS[producer]
    reports = [(KafkaError(code), None), (KafkaError(code), None)]
    return send_completion(MOPS, reports, 0, idempotent, retries)["type"]


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize("code", NEVER_WRITTEN)
def test_an_error_no_attempt_gets_past_is_a_failure(code, producer):
    assert outcome(code, producer) == "fail"


@pytest.mark.parametrize("code", REFUSED_BEFORE_APPEND)
def test_a_refusal_that_librdkafka_retries_is_certain_only_with_idempotence_or_one_attempt(code):
    assert outcome(code, "idempotent") == "fail"
    assert outcome(code, "one attempt") == "fail"
    # An earlier attempt may have timed out after the broker wrote it.
    assert outcome(code, "retrying") == "info"


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize("code", INDETERMINATE)
def test_timeouts_transport_failures_and_unreplicated_appends_are_indeterminate(code, producer):
    assert outcome(code, producer) == "info"


def test_every_acknowledged_send_is_ok_with_its_offsets():
    done = send_completion(MOPS, [(None, 4), (None, 9)], 0, True, 5)
    assert done == {"type": "ok", "mops": [dict(MOPS[0], offset=4), dict(MOPS[1], offset=9)]}


def test_an_acknowledgement_without_an_offset_records_none():
    # acks=0: librdkafka reports success with offset -1001 (OFFSET_INVALID).
    done = send_completion(MOPS[:1], [(None, -1001)], 0, False, 0)
    assert done == {"type": "ok", "mops": [dict(MOPS[0], offset=None)]}


def test_a_send_partly_refused_is_indeterminate():
    done = send_completion(MOPS, [(None, 4), (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)], 0, True, 5)
    assert done["type"] == "info" and "Broker: Message size too large" in done["error"]


def test_a_missing_report_or_a_message_still_queued_is_indeterminate():
    assert send_completion(MOPS, [(None, 4), None], 0, True, 5) == {
        "type": "info", "mops": MOPS, "error": "no delivery report before the timeout"}
    assert send_completion(MOPS, [(None, 4), (None, 5)], 1, True, 5)["type"] == "info"
