"""How the queue client records a send from what librdkafka told it of each message: every
micro-operation keeps its own outcome (an acknowledged one its offset, the others `offset: null`
and why), and the operation is ok only when every message was acknowledged, fail only when no
attempt of any of them can have been written, info otherwise.

A `fail` says the write certainly did not happen (history-format.md), and the checker holds any
read of a failed value against the broker (G1a), so every row of the one table that maps what the
workload can see to an outcome (workloads/queue.py, SEND_OUTCOMES) is under test here, for a send
that had a single attempt (retries=0) and for one librdkafka may have retried. What the rows mean
on real brokers is shown by tests/test_send_outcomes.py."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from confluent_kafka import KafkaException

from faultline.workloads.queue import (NO_REPORT, NOT_QUEUED, NOT_SENT, SEND_OUTCOMES, UNLISTED, Report,
                                       commit_outcome, kafka_error, send_completion)

MOPS = [{"f": "send", "key": "t/0", "value": 1}, {"f": "send", "key": "t/1", "value": 2}]
E = KafkaError

# Every row: (one attempt, retried). Written out here rather than read from the table, so that a
# change of the table is a change of this test too.
EXPECTED = {
    E.NO_ERROR: ("ok", "ok"),
    E.DUPLICATE_SEQUENCE_NUMBER: ("ok", "ok"),
    NO_REPORT: ("info", "info"),
    NOT_QUEUED: ("fail", "fail"),
    NOT_SENT: ("fail", "fail"),
    E.INVALID_REQUIRED_ACKS: ("fail", "fail"),
    # Refused, before the append: certain only when no earlier attempt can have timed out in flight.
    E._UNKNOWN_PARTITION: ("fail", "info"),
    E._UNKNOWN_TOPIC: ("fail", "info"),
    E._PURGE_QUEUE: ("fail", "info"),
    E._TIMED_OUT_QUEUE: ("fail", "info"),
    E.NOT_ENOUGH_REPLICAS: ("fail", "info"),
    E.NOT_LEADER_FOR_PARTITION: ("fail", "info"),
    E.LEADER_NOT_AVAILABLE: ("fail", "info"),
    E.UNKNOWN_TOPIC_OR_PART: ("fail", "info"),
    E.FENCED_LEADER_EPOCH: ("fail", "info"),
    E.UNKNOWN_LEADER_EPOCH: ("fail", "info"),
    E.INVALID_MSG: ("fail", "info"),
    E.MSG_SIZE_TOO_LARGE: ("fail", "info"),
    E.RECORD_LIST_TOO_LARGE: ("fail", "info"),
    E.INVALID_RECORD: ("fail", "info"),
    E.INVALID_TIMESTAMP: ("fail", "info"),
    E.TOPIC_AUTHORIZATION_FAILED: ("fail", "info"),
    E.CLUSTER_AUTHORIZATION_FAILED: ("fail", "info"),
    E.OUT_OF_ORDER_SEQUENCE_NUMBER: ("fail", "info"),
    E.UNKNOWN_PRODUCER_ID: ("fail", "info"),
    E.INVALID_PRODUCER_EPOCH: ("fail", "info"),
    E.PRODUCER_FENCED: ("fail", "info"),
    E.INVALID_TXN_STATE: ("fail", "info"),
    E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ("fail", "info"),
    E.UNSUPPORTED_FOR_MESSAGE_FORMAT: ("fail", "info"),
    E.UNSUPPORTED_VERSION: ("fail", "info"),
    E.POLICY_VIOLATION: ("fail", "info"),
    E.THROTTLING_QUOTA_EXCEEDED: ("fail", "info"),
    # May have been written, whatever came before.
    E._MSG_TIMED_OUT: ("info", "info"),
    E._TIMED_OUT: ("info", "info"),
    E.REQUEST_TIMED_OUT: ("info", "info"),
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ("info", "info"),
    E._TRANSPORT: ("info", "info"),
    E.NETWORK_EXCEPTION: ("info", "info"),
    E._PURGE_INFLIGHT: ("info", "info"),
    E._DESTROY: ("info", "info"),
    E._ALL_BROKERS_DOWN: ("info", "info"),
    E._FAIL: ("info", "info"),
    E.KAFKA_STORAGE_ERROR: ("info", "info"),
    E._FATAL: ("info", "info"),
    E._FENCED: ("info", "info"),
    E._INCONSISTENT: ("info", "info"),
    E._GAPLESS_GUARANTEE: ("info", "info"),
    E.UNKNOWN: ("info", "info"),
}


def report(row) -> Report | None:
    if row == NO_REPORT:
        return None
    if row == E.NO_ERROR:
        return Report.delivered(None, 7)
    if isinstance(row, str):
        return Report(row, detail=f"{row} detail")
    return Report.delivered(KafkaError(row), None)


def test_the_table_has_exactly_the_rows_under_test():
    assert set(SEND_OUTCOMES) == set(EXPECTED)
    assert all(row.reason for row in SEND_OUTCOMES.values())


@pytest.mark.parametrize("row", list(EXPECTED), ids=lambda r: r if isinstance(r, str) else KafkaError(r).name())
@pytest.mark.parametrize("retries", [0, 2147483647], ids=["one attempt", "retried"])
def test_each_row_gives_its_outcome_to_the_operation_and_to_each_micro_operation(row, retries):
    expected = EXPECTED[row][0 if retries == 0 else 1]
    done = send_completion(MOPS, [report(row), report(row)], retries)
    assert done["type"] == expected
    for mop, sent in zip(done["mops"], MOPS):
        assert {k: mop[k] for k in sent} == sent
        if expected == "ok":
            assert mop["offset"] == (7 if row == E.NO_ERROR else None) and "error" not in mop
        else:
            assert mop["offset"] is None and mop["error"]
    assert ("error" in done) == (expected != "ok")


def test_a_code_the_table_does_not_name_is_indeterminate():
    assert UNLISTED.type(0) == UNLISTED.type(5) == "info"
    done = send_completion(MOPS[:1], [Report.delivered(KafkaError(E.INVALID_CONFIG), None)], 0)
    assert done["type"] == "info" and done["mops"][0]["error"] == KafkaError(E.INVALID_CONFIG).str()


def test_a_refusal_after_retries_is_not_a_failure_even_with_idempotence():
    # The broker checks the ISR before it recognises a retry as a duplicate: an earlier attempt
    # that timed out in flight may have been written, idempotent producer or not.
    done = send_completion(MOPS[:1], [Report.delivered(KafkaError(E.NOT_ENOUGH_REPLICAS), None)], retries=1)
    assert done == {"type": "info", "error": "Broker: Not enough in-sync replicas",
                    "mops": [dict(MOPS[0], offset=None, error="Broker: Not enough in-sync replicas")]}


def test_a_partly_acknowledged_send_is_indeterminate_and_keeps_the_acknowledged_offset():
    done = send_completion(MOPS, [Report.delivered(None, 4), Report.delivered(KafkaError(E._MSG_TIMED_OUT), None)],
                           retries=5)
    assert done == {"type": "info", "error": "Local: Message timed out",
                    "mops": [dict(MOPS[0], offset=4), dict(MOPS[1], offset=None, error="Local: Message timed out")]}
    # Even next to a message that certainly failed: the acknowledged one happened.
    done = send_completion(MOPS, [Report.delivered(None, 4), Report(NOT_QUEUED, detail="produce() refused it")], 0)
    assert done["type"] == "info" and done["mops"][0]["offset"] == 4


def test_every_acknowledged_send_is_ok_with_its_offsets_and_no_errors():
    done = send_completion(MOPS, [Report.delivered(None, 4), Report.delivered(None, 9)], 5)
    assert done == {"type": "ok", "mops": [dict(MOPS[0], offset=4), dict(MOPS[1], offset=9)]}


def test_an_acknowledgement_without_an_offset_records_none():
    # acks=0: librdkafka reports success with offset -1001 (OFFSET_INVALID).
    done = send_completion(MOPS[:1], [Report.delivered(None, -1001)], 0)
    assert done == {"type": "ok", "mops": [dict(MOPS[0], offset=None)]}


def test_a_missing_report_is_indeterminate_and_says_so():
    done = send_completion(MOPS, [Report.delivered(None, 4), None], 0)
    why = SEND_OUTCOMES[NO_REPORT].reason
    assert done == {"type": "info", "error": why, "mops": [dict(MOPS[0], offset=4), dict(MOPS[1], offset=None, error=why)]}


def test_a_send_refused_by_produce_before_anything_left_the_client_fails():
    done = send_completion(MOPS, [Report(NOT_QUEUED, detail="produce() refused it: Local: Queue full"),
                                  Report(NOT_SENT)], 2147483647)
    assert done["type"] == "fail"
    assert [m["error"] for m in done["mops"]] == ["produce() refused it: Local: Queue full",
                                                  SEND_OUTCOMES[NOT_SENT].reason]


@pytest.mark.parametrize("reports", [[Report.delivered(None, 4), Report.delivered(None, 5)],
                                     [Report(NOT_QUEUED, detail="produce() refused it: Local: Fatal error"),
                                      Report(NOT_SENT)]], ids=["acknowledged", "refused"])
def test_a_send_during_which_the_producer_failed_for_good_ends_its_process(reports):
    # Whatever its messages' fates, so that the worker's process ends (info) and its successor opens
    # a new producer: a producer that failed for good refuses every later send.
    done = send_completion(MOPS, reports, 0, fatal="sequence desynchronization")
    assert done["type"] == "info"
    assert "the producer failed for good (sequence desynchronization): its process ends" in done["error"]
    assert [m["offset"] for m in done["mops"]] == [r.offset for r in reports]


def test_a_missing_report_after_a_fatal_error_says_the_producer_failed_before_it_gave_one():
    done = send_completion(MOPS, [Report.delivered(None, 4), None], 2147483647, fatal="fenced")
    assert done["mops"] == [dict(MOPS[0], offset=4), dict(MOPS[1], offset=None, error=(
        "no delivery report: the producer failed for good before it gave one; it may be written"))]


def test_the_error_behind_an_exception_from_confluent_kafka():
    fatal = KafkaError(E.OUT_OF_ORDER_SEQUENCE_NUMBER, "desynchronised", fatal=True)
    assert kafka_error(KafkaException(fatal)) is fatal
    # A fatal error pending while a delivery callback ran: the SystemError it caused.
    try:
        try:
            raise KafkaException(fatal)
        except KafkaException as cause:
            raise SystemError("<method 'code'> returned a result with an exception set") from cause
    except SystemError as exc:
        assert kafka_error(exc) is fatal
    # The pending error lost by confluent-kafka itself: the client's state is unknown, so fatal.
    lost = kafka_error(SystemError("<method 'flush'> returned NULL without setting an exception"))
    assert lost.fatal() and lost.code() == E._FATAL and "returned NULL" in lost.str()
    with pytest.raises(ValueError, match="ours"):
        kafka_error(ValueError("ours"))


@pytest.mark.parametrize("err,expected", [
    (None, "ok"),
    (KafkaError(E._TIMED_OUT, retriable=True), "info"),
    (KafkaError(E.REQUEST_TIMED_OUT), "info"),
    (KafkaError(E._FATAL, fatal=True), "info"),
    (KafkaError(E.INVALID_TXN_STATE, txn_requires_abort=True), "fail"),
], ids=["committed", "timed out", "broker timed out", "fatal", "must abort"])
def test_a_transaction_commit_that_timed_out_is_indeterminate(err, expected):
    kind, why = commit_outcome(err)
    assert kind == expected and why
