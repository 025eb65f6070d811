"""Hand-written histories, one scenario per case, all checked by one Spark analysis.

Each scenario owns its keys ("<name>-t/<n>") and processes, so the
anomalies found on its keys are its own. A test asserts the exact set of
anomaly types on its keys and the witness fields that matter.
"""

from __future__ import annotations

import json

import pytest

from faultline.history_analysis.anomalies import TYPES, analyse
from faultline.checker.cycles import CYCLE_TYPES, add_cycles
from faultline.checker.explain import EXPLAINERS, explain
from faultline.history_analysis.reference import analyse as analyse_python
from faultline.models.history import write_history

from .conftest import by_scenario, read_full
from .histories import Catalog

scenario = Catalog()


# --- lost-write and unseen ---------------------------------------------------------

@scenario
def lost_write(s):
    k, p, c = s.key(), s.process(), s.process()
    send1 = s.send(p, [(k, 1, 0)])
    send2 = s.send(p, [(k, 2, 1)])
    s.send(p, [(k, 3, 2)])
    s.assign(c, [k], seek=True)
    poll = s.poll(c, [(k, 0, 1), (k, 2, 3)])
    return {"send2": send2, "poll": poll, "send1": send1}


def test_lost_write(found):
    f, ix = found("lost_write")
    # the poll that stepped over offset 1 skipped it within one operation
    assert set(f) == {"lost-write", "unseen", "int-poll-skip"}
    assert f["lost-write"] == [{"key": "lost_write-t/0", "value": 2, "offset": 1, "send_op": ix["send2"],
                                "read_op": ix["poll"], "read_offset": 2, "ops": [ix["send2"], ix["poll"]]}]
    assert f["unseen"] == [{"key": "lost_write-t/0", "count": 1, "values": [2], "offsets": [1], "ops": [ix["send2"]]}]


@scenario
def not_lost_while_no_poll_passed_it(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.send(p, [(k, 2, 1)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1)])


def test_unseen_but_not_lost_while_reads_have_not_passed_it(found):
    f, _ = found("not_lost_while_no_poll_passed_it")
    assert set(f) == {"unseen"}
    assert f["unseen"][0]["values"] == [2]


@scenario
def read_only_by_failed_poll(s):
    k, p, c, d = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2)])
    s.poll(d, [(k, 1, 2)], "fail")
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 2, 3)])


def test_a_value_a_failed_poll_returned_is_not_lost_but_unseen(found):
    f, _ = found("read_only_by_failed_poll")
    assert set(f) == {"unseen", "int-poll-skip"}


@scenario
def unknown_offset(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.send(p, [(k, 2, None)])  # acks=0: acknowledged without an offset
    s.send(p, [(k, 3, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 2, 3)])


def test_an_acknowledged_value_without_offset_can_only_be_unseen(found):
    f, _ = found("unknown_offset")
    assert set(f) == {"unseen"}
    assert f["unseen"][0]["offsets"] == [None]


@scenario
def info_and_fail_sends_read(s):
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None), (k, 2, None)], "info")  # 1 is read below: this send took effect
    s.send(q, [(k, 3, None)], "fail")  # read below anyway: not unexpected, but G1a
    s.send(q, [(k, 4, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 3), (k, 2, 4)])


def test_info_and_fail_values_that_were_read_are_no_anomaly_here(found):
    f, _ = found("info_and_fail_sends_read")
    # 2 committed (its info op took effect) but its offset is unknown: not lost;
    # not acknowledged by an ok send: not unseen. Reading 3, a failed send's value, is G1a.
    assert set(f) == {"G1a"} and [w["value"] for w in f["G1a"]] == [3]


def _info_send_with_offsets(s, first_read: bool):
    # A transaction whose commit is unknown may record the offsets its sends got; they prove
    # nothing until a value of it is read (Jepsen's must-have-committed?), then the other values
    # of a transaction that took effect can be lost.
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    mops = [{"f": "send", "key": k, "value": 1}, {"f": "send", "key": k, "value": 2}]
    info = s.op(p, "txn", "info", {"mops": mops},
                {"mops": [dict(mops[0], offset=0), dict(mops[1], offset=1)]})
    s.send(q, [(k, 3, 2)])
    s.assign(c, [k], seek=True)
    poll = s.poll(c, ([(k, 0, 1)] if first_read else []) + [(k, 2, 3)])
    return {"info": info, "poll": poll}


@scenario
def info_send_took_effect(s):
    return _info_send_with_offsets(s, first_read=True)


@scenario
def info_send_maybe_not(s):
    return _info_send_with_offsets(s, first_read=False)


@scenario
def partly_acknowledged_send(s):
    # A plain send that ended info keeps the offsets its acknowledged records got (history-format.md):
    # value 1 was acknowledged at 0, value 2 has no report. A poll that passes offset 0 without
    # returning 1 shows the acknowledged write lost; value 2 proves nothing.
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    mops = [{"f": "send", "key": k, "value": 1}, {"f": "send", "key": k, "value": 2}]
    info = s.op(p, "send", "info", {"mops": mops}, {"mops": [dict(mops[0], offset=0), dict(mops[1], offset=None)]})
    s.send(q, [(k, 3, 1)])
    s.assign(c, [k], seek=True)
    poll = s.poll(c, [(k, 1, 3)])
    return {"info": info, "poll": poll}


def test_an_info_send_with_a_value_read_is_committed_so_its_others_can_be_lost(found):
    f, ix = found("info_send_took_effect")
    # Its offset 1 is now known to hold 2, which the poll stepped over.
    assert set(f) == {"lost-write", "unseen", "int-poll-skip"}
    assert [(w["value"], w["offset"], w["ops"]) for w in f["lost-write"]] == [(2, 1, [ix["info"], ix["poll"]])]
    f, _ = found("info_send_maybe_not")
    assert f == {}


def test_the_acknowledged_sends_of_an_info_send_keep_their_offsets(found):
    f, ix = found("partly_acknowledged_send")
    assert set(f) == {"lost-write", "unseen"}
    assert [(w["value"], w["offset"], w["ops"]) for w in f["lost-write"]] == [(1, 0, [ix["info"], ix["poll"]])]
    assert [(w["count"], w["values"]) for w in f["unseen"]] == [(1, [1])]


@scenario
def never_completed_send_read(s):
    k, p, c = s.key(), s.process(), s.process()
    s.assign(c, [k], seek=True)
    s.send(p, [(k, 7, None)], completed=False)
    s.poll(c, [(k, 0, 7)])


def test_an_invocation_never_completed_counts_as_sent(found):
    f, _ = found("never_completed_send_read")
    assert f == {}


# --- duplicate, inconsistent-offsets, unexpected --------------------------------------

@scenario
def duplicate(s):
    k, p, c = s.key(), s.process(), s.process()
    send = s.send(p, [(k, 1, 0), (k, 2, 1)])
    poll = s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 1)])
    return {"send": send, "poll": poll, "p": p}


def test_duplicate(found):
    f, ix = found("duplicate")
    assert set(f) == {"duplicate"}
    assert f["duplicate"] == [{"key": "duplicate-t/0", "value": 1, "offsets": [0, 2], "ops": [ix["send"], ix["poll"]],
                               "sends": [{"op": ix["send"], "process": ix["p"], "type": "ok"}]}]


@scenario
def resent_by_a_new_session(s):
    # An application's retry: a send whose outcome its producer never learned (info, the process
    # ended), sent again by the process's successor, a new producer: written by both.
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    first = s.send(p, [(k, 1, None)], "info")
    again = s.send(q, [(k, 1, 1)])
    poll = s.poll(c, [(k, 0, 1), (k, 1, 1)])
    return {"first": first, "again": again, "poll": poll, "p": p, "q": q}


def test_a_value_sent_again_by_a_new_session_is_a_resent_duplicate_naming_both_sessions(found):
    f, ix = found("resent_by_a_new_session")
    assert set(f) == {"resent-duplicate"}
    [w] = f["resent-duplicate"]
    assert w["offsets"] == [0, 1] and w["ops"] == [ix["poll"], ix["again"]]
    assert w["sends"] == [{"op": ix["first"], "process": ix["p"], "type": "info"},
                          {"op": ix["again"], "process": ix["q"], "type": "ok"}]


@scenario
def resent_and_written_twice_by_one_session(s):
    # Two sessions sent the value, but it stands at three offsets: one of them wrote it twice.
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    first = s.send(p, [(k, 1, None)], "info")
    again = s.send(q, [(k, 1, 2)])
    s.poll(c, [(k, 0, 1), (k, 1, 1), (k, 2, 1)])
    return {"first": first, "again": again}


def test_a_value_at_more_offsets_than_the_sessions_that_sent_it_is_a_duplicate(found):
    f, ix = found("resent_and_written_twice_by_one_session")
    assert set(f) == {"duplicate"}
    [w] = f["duplicate"]
    assert w["offsets"] == [0, 1, 2] and [s["op"] for s in w["sends"]] == [ix["first"], ix["again"]]


@scenario
def duplicate_from_failed_poll(s):
    k, p, c, d = s.key(), s.process(), s.process(), s.process()
    send = s.send(p, [(k, 1, 0)])
    s.poll(c, [(k, 0, 1)])
    failed = s.poll(d, [(k, 4, 1)], "fail")
    return {"send": send, "failed": failed, "p": p}


def test_records_of_a_failed_poll_are_evidence_of_the_log(found):
    f, ix = found("duplicate_from_failed_poll")
    assert set(f) == {"duplicate"}
    assert f["duplicate"] == [{"key": "duplicate_from_failed_poll-t/0", "value": 1, "offsets": [0, 4],
                               "ops": [ix["send"], ix["failed"]], "sends": [{"op": ix["send"], "process": ix["p"],
                                                                           "type": "ok"}]}]


@scenario
def same_record_twice(s):
    k, p, c, d = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.poll(c, [(k, 0, 1)])
    s.poll(d, [(k, 0, 1)])


def test_the_same_record_read_twice_is_no_anomaly(found):
    assert found("same_record_twice")[0] == {}


@scenario
def inconsistent_offsets(s):
    k, p, c, d = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.send(p, [(k, 2, None)], "fail")
    read = s.poll(c, [(k, 0, 1)])
    failed = s.poll(d, [(k, 0, 2)], "fail")
    return {"read": read, "failed": failed}


def test_inconsistent_offsets(found):
    f, ix = found("inconsistent_offsets")
    # The failed poll keeps this from being an uncommitted read, and value 2
    # was sent (by a failed send), so it is not unexpected either. The value
    # acknowledged at offset 0 was read there: not a reused offset. The ops are
    # the polls': what makes the offset inconsistent is that readers disagree. What the failed
    # poll returned is evidence too: the failed send of 2 was written (G1a).
    assert set(f) == {"inconsistent-offsets", "G1a"}
    assert f["inconsistent-offsets"] == [{"key": "inconsistent_offsets-t/0", "offset": 0, "values": [1, 2],
                                          "ops": [ix["read"], ix["failed"]]}]


@scenario
def polls_disagree(s):
    k, p, q, c, d = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None)], "info")  # indeterminate: no acknowledged offset
    s.send(q, [(k, 2, None)], "info")
    first = s.poll(c, [(k, 0, 1)])
    second = s.poll(d, [(k, 0, 2)])
    return {"first": first, "second": second}


def test_two_polls_that_disagree_are_inconsistent_offsets_only(found):
    f, ix = found("polls_disagree")
    assert set(f) == {"inconsistent-offsets"}
    assert f["inconsistent-offsets"] == [{"key": "polls_disagree-t/0", "offset": 0, "values": [1, 2],
                                          "ops": [ix["first"], ix["second"]]}]


@scenario
def reused_offset(s):
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    acked = s.send(p, [(k, 2, 1)])  # acknowledged at 1, never read anywhere...
    s.send(q, [(k, 9, None)], "info")
    start = s.assign(c, [k], seek=True, ends={k: 2})
    read = s.poll(c, [(k, 0, 1), (k, 1, 9)])  # ...where the complete final log holds 9
    return {"acked": acked, "start": start, "read": read}


def test_reused_offset_an_acknowledged_offset_holds_another_value(found):
    f, ix = found("reused_offset")
    k = "reused_offset-t/0"
    # The write is lost too (the complete final log lacks it) and unseen; no poll disagrees.
    assert set(f) == {"reused-offset", "lost-write", "unseen"}
    assert f["reused-offset"] == [{"key": k, "offset": 1, "value": 2, "send_op": ix["acked"], "other_value": 9,
                                   "other_op": ix["read"], "ops": [ix["acked"], ix["read"]]}]
    assert f["lost-write"] == [{"key": k, "value": 2, "offset": 1, "send_op": ix["acked"], "final_value": 9,
                                "final_assign": ix["start"], "final_end": 2, "final_read_to": 2,
                                "ops": [ix["acked"], ix["start"]]}]


@scenario
def offset_acknowledged_twice(s):
    k, p, q = s.key(), s.process(), s.process()
    first = s.send(p, [(k, 1, 0)])
    second = s.send(q, [(k, 2, 0)])
    return {"first": first, "second": second}


def test_one_offset_acknowledged_for_two_values_is_reused_for_each(found):
    f, ix = found("offset_acknowledged_twice")
    k, a, b = "offset_acknowledged_twice-t/0", ix["first"], ix["second"]
    # no poll returned anything: the readers did not disagree
    assert set(f) == {"reused-offset", "unseen"}
    assert f["reused-offset"] == [
        {"key": k, "offset": 0, "value": 1, "send_op": a, "other_value": 2, "other_op": b, "ops": [a, b]},
        {"key": k, "offset": 0, "value": 2, "send_op": b, "other_value": 1, "other_op": a, "ops": [b, a]},
    ]


@scenario
def unexpected(s):
    k, k2, p, c = s.key("0"), s.key("1"), s.process(), s.process()
    s.send(p, [(k2, 5, 0)])
    poll = s.poll(c, [(k, 0, 99), (k, 1, 5)])  # 5 was sent, but to another key
    return {"poll": poll}


def test_unexpected(found):
    f, ix = found("unexpected")
    assert set(f) == {"unexpected", "unseen"}  # 5 was never read from the key it was sent to
    assert f["unexpected"] == [
        {"key": "unexpected-t/0", "value": 5, "offset": 1, "offsets": [1], "reads": 1, "ops": [ix["poll"]]},
        {"key": "unexpected-t/0", "value": 99, "offset": 0, "offsets": [0], "reads": 1, "ops": [ix["poll"]]},
    ]


# --- poll-skip and nonmonotonic-poll ------------------------------------------------

def _four_values(s, k):
    p, other = s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2), (k, 4, 3)])
    s.poll(other, [(k, 0, 1), (k, 1, 2), (k, 2, 3), (k, 3, 4)])  # everything is read by someone


@scenario
def poll_skip(s):
    k, c = s.key(), s.process()
    _four_values(s, k)
    s.assign(c, [k])
    first = s.poll(c, [(k, 0, 1)])
    s.poll(c, [], "fail")  # failed polls are not links of the chain
    second = s.poll(c, [(k, 3, 4)])
    return {"first": first, "second": second, "c": c}


def test_poll_skip(found):
    f, ix = found("poll_skip")
    assert set(f) == {"poll-skip"}
    assert f["poll-skip"] == [{"process": ix["c"], "key": "poll_skip-t/0", "prev_offset": 0, "next_offset": 3,
                               "skipped": [1, 2], "skipped_count": 2, "ops": [ix["first"], ix["second"]]}]


@scenario
def poll_skip_reset_by_assign(s):
    # An ok assign that dropped the key ends the chain (Jepsen's poll-skip+nonmonotonic-cases).
    k, c = s.key(), s.process()
    _four_values(s, k)
    s.assign(c, [k])
    s.poll(c, [(k, 0, 1)])
    s.assign(c, [s.key("9")])
    s.assign(c, [k])
    s.poll(c, [(k, 3, 4)])


@scenario
def poll_skip_across_an_assign_that_kept_the_key(s):
    # An assign that keeps the key, and one that was refused or whose outcome is unknown, leave
    # the consumer where it was: the chain runs on.
    k, c, d = s.key(), s.process(), s.process()
    _four_values(s, k)
    s.assign(c, [k])
    first = s.poll(c, [(k, 0, 1)])
    s.assign(c, [k, s.key("9")])
    second = s.poll(c, [(k, 2, 3)])
    s.assign(d, [k])
    third = s.poll(d, [(k, 0, 1)])
    s.assign(d, [s.key("9")], type_="fail")
    fourth = s.poll(d, [(k, 0, 1)])
    return {"first": first, "second": second, "third": third, "fourth": fourth, "c": c, "d": d}


@scenario
def poll_gap_nothing_known_in_it(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 4)])  # offsets 1-3 hold no records (e.g. transaction markers)
    s.poll(c, [(k, 0, 1)])
    s.poll(c, [(k, 4, 2)])


def test_no_poll_skip_across_an_assign_or_over_offsets_nobody_saw(found):
    assert found("poll_skip_reset_by_assign")[0] == {}
    assert found("poll_gap_nothing_known_in_it")[0] == {}


def test_only_an_ok_assign_that_drops_or_rewinds_the_key_ends_the_chain(found):
    f, ix = found("poll_skip_across_an_assign_that_kept_the_key")
    assert set(f) == {"poll-skip", "nonmonotonic-poll"}
    assert [(w["process"], w["ops"]) for w in f["poll-skip"]] == [(ix["c"], [ix["first"], ix["second"]])]
    assert [(w["process"], w["ops"]) for w in f["nonmonotonic-poll"]] == [(ix["d"], [ix["third"], ix["fourth"]])]


@scenario
def nonmonotonic_poll(s):
    k, c = s.key(), s.process()
    _four_values(s, k)
    first = s.poll(c, [(k, 0, 1), (k, 1, 2)])
    second = s.poll(c, [(k, 1, 2), (k, 2, 3)])
    return {"first": first, "second": second, "c": c}


def test_nonmonotonic_poll(found):
    f, ix = found("nonmonotonic_poll")
    assert set(f) == {"nonmonotonic-poll"}
    assert f["nonmonotonic-poll"] == [{"process": ix["c"], "key": "nonmonotonic_poll-t/0", "prev_offset": 1,
                                       "next_offset": 1, "ops": [ix["first"], ix["second"]]}]


@scenario
def rewind_after_seek(s):
    k, c = s.key(), s.process()
    _four_values(s, k)
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2)])


def test_assign_resets_the_poll_chain(found):
    assert found("rewind_after_seek")[0] == {}


@scenario
def txn_abort_rewinds(s):
    # A transaction that failed or whose outcome is unknown is rolled back, and its consumer with
    # it: the next poll reads its records again (Jepsen's kafka_test "txn abort" cases).
    k, c, d = s.key(), s.process(), s.process()
    _four_values(s, k)
    s.assign(c, [k])
    s.txn(c, [("poll", [(k, 0, 1)])])
    s.txn(c, [("poll", [(k, 1, 2), (k, 2, 3)])], "fail")
    s.txn(c, [("poll", [(k, 1, 2), (k, 2, 3)])], "fail")
    s.txn(c, [("poll", [(k, 1, 2), (k, 2, 3)])])
    # An indeterminate one ends its process: its successor's chain starts afresh.
    s.assign(d, [k])
    s.txn(d, [("poll", [(k, 0, 1)])])
    s.txn(d, [("poll", [(k, 1, 2)])], "info")


@scenario
def txn_abort_not_rewound(s):
    # A consumer that went on past an aborted transaction's records skipped them: each later
    # poll, failed or not, is judged against the last one that moved the chain.
    k, c = s.key(), s.process()
    _four_values(s, k)
    s.send(s.process(), [(k, 5, 4), (k, 6, 5)])
    s.poll(s.process(), [(k, 4, 5), (k, 5, 6)])
    s.assign(c, [k])
    first = s.txn(c, [("poll", [(k, 0, 1)])])
    s.txn(c, [("poll", [(k, 1, 2), (k, 2, 3)])], "fail")
    second = s.txn(c, [("send", s.key("9"), 7, 0), ("poll", [(k, 3, 4), (k, 4, 5)])], "fail")
    third = s.txn(c, [("poll", [(k, 5, 6)])])
    fourth = s.poll(c, [(k, 5, 6)])
    return {"first": first, "second": second, "third": third, "fourth": fourth, "c": c}


@scenario
def failed_plain_poll_moves_the_chain(s):
    # A plain poll is no transaction: the records it returned moved the consumer, even though the
    # poll reported an error, so reading them again is nonmonotonic.
    k, c = s.key(), s.process()
    _four_values(s, k)
    s.assign(c, [k])
    first = s.poll(c, [(k, 0, 1)])
    failed = s.poll(c, [(k, 1, 2)], "fail")
    again = s.poll(c, [(k, 1, 2)])
    return {"first": first, "failed": failed, "again": again, "c": c}


def test_an_aborted_or_indeterminate_transaction_does_not_move_the_poll_chain(found):
    assert found("txn_abort_rewinds")[0] == {}
    f, ix = found("txn_abort_not_rewound")
    assert set(f) == {"poll-skip", "nonmonotonic-poll"}
    key = "txn_abort_not_rewound-t/0"
    assert f["poll-skip"] == [
        {"process": ix["c"], "key": key, "prev_offset": 0, "next_offset": 3, "skipped": [1, 2],
         "skipped_count": 2, "ops": [ix["first"], ix["second"]]},
        {"process": ix["c"], "key": key, "prev_offset": 0, "next_offset": 5, "skipped": [1, 2, 3, 4],
         "skipped_count": 4, "ops": [ix["first"], ix["third"]]},
    ]
    # The ok transaction moved the chain to 5: the plain poll after it read 5 again.
    assert f["nonmonotonic-poll"] == [{"process": ix["c"], "key": key, "prev_offset": 5, "next_offset": 5,
                                       "ops": [ix["third"], ix["fourth"]]}]
    f, ix = found("failed_plain_poll_moves_the_chain")
    assert f == {"nonmonotonic-poll": [{"process": ix["c"], "key": "failed_plain_poll_moves_the_chain-t/0",
                                        "prev_offset": 1, "next_offset": 1, "ops": [ix["failed"], ix["again"]]}]}


# --- nonmonotonic-send -------------------------------------------------------------

@scenario
def nonmonotonic_send(s):
    k, p, c = s.key(), s.process(), s.process()
    first = s.send(p, [(k, 1, 5)])
    second = s.send(p, [(k, 2, 3)])
    s.poll(c, [(k, 3, 2), (k, 5, 1)])
    return {"first": first, "second": second, "p": p}


@scenario
def sends_of_two_processes(s):
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 5)])
    s.send(q, [(k, 2, 3)])
    s.send(p, [(k, 3, 6), (k, 4, 4)])  # reversed inside one op: int-nonmonotonic-send, not this type
    s.poll(c, [(k, 3, 2), (k, 4, 4), (k, 5, 1), (k, 6, 3)])


def test_nonmonotonic_send(found):
    f, ix = found("nonmonotonic_send")
    # The write order contradicts the process order: also a G0-process/-realtime, which Kafka allows
    # (no write isolation), and which this type makes bad where no loss is claimed.
    assert set(f) == {"nonmonotonic-send", "G0-process", "G0-realtime"}
    assert f["nonmonotonic-send"] == [{"process": ix["p"], "key": "nonmonotonic_send-t/0", "prev_offset": 5,
                                       "next_offset": 3, "prev_value": 1, "next_value": 2,
                                       "ops": [ix["first"], ix["second"]]}]
    assert set(found("sends_of_two_processes")[0]) == {"int-nonmonotonic-send", "G0-process", "G0-realtime"}


# --- uncommitted-read ---------------------------------------------------------------

@scenario
def uncommitted_read_other_value(s):
    k, p, q, c, final = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.send(q, [(k, 9, None)], "info")
    s.assign(c, [k], seek=True)
    read = s.poll(c, [(k, 0, 1), (k, 1, 9)])  # 9 stood above the high watermark, then was truncated
    s.send(p, [(k, 2, 1)])
    start = s.assign(final, [k], seek=True)
    again = s.poll(final, [(k, 0, 1), (k, 1, 2)])
    return {"read": read, "start": start, "again": again}


def test_uncommitted_read_of_a_value_the_final_log_replaced(found):
    f, ix = found("uncommitted_read_other_value")
    assert set(f) == {"uncommitted-read", "inconsistent-offsets"}
    assert f["uncommitted-read"] == [{"key": "uncommitted_read_other_value-t/0", "offset": 1, "value": 9,
                                      "final_value": 2, "final_op": ix["again"], "final_assign": ix["start"],
                                      "final_end": None, "final_read_to": 2, "ops": [ix["read"], ix["again"]]}]


@scenario
def uncommitted_read_nothing_there(s):
    k, p, q, c, final = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.send(q, [(k, 9, None)], "info")
    s.assign(c, [k], seek=True)
    read = s.poll(c, [(k, 0, 1), (k, 1, 9)])
    s.send(p, [(k, 2, 2)])
    start = s.assign(final, [k], seek=True)
    s.poll(final, [(k, 0, 1)])
    s.poll(final, [(k, 2, 2)])  # skips 1: the final log has nothing there
    return {"read": read, "start": start}


def test_uncommitted_read_of_an_offset_the_final_log_lacks(found):
    f, ix = found("uncommitted_read_nothing_there")
    # the final chain's own step over offset 1 is a poll-skip: the log shows 1 exists
    assert set(f) == {"uncommitted-read", "poll-skip"}
    assert f["uncommitted-read"] == [{"key": "uncommitted_read_nothing_there-t/0", "offset": 1, "value": 9,
                                      "final_value": None, "final_op": None, "final_assign": ix["start"],
                                      "final_end": None, "final_read_to": 3, "ops": [ix["read"], ix["start"]]}]


@scenario
def final_chain_through_a_failed_poll(s):
    k, p, c, final = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 3)])
    s.assign(final, [k], seek=True)
    s.poll(final, [(k, 0, 1)])
    s.poll(final, [(k, 1, 2)], "fail")  # reported an error, yet returned (and moved past) offset 1
    s.poll(final, [(k, 2, 3)])


def test_a_failed_poll_of_the_final_chain_still_shows_the_final_log(found):
    # Judging only the ok polls of the final chain would find offset 1 missing
    # from the final log and call c's read of it uncommitted.
    assert found("final_chain_through_a_failed_poll")[0] == {}


@scenario
def final_read_stops_short(s):
    k, p, q, c, final = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.send(q, [(k, 9, None)], "info")
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 9)])
    s.assign(final, [k], seek=True)
    s.poll(final, [(k, 0, 1)])


@scenario
def no_final_read(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.assign(c, [k])
    s.poll(c, [(k, 0, 1)])


def test_no_uncommitted_read_without_evidence_from_a_final_read(found, catalog):
    assert found("final_read_stops_short")[0] == {}
    assert found("no_final_read")[0] == {}
    # every seek_to_beginning chain of the catalog reads its keys, so the keys
    # not judged are those read by ok polls and never assigned that way
    lines = catalog["builder"].lines
    read = {r["key"] for op in lines if op["type"] == "ok" and op["f"] in ("poll", "txn")
            for m in op["mops"] for r in m.get("records") or []}
    sought = {k for op in lines if op["type"] == "ok" and op.get("seek_to_beginning") for k in op["keys"]}
    unjudged = sorted(read - sought)
    assert "no_final_read-t/0" in unjudged
    [note] = [n for n in catalog["analysis"].notes if n.startswith("uncommitted-read not judged")]
    assert note == (f"uncommitted-read not judged for {len(unjudged)} key(s) ({', '.join(unjudged[:8])}, ...): "
                    f"no assign with seek_to_beginning read them from the beginning")


# --- final reads: the end offset the broker gave --------------------------------------

def _three_read_then_final(s, end: int, final_reads: int):
    """Three values acknowledged at 0, 1, 2 and read by a consumer; then final reads from the
    beginning told the log ends at `end`, returning the first `final_reads` records."""
    k, p, c, final = s.key(), s.process(), s.process(), s.process()
    sends = [s.send(p, [(k, v, o)]) for o, v in enumerate((1, 2, 3))]
    read = s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 3)])
    start = s.assign(final, [k], seek=True, ends={k: end})
    s.poll(final, [(k, o, o + 1) for o in range(final_reads)])
    return {"sends": sends, "read": read, "start": start}


@scenario
def final_log_cut_tail(s):
    return _three_read_then_final(s, end=2, final_reads=2)


@scenario
def final_log_whole(s):
    return _three_read_then_final(s, end=3, final_reads=3)


@scenario
def final_log_short_of_its_end(s):
    return _three_read_then_final(s, end=3, final_reads=2)


def _transactions_then_final(s, positions_by_final: bool):
    """Two transactions commit values 1 and 2 at offsets 0 and 2 (their commit markers at 1 and 3,
    which no consumer returns); the final reads, told the log ends at 4, return both records, and a
    poll then finds the end at 4: a poll of the final chain, or of another consumer."""
    k, p, other, final = s.key(), s.process(), s.process(), s.process()
    s.txn(p, [("send", k, 1, 0)])
    s.txn(p, [("send", k, 2, 2)])
    s.assign(other, [k], seek=True)
    s.poll(other, [(k, 0, 1), (k, 2, 2)])
    start = s.assign(final, [k], seek=True, ends={k: 4})
    s.poll(final, [(k, 0, 1), (k, 2, 2)])
    s.poll(final if positions_by_final else other, [], positions={k: 4})
    return {"start": start}


@scenario
def final_log_ends_in_markers(s):
    return _transactions_then_final(s, positions_by_final=True)


@scenario
def final_log_ends_in_markers_another_consumer_saw(s):
    return _transactions_then_final(s, positions_by_final=False)


def test_a_final_chain_whose_consumer_found_the_end_past_transaction_markers_read_the_whole_log(found, catalog):
    f, ix = found("final_log_ends_in_markers")
    assert f == {}
    summaries = {r["key"]: r for r in catalog["analysis"].final_reads}
    assert summaries["final_log_ends_in_markers-t/0"] == {
        "key": "final_log_ends_in_markers-t/0", "assign": ix["start"], "end": 4, "read_to": 4, "known_end": 3,
        "late_end": 3, "complete": True, "outcome": None}
    # Only the final chain's own consumer speaks for the final log.
    other = summaries["final_log_ends_in_markers_another_consumer_saw-t/0"]
    assert (other["read_to"], other["complete"]) == (3, False)


def test_a_tail_the_complete_final_log_lost_is_a_lost_write_and_its_read_uncommitted(found):
    f, ix = found("final_log_cut_tail")
    k, send, start = "final_log_cut_tail-t/0", ix["sends"][2], ix["start"]
    # value 3 was read (so the first lost-write rule, reads passing it, cannot apply) and
    # acknowledged at 2, but the broker says the log ends at 2 and the final reads got there
    assert set(f) == {"lost-write", "uncommitted-read"}
    assert f["lost-write"] == [{"key": k, "value": 3, "offset": 2, "send_op": send, "final_value": None,
                                "final_assign": start, "final_end": 2, "final_read_to": 2, "ops": [send, start]}]
    assert f["uncommitted-read"] == [{"key": k, "offset": 2, "value": 3, "final_value": None, "final_op": None,
                                      "final_assign": start, "final_end": 2, "final_read_to": 2,
                                      "ops": [ix["read"], start]}]


def test_final_reads_to_the_end_that_hold_everything_find_nothing(found):
    assert found("final_log_whole")[0] == {}


def test_final_reads_short_of_the_end_judge_no_tail(found):
    # read_to 2 < end 3: incomplete, so offset 2 is neither lost nor uncommitted
    assert found("final_log_short_of_its_end")[0] == {}


@scenario
def lost_write_passed_and_missing(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    lost = s.send(p, [(k, 2, 1)])
    s.send(p, [(k, 3, 2)])
    s.assign(c, [k], seek=True, ends={k: 3})
    poll = s.poll(c, [(k, 0, 1), (k, 2, 3)])
    return {"lost": lost, "poll": poll}


def test_a_write_both_lost_write_rules_catch_is_reported_once(found):
    f, ix = found("lost_write_passed_and_missing")
    assert set(f) == {"lost-write", "unseen", "int-poll-skip"}
    # the first rule's witness (a read passed it); the complete final log's lack of it adds nothing
    assert [(w["value"], w["read_op"]) for w in f["lost-write"]] == [(2, ix["poll"])]


@scenario
def lost_write_resent_passed_and_missing(s):
    # Value 2 sent twice (an application's resend), acknowledged at 3 and then at 1: a poll passed
    # the later; the complete final log holds neither, and no poll passed the earlier.
    k, p, q, c, f = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(q, [(k, 2, 3)])
    s.send(p, [(k, 1, 0)])
    passed = s.send(p, [(k, 2, 1)])
    s.send(p, [(k, 3, 2)])
    poll = s.poll(c, [(k, 0, 1), (k, 2, 3)])
    s.assign(f, [k], seek=True, ends={k: 4})
    s.poll(f, [(k, 0, 1), (k, 2, 3)], positions={k: 4})
    return {"passed": passed, "poll": poll}


def test_a_value_a_read_passed_is_one_lost_write_whatever_its_other_sends(found):
    f, ix = found("lost_write_resent_passed_and_missing")
    # the first rule's witness, at the send the read passed; the second rule (a value the complete
    # final log lacks, named at its first send in history order: here the earlier, unpassed one)
    # adds nothing, as a read passed the value
    assert [(w["value"], w["offset"], w["send_op"], w["read_op"]) for w in f["lost-write"]] == \
        [(2, 1, ix["passed"], ix["poll"])]


@scenario
def final_chain_across_a_reassign(s):
    k, p, c, final = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2)])
    s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 3)])
    start = s.assign(final, [k], seek=True, ends={k: 2})
    s.poll(final, [(k, 0, 1), (k, 1, 2)])
    # Jepsen's final reads: assign again, without rewinding, to learn whether the end moved;
    # it did, and the chain goes on past the second assign.
    s.assign(final, [k], ends={k: 3})
    s.poll(final, [(k, 2, 3)])
    return {"start": start}


def test_the_final_chain_runs_past_later_assigns_and_takes_the_latest_end(found, catalog):
    _, ix = found("final_chain_across_a_reassign")
    assert found("final_chain_across_a_reassign")[0] == {}
    [summary] = [r for r in catalog["analysis"].final_reads if r["key"] == "final_chain_across_a_reassign-t/0"]
    assert summary == {"key": "final_chain_across_a_reassign-t/0", "assign": ix["start"], "end": 3, "read_to": 3,
                       "known_end": 3, "late_end": 3, "complete": True, "outcome": None}


def test_final_reads_summarise_every_key_with_evidence_or_a_final_chain(catalog):
    summaries = {r["key"]: r for r in catalog["analysis"].final_reads}
    assert list(summaries) == sorted(summaries)
    assert summaries["final_log_cut_tail-t/0"] == {
        "key": "final_log_cut_tail-t/0", "assign": catalog["facts"]["final_log_cut_tail"]["start"], "end": 2,
        "read_to": 2, "known_end": 3, "late_end": 2, "complete": True, "outcome": None}
    assert summaries["final_log_short_of_its_end-t/0"]["complete"] is False
    # no final chain: complete only by a final chain, whatever the evidence
    assert summaries["no_final_read-t/0"] == {"key": "no_final_read-t/0", "assign": None, "end": None,
                                              "read_to": 0, "known_end": 1, "late_end": 0, "complete": False,
                                              "outcome": None}
    # a key whose only send was never acknowledged has no evidence in its log, and no final chain
    assert "stats-t/0" not in summaries


# --- consumption: lost-consumption, duplicate-consumption ---------------------------

@scenario
def consumption_after_processing(s):
    """Commit after processing: a member killed between the two has its records processed again."""
    k, p, a, b = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2)])
    s.assign(a, [k], f="subscribe")
    s.poll(a, [(k, 0, 1), (k, 1, 2)])
    a_done = s.processed(a, [(k, 0, 1), (k, 1, 2)])
    s.op(a, "commit", "info", {})  # killed while committing: nothing recorded as committed
    s.assign(b, [k], f="subscribe")
    s.poll(b, [(k, 0, 1), (k, 1, 2), (k, 2, 3)])
    b_done = s.processed(b, [(k, 0, 1), (k, 1, 2), (k, 2, 3)])
    s.commit(b, {k: 3})
    return {"a": a, "b": b, "a_done": a_done, "b_done": b_done}


@scenario
def consumption_before_processing(s):
    """Commit before processing: a member killed between the two never processes what it committed."""
    k, p, a, b = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2)])
    s.assign(a, [k], f="subscribe")
    s.poll(a, [(k, 0, 1), (k, 1, 2)])
    commit = s.commit(a, {k: 2})
    s.processed(a, [(k, 0, 1)], "info")  # killed while processing: offset 0 may have been
    s.assign(b, [k], f="subscribe")
    s.poll(b, [(k, 2, 3)])
    s.processed(b, [(k, 2, 3)])
    s.commit(b, {k: 1}, "fail")  # refused: passes nothing
    final = s.commit(b, {k: 3}, f="committed")
    return {"commit": commit, "final": final}


def test_records_processed_twice_are_duplicate_consumption(found):
    f, ix = found("consumption_after_processing")
    k = "consumption_after_processing-t/0"
    assert set(f) == {"duplicate-consumption"}
    assert f["duplicate-consumption"] == [
        {"key": k, "offset": o, "value": o + 1, "processes": [ix["a"], ix["b"]], "ops": [ix["a_done"], ix["b_done"]]}
        for o in (0, 1)]


def test_a_commit_past_records_nobody_processed_is_lost_consumption(found):
    f, ix = found("consumption_before_processing")
    k = "consumption_before_processing-t/0"
    # offset 0: an info processing may have done it; offset 1: committed past, never processed
    assert set(f) == {"lost-consumption"}
    assert f["lost-consumption"] == [{"key": k, "offset": 1, "value": 2, "committed": 3,
                                      "committed_op": ix["final"], "ops": [ix["final"]]}]


# --- ownership-overlap ---------------------------------------------------------------


@scenario
def two_consumers_hold_a_key(s):
    k, a, b = s.key(), s.process(), s.process()
    s.assign(a, [k], f="subscribe")
    s.assign(b, [k], f="subscribe")
    a_given = s.poll(a, [], rebalances=[("assigned", [k])])
    # b is given the key while a has not yet been told it lost it (a zombie member)
    b_given = s.poll(b, [], rebalances=[("assigned", [k])])
    a_taken = s.poll(a, [], rebalances=[("lost", [k])])
    return {"a": a, "b": b, "a_given": a_given, "b_given": b_given, "a_taken": a_taken}


@scenario
def a_key_handed_over(s):
    k, a, b = s.key(), s.process(), s.process()
    s.assign(a, [k], f="subscribe")
    s.assign(b, [k], f="subscribe")
    s.poll(a, [], rebalances=[("assigned", [k])])
    s.poll(a, [], rebalances=[("revoked", [k])])
    s.poll(b, [], rebalances=[("assigned", [k])])
    # untyped entries say nothing of holding
    s.poll(a, [], rebalances=[(None, [k])])


@scenario
def a_key_held_into_a_crash(s):
    k, a, b = s.key(), s.process(), s.process()
    s.assign(a, [k], f="subscribe")
    s.assign(b, [k], f="subscribe")
    a_given = s.poll(a, [], rebalances=[("assigned", [k])])
    b_given = s.poll(b, [], rebalances=[("assigned", [k])])
    crash = s.op(a, "crash", "info", {})  # a's consumer closes only now
    return {"a": a, "b": b, "a_given": a_given, "b_given": b_given, "crash": crash}


@scenario
def a_key_given_after_its_holder_crashed(s):
    k, a, b = s.key(), s.process(), s.process()
    s.assign(a, [k], f="subscribe")
    s.assign(b, [k], f="subscribe")
    s.poll(a, [], rebalances=[("assigned", [k])])
    s.op(a, "crash", "info", {})
    s.poll(b, [], rebalances=[("assigned", [k])])


def test_two_consumers_that_held_one_key_at_once_are_an_ownership_overlap(found):
    f, ix = found("two_consumers_hold_a_key")
    assert set(f) == {"ownership-overlap"}
    assert f["ownership-overlap"] == [{
        "key": "two_consumers_hold_a_key-t/0",
        "held": [{"process": ix["a"], "since_op": ix["a_given"], "until_op": ix["a_taken"]},
                 {"process": ix["b"], "since_op": ix["b_given"], "until_op": None}],
        "ops": [ix["a_given"], ix["b_given"]]}]
    f, ix = found("a_key_held_into_a_crash")
    assert f["ownership-overlap"][0]["held"][0] == {"process": ix["a"], "since_op": ix["a_given"],
                                                    "until_op": ix["crash"]}


def test_a_key_taken_back_or_its_holder_gone_before_it_is_given_again_is_no_overlap(found):
    assert found("a_key_handed_over")[0] == {}
    assert found("a_key_given_after_its_holder_crashed")[0] == {}


# --- G1a and precommitted-read -------------------------------------------------------

@scenario
def aborted_read(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    failed = s.send(p, [(k, 2, None)], "fail")
    s.assign(c, [k], seek=True)
    read = s.poll(c, [(k, 0, 1), (k, 1, 2)])
    return {"failed": failed, "read": read}


def test_g1a_an_ok_poll_read_what_a_failed_send_sent(found):
    f, ix = found("aborted_read")
    assert set(f) == {"G1a"}
    assert f["G1a"] == [{"key": "aborted_read-t/0", "value": 2, "offset": 1, "send_op": ix["failed"],
                         "read_op": ix["read"], "reads": 1, "ops": [ix["failed"], ix["read"]]}]


@scenario
def indeterminate_send_read(s):
    k, p, c = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, None)], "info")  # may have happened: reading it is no anomaly
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1)])


def test_reading_an_indeterminate_send_is_not_g1a(found):
    assert found("indeterminate_send_read")[0] == {}


@scenario
def precommitted(s):
    k, p, q = s.key(), s.process(), s.process()
    s.send(q, [(k, 1, 0)])
    own = s.op(p, "txn", "ok", {"mops": [{"f": "send", "key": k, "value": 2}, {"f": "poll"}]},
               {"mops": [{"f": "send", "key": k, "value": 2, "offset": 1},
                         {"f": "poll", "records": [{"key": k, "offset": 0, "value": 1},
                                                   {"key": k, "offset": 1, "value": 2}]}]})
    c = s.process()
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2)])
    return {"own": own, "p": p}


def test_precommitted_read_a_transaction_polled_its_own_send(found):
    f, ix = found("precommitted")
    # reading value 1, sent by another operation, is fine; value 2 is its own
    assert set(f) == {"precommitted-read"}
    assert f["precommitted-read"] == [{"process": ix["p"], "key": "precommitted-t/0",
                                       "op": ix["own"], "value": 2, "offset": 1, "ops": [ix["own"]]}]


# --- within one operation -------------------------------------------------------------

@scenario
def internal_polls(s):
    k, j, p, c, d = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2), (j, 4, 0)])
    skip = s.poll(c, [(k, 0, 1), (j, 0, 4), (k, 2, 3)])  # other keys between do not matter
    back = s.poll(d, [(k, 1, 2), (k, 0, 1)])
    return {"skip": skip, "back": back, "c": c, "d": d}


def test_int_poll_skip_and_int_nonmonotonic_poll_within_one_poll(found):
    f, ix = found("internal_polls")
    assert set(f) == {"int-poll-skip", "int-nonmonotonic-poll"}
    assert f["int-poll-skip"] == [{"process": ix["c"], "key": "internal_polls-t/0", "op": ix["skip"],
                                   "prev_offset": 0, "next_offset": 2, "skipped": [1], "skipped_count": 1,
                                   "ops": [ix["skip"]]}]
    assert f["int-nonmonotonic-poll"] == [{"process": ix["d"], "key": "internal_polls-t/0", "op": ix["back"],
                                           "prev_offset": 1, "next_offset": 0, "ops": [ix["back"]]}]


@scenario
def internal_sends(s):
    k, p, q, r = s.key(), s.process(), s.process(), s.process()
    s.send(q, [(k, 9, None)], "info")  # lands at 1, between p's two values
    apart = s.send(p, [(k, 1, 0), (k, 2, 2)])
    reversed_ = s.send(r, [(k, 3, 4), (k, 4, 3)])
    together = s.send(r, [(k, 5, 5), (k, 6, 6)])  # adjacent and in order: fine
    c = s.process()
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 9), (k, 2, 2), (k, 3, 4), (k, 4, 3), (k, 5, 5), (k, 6, 6)])
    return {"apart": apart, "reversed": reversed_, "together": together, "p": p, "r": r}


def test_int_send_skip_and_int_nonmonotonic_send_within_one_send(found):
    f, ix = found("internal_sends")
    assert set(f) == {"int-send-skip", "int-nonmonotonic-send"}
    assert f["int-send-skip"] == [{"process": ix["p"], "key": "internal_sends-t/0", "op": ix["apart"],
                                   "prev_offset": 0, "next_offset": 2, "prev_value": 1, "next_value": 2,
                                   "skipped": [1], "skipped_count": 1, "ops": [ix["apart"]]}]
    assert f["int-nonmonotonic-send"] == [{"process": ix["r"], "key": "internal_sends-t/0", "op": ix["reversed"],
                                           "prev_offset": 4, "next_offset": 3, "prev_value": 3, "next_value": 4,
                                           "ops": [ix["reversed"]]}]


# --- G0 and G1c: cycles of dependencies ------------------------------------------------

def txn(s, process, sends, records, type_="ok"):
    """One operation that sends (key, value, offset) and polls records (key, offset, value)."""
    invoke = [{"f": "send", "key": k, "value": v} for k, v, _ in sends] + [{"f": "poll"}]
    done = ([{"f": "send", "key": k, "value": v, "offset": o} for k, v, o in sends]
            + [{"f": "poll", "records": [{"key": k, "offset": o, "value": v} for k, o, v in records]}])
    return s.op(process, "txn", type_, {"mops": invoke}, {"mops": done})


@scenario
def write_cycle(s):
    k, j, p, q, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    a = s.send(p, [(k, 1, 0), (j, 2, 1)])
    b = s.send(q, [(k, 3, 1), (j, 4, 0)])  # after a in k's log, before it in j's
    s.assign(c, [k, j], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 3), (j, 0, 4), (j, 1, 2)])
    return {"a": a, "b": b, "k": k, "j": j}


def test_g0_two_sends_ordered_one_way_in_one_log_and_the_other_way_in_another(found):
    f, ix = found("write_cycle")
    assert set(f) == {"G0"}
    a, b = ix["a"], ix["b"]
    assert f["G0"] == [{"size": 2, "ops": [a, b], "steps": [{"from": a, "to": b, "type": "ww", "key": ix["k"]},
                                                           {"from": b, "to": a, "type": "ww", "key": ix["j"]}]}]


@scenario
def read_cycle(s):
    x, y, p, q, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    t1 = txn(s, p, [(x, 1, 0)], [(y, 0, 2)])  # read t2's write...
    t2 = txn(s, q, [(y, 2, 0)], [(x, 0, 1)])  # ...which read t1's
    s.assign(c, [x, y], seek=True)
    s.poll(c, [(x, 0, 1), (y, 0, 2)])
    return {"t1": t1, "t2": t2, "x": x, "y": y}


def test_g1c_two_transactions_that_each_read_the_other(found):
    f, ix = found("read_cycle")
    assert set(f) == {"G1c"}
    t1, t2 = ix["t1"], ix["t2"]
    assert f["G1c"] == [{"size": 2, "ops": [t1, t2], "steps": [{"from": t1, "to": t2, "type": "wr", "key": ix["x"]},
                                                              {"from": t2, "to": t1, "type": "wr", "key": ix["y"]}]}]


@scenario
def dependencies_in_one_order(s):
    x, y, z, p, q, r, c = s.key("0"), s.key("1"), s.key("2"), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(x, 1, 0), (y, 2, 0)])
    txn(s, q, [(z, 3, 0), (x, 4, 1)], [(y, 0, 2)])  # after p everywhere, and read p's write
    txn(s, r, [(y, 5, 1)], [(z, 0, 3), (x, 1, 4)])  # after both
    s.assign(c, [x, y, z], seek=True)
    s.poll(c, [(x, 0, 1), (x, 1, 4), (y, 0, 2), (y, 1, 5), (z, 0, 3)])


@scenario
def written_before_an_acknowledged_write(s):
    x, y, p, q, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    a = s.send(p, [(x, 1, 1), (y, 2, 1)])  # acknowledged at offset 1 of each...
    b = s.send(q, [(x, 3, 0), (y, 4, 0)])  # ...then a later send lands before it in both
    s.assign(c, [x, y], seek=True)
    s.poll(c, [(x, 0, 3), (x, 1, 1), (y, 0, 4), (y, 1, 2)])
    return {"a": a, "b": b, "x": x}


def test_g0_realtime_a_send_invoked_after_another_completed_lands_before_it(found):
    f, ix = found("written_before_an_acknowledged_write")
    a, b = ix["a"], ix["b"]
    assert set(f) == {"G0-realtime"}
    assert f["G0-realtime"] == [{"size": 2, "ops": [a, b], "steps": [
        {"from": a, "to": b, "type": "realtime", "key": None}, {"from": b, "to": a, "type": "ww", "key": ix["x"]}]}]


def test_no_cycle_when_every_dependency_runs_one_way(found):
    assert found("dependencies_in_one_order")[0] == {}


@scenario
def resent_after_another_write(s):
    # p's send of 1 timed out but was written at 0; q then wrote 2 at 1; r, a new session invoked
    # after q completed, sent 1 again and was acknowledged at 2. r wrote after q: placing r at its
    # value's lowest offset (0, p's write) would order r before q and close a false G0-realtime.
    k, p, q, r, c = s.key(), s.process(), s.process(), s.process(), s.process()
    first = s.send(p, [(k, 1, None)], "info")
    s.send(q, [(k, 2, 1)])
    again = s.send(r, [(k, 1, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 1)])
    return {"first": first, "again": again}


@scenario
def resent_by_a_process_after_its_own_write(s):
    # The same, with one process writing 2 and then resending 1: its sends are in order.
    k, p, q, c = s.key(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None)], "info")
    s.send(q, [(k, 2, 1)])
    s.send(q, [(k, 1, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 1)])


@scenario
def read_before_its_resend(s):
    # p's send of 1 timed out but was written at 0; c read it there; r, a new session invoked after
    # c's poll completed, sent 1 again (timing out too) and q wrote 2 after c's poll. c read p's
    # copy: taking r for its writer would make the poll read from the future (G1c-realtime), and
    # placing r at 0 would order it before q, which completed before r began (G0-realtime).
    k, p, q, r, c = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None)], "info")
    s.poll(c, [(k, 0, 1)])
    s.send(q, [(k, 2, 1)])
    s.send(r, [(k, 1, None)], "info")
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2)])


@scenario
def read_before_its_acknowledged_resend(s):
    # The same, with r's resend acknowledged at 2 and read there: the poll of offset 0 read p's
    # copy, the one of offset 2 r's.
    k, p, q, r, c = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None)], "info")
    s.poll(c, [(k, 0, 1)])
    s.send(q, [(k, 2, 1)])
    s.send(r, [(k, 1, 2)])
    s.assign(c, [k], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 1)])


@scenario
def read_of_a_resend_from_the_future(s):
    # Against the two above: r's resend was acknowledged at 2, and c read offset 2 before r was
    # invoked. That copy is r's, so the read is from the future.
    k, p, q, r, c = s.key(), s.process(), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None)], "info")
    s.send(q, [(k, 2, 1)])
    poll = s.poll(c, [(k, 0, 1), (k, 1, 2), (k, 2, 1)])
    again = s.send(r, [(k, 1, 2)])
    return {"poll": poll, "again": again}


def test_a_resent_value_is_ordered_where_its_acknowledged_send_wrote_it(found):
    f, ix = found("resent_after_another_write")
    assert set(f) == {"resent-duplicate"}
    assert [s["op"] for s in f["resent-duplicate"][0]["sends"]] == [ix["first"], ix["again"]]
    assert set(found("resent_by_a_process_after_its_own_write")[0]) == {"resent-duplicate"}


def test_a_copy_of_a_resent_value_is_attributed_only_to_the_send_acknowledged_there(found):
    assert found("read_before_its_resend")[0] == {}
    assert set(found("read_before_its_acknowledged_resend")[0]) == {"resent-duplicate"}
    f, ix = found("read_of_a_resend_from_the_future")
    assert set(f) == {"G1c-realtime", "resent-duplicate"}
    assert f["G1c-realtime"][0]["ops"] == [ix["poll"], ix["again"]]


# --- Jepsen's Kafka semantics, rule by rule (each both ways) ------------------------------

@scenario
def read_from_the_future(s):
    # Rule 1: a poll returned 1 before the send of 1 was even invoked.
    k, c, p = s.key(), s.process(), s.process()
    poll = s.poll(c, [(k, 0, 1)])
    send = s.send(p, [(k, 1, 0)])
    return {"poll": poll, "send": send}


@scenario
def read_after_the_send(s):
    k, c, p = s.key(), s.process(), s.process()
    s.send(p, [(k, 1, 0)])
    s.poll(c, [(k, 0, 1)])


@scenario
def read_before_its_own_send(s):
    # Rule 1, process order: a process polled a value that it sent only in its next operation.
    k, p = s.key(), s.process()
    poll = s.poll(p, [(k, 0, 1)])
    send = s.send(p, [(k, 1, 0)])
    return {"poll": poll, "send": send}


def test_a_read_from_the_future_is_a_g1c_realtime_or_process_cycle(found):
    f, ix = found("read_from_the_future")
    assert set(f) == {"G1c-realtime"}
    [w] = f["G1c-realtime"]
    assert w["ops"] == [ix["poll"], ix["send"]] and {st["type"] for st in w["steps"]} == {"wr", "realtime"}
    assert found("read_after_the_send")[0] == {}
    f, ix = found("read_before_its_own_send")
    assert set(f) == {"G1c-process", "G1c-realtime"}
    assert f["G1c-process"][0]["ops"] == [ix["poll"], ix["send"]]


@scenario
def read_cycle_through_an_indeterminate_txn(s):
    # Rule 2: the info transaction's poll read t2's write; its edge counts (Jepsen's readers-of).
    x, y, p, q = s.key("0"), s.key("1"), s.process(), s.process()
    t1 = txn(s, p, [(x, 1, None)], [(y, 0, 2)], "info")
    t2 = txn(s, q, [(y, 2, 0)], [(x, 0, 1)])
    return {"t1": t1, "t2": t2}


@scenario
def one_way_read_through_an_indeterminate_txn(s):
    x, y, p, q = s.key("0"), s.key("1"), s.process(), s.process()
    txn(s, p, [(x, 1, None)], [], "info")
    txn(s, q, [(y, 2, 0)], [(x, 0, 1)])


def test_write_read_edges_come_from_every_completion_that_returned_records(found):
    f, ix = found("read_cycle_through_an_indeterminate_txn")
    assert set(f) == {"G1c", "unseen"}  # only the info transaction read 2
    assert f["G1c"][0]["ops"] == [ix["t1"], ix["t2"]]
    assert set(found("one_way_read_through_an_indeterminate_txn")[0]) == {"unseen"}  # nobody read 2


@scenario
def interleaved_plain_sends(s):
    # Rule 3: two overlapping non-transactional sends of two keys, landing in opposite orders, and
    # single-key sends between them: a write cycle only through inferred write-write edges.
    k, j, p, q, r, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process(), s.process()
    s.line(p, "invoke", "send", mops=[{"f": "send", "key": k, "value": 1}, {"f": "send", "key": j, "value": 2}])
    s.line(q, "invoke", "send", mops=[{"f": "send", "key": k, "value": 3}, {"f": "send", "key": j, "value": 4}])
    s.line(p, "ok", "send", mops=[{"f": "send", "key": k, "value": 1, "offset": 0},
                                  {"f": "send", "key": j, "value": 2, "offset": 1}])
    s.line(q, "ok", "send", mops=[{"f": "send", "key": k, "value": 3, "offset": 1},
                                  {"f": "send", "key": j, "value": 4, "offset": 0}])
    s.b.counts["ops"] += 2  # the two sends written line by line above
    s.b.counts["ok"] += 2
    by_f = s.b.by_f.setdefault("send", {"invoked": 0, "ok": 0})
    by_f["invoked"] += 2
    by_f["ok"] += 2
    s.send(r, [(k, 5, 2)])
    s.assign(c, [k, j], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 3), (k, 2, 5), (j, 0, 4), (j, 1, 2)])


def test_interleaved_plain_sends_make_only_write_cycles(found):
    f, _ = found("interleaved_plain_sends")
    assert set(f) == {"G0"}


@scenario
def rebalanced_during_a_poll(s):
    # Rule 5: a subscriber's poll whose second poll() call followed a rebalance that moved k.
    k, j, p, c = s.key("0"), s.key("1"), s.process(), s.process()
    s.send(p, [(k, 1, 0), (k, 2, 1), (k, 3, 2), (j, 4, 0), (j, 5, 1), (j, 6, 2)])
    everything = s.process()
    s.assign(everything, [k, j], seek=True)
    s.poll(everything, [(k, 0, 1), (k, 1, 2), (k, 2, 3), (j, 0, 4), (j, 1, 5), (j, 2, 6)])
    s.op(c, "subscribe", "ok", {"keys": [k, j]})
    done = [{"f": "poll", "records": [{"key": k, "offset": 0, "value": 1}, {"key": j, "offset": 0, "value": 4}]},
            {"f": "poll", "records": [{"key": k, "offset": 2, "value": 3}, {"key": j, "offset": 2, "value": 6}]}]
    poll = s.op(c, "poll", "ok", {"mops": [{"f": "poll"}, {"f": "poll"}]},
                {"mops": done, "rebalance_log": [{"keys": [k]}]})
    return {"poll": poll, "j": j}


def test_a_key_a_rebalance_moved_during_an_operation_is_not_judged_inside_it(found):
    f, ix = found("rebalanced_during_a_poll")
    assert set(f) == {"int-poll-skip"}
    assert [(w["key"], w["op"]) for w in f["int-poll-skip"]] == [(ix["j"], ix["poll"])]


@scenario
def sends_read_back_in_reverse(s):
    # Rule 6: positions come from the version order, acknowledged offset or not.
    k, j, p, q, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    reversed_ = s.send(p, [(k, 1, None), (k, 2, None)], "info")
    first = s.send(q, [(j, 3, None)])  # acks=0: no offset
    second = s.send(q, [(j, 4, None)])
    s.assign(c, [k, j], seek=True)
    s.poll(c, [(k, 0, 2), (k, 1, 1), (j, 0, 4), (j, 1, 3)])
    return {"reversed": reversed_, "first": first, "second": second, "p": p, "q": q, "k": k, "j": j}


@scenario
def sends_read_back_in_order(s):
    k, j, p, q, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    s.send(p, [(k, 1, None), (k, 2, None)], "info")
    s.send(q, [(j, 3, None)])
    s.send(q, [(j, 4, None)])
    s.assign(c, [k, j], seek=True)
    s.poll(c, [(k, 0, 1), (k, 1, 2), (j, 0, 3), (j, 1, 4)])


def test_send_order_comes_from_the_version_order(found):
    f, ix = found("sends_read_back_in_reverse")
    assert {"int-nonmonotonic-send", "nonmonotonic-send"} <= set(f) <= {
        "int-nonmonotonic-send", "nonmonotonic-send", "G0-process", "G0-realtime"}
    assert f["int-nonmonotonic-send"] == [{"process": ix["p"], "key": ix["k"], "op": ix["reversed"],
                                           "prev_offset": 1, "next_offset": 0, "prev_value": 1, "next_value": 2,
                                           "ops": [ix["reversed"]]}]
    assert f["nonmonotonic-send"] == [{"process": ix["q"], "key": ix["j"], "prev_offset": 1, "next_offset": 0,
                                       "prev_value": 3, "next_value": 4, "ops": [ix["first"], ix["second"]]}]
    assert found("sends_read_back_in_order")[0] == {}


@scenario
def failed_operations_as_evidence(s):
    # Rule 9: a failed transaction polled its own send; a failed poll returned a failed send's value.
    k, j, p, q, c = s.key("0"), s.key("1"), s.process(), s.process(), s.process()
    own = s.op(p, "txn", "fail", {"mops": [{"f": "send", "key": k, "value": 1}, {"f": "poll"}]},
               {"mops": [{"f": "send", "key": k, "value": 1},
                         {"f": "poll", "records": [{"key": k, "offset": 0, "value": 1}]}]})
    s.send(q, [(j, 2, None)], "fail")
    read = s.poll(c, [(j, 0, 2)], "fail")
    return {"own": own, "read": read, "p": p}


def test_a_failed_operations_records_are_evidence(found):
    f, ix = found("failed_operations_as_evidence")
    assert set(f) == {"precommitted-read", "G1a"}
    assert [w["ops"] for w in f["precommitted-read"]] == [[ix["own"]]]
    # Both the failed transaction's own read of 1 and the failed poll's read of 2 read failed sends.
    assert sorted(w["read_op"] for w in f["G1a"]) == [ix["own"], ix["read"]]


# --- the analysis as a whole ---------------------------------------------------------

@pytest.fixture(scope="module")
def catalog(spark, tmp_path_factory):
    builder, facts = scenario.build()
    builder.nemesis()
    builder.nemesis("heal", "fail", error="could not reach n2")  # in the stats' heal_errors
    builder.nemesis("heal")
    k = "stats-t/0"
    builder.send(builder.process(), [(k, 1, None)], completed=False)
    builder.nemesis("heal", completed=False)  # never completed: its made-up error is no heal error
    tmp = tmp_path_factory.mktemp("catalog")
    path = tmp / "history.jsonl"
    write_history(path, builder.lines)
    analysis = add_cycles(analyse(spark, str(path), limit=2, full_dir=str(tmp / "anomalies")), limit=2,
                          full_dir=tmp / "anomalies")
    full = read_full(tmp / "anomalies")
    oracle = add_cycles(analyse_python(path, limit=2, full_dir=tmp / "anomalies-python"), limit=2,
                        full_dir=tmp / "anomalies-python")
    return {"analysis": analysis, "full": full, "by_scenario": by_scenario(full), "facts": facts,
            "builder": builder, "path": path, "oracle": oracle, "oracle_full": read_full(tmp / "anomalies-python")}


@pytest.fixture
def found(catalog):
    def get(name):
        return catalog["by_scenario"].get(name, {}), catalog["facts"][name] or {}
    return get


def test_stats_count_client_operations_and_never_completed_as_info(catalog):
    stats = catalog["analysis"].stats
    assert stats == catalog["builder"].stats()
    assert stats["by_f"]["send"]["invoked"] > stats["by_f"]["send"]["ok"] > 0
    assert [e["error"] for e in stats["heal_errors"]] == ["could not reach n2"]
    # one in never_completed_send_read, a send and a heal at the very end
    assert "3 invocation(s) never completed; counted as info" in catalog["analysis"].notes


def test_counts_examples_and_full_files_agree(catalog):
    analysis, full = catalog["analysis"], catalog["full"]
    assert set(full) == set(TYPES) | set(CYCLE_TYPES)  # one file per type, empty when none found
    for kind in TYPES + CYCLE_TYPES:
        witnesses = full[kind]
        expected = sum(w["count"] for w in witnesses) if kind == "unseen" else len(witnesses)
        assert analysis.counts.get(kind, 0) == expected
        assert analysis.examples.get(kind, []) == witnesses[:2]
        firsts = [min(w["ops"]) for w in witnesses]
        assert firsts == sorted(firsts), kind
    assert set(analysis.counts) == {kind for kind in TYPES + CYCLE_TYPES if full[kind]}
    assert json.loads(json.dumps(analysis.examples)) == analysis.examples


def test_the_python_engine_finds_exactly_what_spark_finds(catalog):
    # Every hand-written scenario above, checked by both engines: same counts, examples,
    # full witness files (line for line), stats and notes.
    spark_result, python_result = catalog["analysis"], catalog["oracle"]
    assert python_result.counts == spark_result.counts
    assert python_result.examples == spark_result.examples
    assert catalog["oracle_full"] == catalog["full"]
    assert (python_result.stats, python_result.notes) == (spark_result.stats, spark_result.notes)
    assert python_result.dependencies == spark_result.dependencies
    assert python_result.hubs == spark_result.hubs
    assert python_result.final_reads == spark_result.final_reads


def test_every_witness_of_the_catalog_is_explained_with_its_operations(catalog):
    for kind, witnesses in catalog["full"].items():
        assert kind in EXPLAINERS, f"no explanation for {kind}"
        for w in witnesses:
            text = explain(kind, w)
            assert any(f"op {o}" in text or f"operation {o}" in text for o in w["ops"]), text
