"""The queue workload's generator: a seed fixes every worker's operations; final reads start fresh
clients, read every key to the end the broker named, ask again whether it moved, and always end
with their record of how each key ended."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.nemesis.core import Schedule
from faultline.workloads.generator import Context, Seq
from faultline.workloads.queue import FinalReads, PollUnseen, QueueGenerator, settle_time

KEYS = [f"t/{i}" for i in range(4)]


def one_thread(worker: int = 0, process: int | None = None, since: float = 0.0) -> Context:
    process = worker if process is None else process
    return Context(since, frozenset([worker]), (worker,), {worker: process}, {worker: since})


def ops(seed: int, worker: int, n: int, crash_every: int = 0) -> list[dict]:
    gen = QueueGenerator.start(seed, worker, 3, KEYS, 3, rate=100)
    out = []
    for i in range(n):
        ctx = one_thread(worker)
        op, gen = gen.op(ctx)
        out.append({k: v for k, v in op.items() if k not in ("at", "process")})
        kind = "info" if crash_every and i % crash_every == crash_every - 1 else "ok"
        gen = gen.update(ctx, {**op, "type": kind, "thread": worker})
    return out


@given(seed=st.integers(0, 2**31 - 1), worker=st.integers(0, 2))
@settings(max_examples=50, deadline=None)
def test_same_seed_same_operations(seed, worker):
    assert ops(seed, worker, 200) == ops(seed, worker, 200)
    assert ops(seed, worker, 200, crash_every=7) == ops(seed, worker, 200, crash_every=7)


def test_different_seeds_or_workers_differ():
    assert ops(1, 0, 100) != ops(2, 0, 100)
    assert ops(1, 0, 100) != ops(1, 1, 100)


def test_values_are_unique_across_workers_and_every_worker_assigns_first():
    values = []
    for worker in range(3):
        stream = ops(5, worker, 500, crash_every=50)
        assert stream[0]["f"] == "assign" and stream[50]["f"] == "assign"
        values += [m["value"] for op in stream if op["f"] == "send" for m in op["mops"]]
    assert len(values) == len(set(values)) > 300
    kinds = {op["f"] for op in ops(5, 0, 500)}
    assert kinds == {"assign", "send", "poll"}


def test_an_op_not_taken_is_due_at_the_same_time_when_asked_again():
    gen = QueueGenerator.start(1, 0, 3, KEYS, 3, rate=10)
    first, _ = gen.op(Context(0.5, frozenset([0]), (0,), {0: 0}, {0: 0.5}))
    assert first["at"] > 0.5
    later = (0.5 + first["at"]) / 2  # asked again before it is due, after a completion elsewhere
    again, _ = gen.op(Context(later, frozenset([0]), (0,), {0: 0}, {0: 0.5}))
    assert first == again


def done(gen, ctx, op, kind="ok", **fields):
    """`gen` after `op` was invoked and completed with `kind` and `fields`."""
    gen = gen.update(ctx, {**op, "type": "invoke", "thread": 0})
    return gen.update(ctx, {**op, "type": kind, "thread": 0, **fields})


def test_final_reads_start_fresh_clients_read_to_the_named_ends_ask_again_and_record_how_they_ended():
    ctx = one_thread()
    gen = FinalReads(("t/0", "t/1"), seconds=30)
    op, gen = gen.op(ctx)
    assert (op["f"], op["final"]) == ("crash", True), "a new producer and consumer, as Jepsen's final polls"
    gen = done(gen, ctx, op, "info")
    ctx = one_thread(process=4)
    op, gen = gen.op(ctx)
    assert (op["f"], op["seek_to_beginning"], op["final"], op["process"]) == ("assign", True, True, 4)
    gen = done(gen, ctx, op, end_offsets={"t/0": 2, "t/1": 0})
    op, gen = gen.op(ctx)
    assert op["f"] == "poll" and op["final"]
    gen = done(gen, ctx, op, mops=[{"f": "poll", "records": [{"key": "t/0", "offset": 1, "value": 5}]}])
    op, gen = gen.op(ctx)
    assert op["f"] == "assign" and op["seek_to_beginning"] is False, "the ends are reached: ask whether they moved"
    moved = done(gen, ctx, op, end_offsets={"t/0": 3, "t/1": 0})
    assert moved.op(ctx)[0]["f"] == "poll", "an end moved: read on to it"
    same = done(gen, ctx, op, end_offsets={"t/0": 2, "t/1": 0})
    op, same = same.op(ctx)
    assert op["f"] == "final-reads" and op["final"] and "mops" not in op
    assert op["_final_reads"] == [{"key": "t/0", "end": 2, "read_to": 2, "outcome": "reached"},
                                 {"key": "t/1", "end": 0, "read_to": 0, "outcome": "reached"}]
    same = done(same, ctx, op)
    assert same.op(ctx) is None


def test_final_reads_ask_again_only_after_the_ends_have_stood_for_the_settle_time():
    # A high watermark stands still between the followers' fetches: ends asked twice within one
    # fetch wait may agree on an end that then moves (an acks=1 leader's tail).
    gen = FinalReads(("t/0",), seconds=30, fresh=True, settle=2.5)
    ctx = one_thread(since=10.0)
    op, gen = gen.op(ctx)
    assert op["f"] == "assign" and op["at"] == 10.0, "the first assign is not held back"
    gen = done(gen, ctx, op, end_offsets={"t/0": 1})
    op, gen = gen.op(one_thread(since=10.1))
    gen = done(gen, one_thread(since=10.3), op, mops=[{"f": "poll", "records": [{"key": "t/0", "offset": 0,
                                                                              "value": 5}]}])
    op, gen = gen.op(one_thread(since=10.3))
    assert (op["f"], op["seek_to_beginning"], op["at"]) == ("assign", False, 12.5), "2.5 s after the ends were learned"
    moved = done(gen, one_thread(since=12.6), op, end_offsets={"t/0": 2})
    op, moved = moved.op(one_thread(since=12.6))
    moved = done(moved, one_thread(since=12.7), op, mops=[{"f": "poll", "records": [{"key": "t/0", "offset": 1,
                                                                                  "value": 6}]}])
    op, _ = moved.op(one_thread(since=12.7))
    assert (op["f"], op["at"]) == ("assign", 15.1), "moved ends stand their own settle time"
    # A slow poll that outlasts the settle time is not held back further.
    slow = done(gen, one_thread(since=20.0), {"f": "poll", "mops": [{"f": "poll"}], "final": True})
    assert slow.op(one_thread(since=20.0))[0]["at"] == 20.0
    assert settle_time({}) == 1.5 and settle_time({"replica.fetch.wait.max.ms": "2000"}) == 3.0


def test_final_reads_that_run_out_of_time_record_where_they_got_and_which_keys_were_unavailable():
    gen = FinalReads(("t/0", "t/1", "t/2"), seconds=10)
    op, gen = gen.op(one_thread(since=5.0))
    gen = done(gen, one_thread(), op, "info")
    ctx = one_thread(process=4, since=6.0)
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, end_offsets={"t/0": 4, "t/1": 3}, unavailable={"t/2": "the end offset is unknown"})
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, mops=[{"f": "poll", "records": [{"key": "t/0", "offset": o, "value": o}
                                                            for o in range(4)]}])
    assert gen.op(one_thread(process=4, since=14.0))[0]["f"] == "poll", "before the deadline: read on"
    # 10 s after the reader was first asked (at 5 s), whatever it was doing, it records.
    op, gen = gen.op(one_thread(process=4, since=15.2))
    assert op["f"] == "final-reads" and op["at"] == 15.2
    assert op["_final_reads"] == [{"key": "t/0", "end": 4, "read_to": 4, "outcome": "reached"},
                                 {"key": "t/1", "end": 3, "read_to": 0, "outcome": "timeout"},
                                 {"key": "t/2", "end": None, "read_to": 0, "outcome": "unavailable"}]


def test_a_final_reader_waiting_to_ask_again_records_at_its_deadline():
    ctx = one_thread()
    gen = FinalReads(("t/0",), seconds=1)
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, "info")
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, "fail", error="Local: Broker transport failure")
    for _ in range(5):  # each failed assign doubles the wait before the next, up to 2 s
        op, gen = gen.op(ctx)
        if op["f"] != "assign":
            break
        gen = done(gen, ctx, op, "fail", error="Local: Broker transport failure")
    assert op["f"] == "final-reads" and op["at"] == 1.0, "the wait would end after the deadline"
    assert op["_final_reads"] == [{"key": "t/0", "end": None, "read_to": 0, "outcome": "unavailable"}]


def test_after_a_failed_heal_the_final_readers_read_nothing_and_say_so():
    op, gen = FinalReads(("t/0", "t/1"), seconds=30, unread="the heal did not succeed").op(one_thread())
    assert op["f"] == "final-reads"
    assert [r["outcome"] for r in op["_final_reads"]] == ["unavailable", "unavailable"]
    assert done(gen, one_thread(), op).op(one_thread()) is None


def test_final_reads_start_over_after_a_crash():
    ctx = one_thread()
    op, gen = FinalReads(("t/0",)).op(ctx)
    gen = done(gen, ctx, op, "info")
    op, gen = gen.op(one_thread(process=4))
    gen = done(gen, ctx, op, end_offsets={"t/0": 4})
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, "info")
    op, _ = gen.op(one_thread(process=8))
    assert (op["f"], op["seek_to_beginning"], op["process"]) == ("assign", True, 8), "no second crash: a new client"


def test_nemesis_schedule_replays_and_alternates_fault_and_repair():
    def run(seed):
        return [(op, round(delay, 9)) for op, delay in Schedule(seed, [("kill", "start"), ("pause", "resume")], 5).ops(20)]

    assert run(9) == run(9) and run(9) != run(10)
    fs = [op["f"] for op, _ in run(9)]
    for fault, repair in zip(fs[::2], fs[1::2]):
        assert (fault, repair) in (("kill", "start"), ("pause", "resume"))


def txn_ops(seed: int, worker: int, n: int) -> list[dict]:
    gen = QueueGenerator.start(seed, worker, 3, KEYS, 3, rate=100, txn=True)
    out = []
    for _ in range(n):
        ctx = one_thread(worker)
        op, gen = gen.op(ctx)
        out.append({k: v for k, v in op.items() if k not in ("at", "process")})
        gen = gen.update(ctx, {**op, "type": "ok", "thread": worker})
    return out


@given(seed=st.integers(0, 2**31 - 1), worker=st.integers(0, 2))
@settings(max_examples=30, deadline=None)
def test_the_transactional_stream_replays_and_each_transaction_mixes_one_to_four_sends_and_polls(seed, worker):
    stream = txn_ops(seed, worker, 150)
    assert stream == txn_ops(seed, worker, 150)
    assert stream[0]["f"] == "assign"
    assert {op["f"] for op in stream} <= {"assign", "txn"}
    for op in stream:
        if op["f"] == "txn":
            assert 1 <= len(op["mops"]) <= 4
            assert all(m == {"f": "poll"} or (m["f"] == "send" and set(m) == {"f", "key", "value"})
                       for m in op["mops"])
    values = [m["value"] for op in stream if op["f"] == "txn" for m in op["mops"] if m["f"] == "send"]
    assert len(values) == len(set(values)) and all(v % 3 == worker for v in values)


def test_transactions_mix_sends_and_polls_across_a_stream():
    mops = [tuple(sorted({m["f"] for m in op["mops"]})) for op in txn_ops(7, 0, 400) if op["f"] == "txn"]
    assert {("send",), ("poll",), ("poll", "send")} <= set(mops)


def test_a_final_poll_that_found_a_key_end_past_what_it_returned_reaches_it():
    # Under read_committed a log ends in a transaction marker no consumer returns: the consumer's
    # partition end (the poll's positions) is what tells the final reader it got there.
    ctx = one_thread(process=4)
    gen = FinalReads(("t/0",), seconds=30, fresh=True)
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, end_offsets={"t/0": 4})
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, mops=[{"f": "poll", "records": [{"key": "t/0", "offset": 2, "value": 5}]}])
    op, _ = gen.op(ctx)
    assert op["f"] == "poll", "read to 3 of 4: poll on"
    gen = done(gen, ctx, op, mops=[{"f": "poll", "records": []}], positions={"t/0": 4})
    op, gen = gen.op(ctx)
    assert op["f"] == "assign" and op["seek_to_beginning"] is False
    gen = done(gen, ctx, op, end_offsets={"t/0": 4})
    op, gen = gen.op(ctx)
    assert op["_final_reads"] == [{"key": "t/0", "end": 4, "read_to": 4, "outcome": "reached"}]


def test_a_subscribing_stream_subscribes_first_and_after_each_crash_and_ends_processes_now_and_then():
    gen = QueueGenerator.start(9, 1, 3, KEYS, 3, rate=100, subscribe=True)
    stream = []
    for _ in range(600):
        ctx = one_thread(1)
        op, gen = gen.op(ctx)
        stream.append(op)
        gen = gen.update(ctx, {**op, "type": "info" if op["f"] == "crash" else "ok", "thread": 1})
    fs = [op["f"] for op in stream]
    assert fs[0] == "subscribe" and "assign" not in fs
    assert {"send", "poll", "crash"} <= set(fs)
    # A crash ends the process; its successor joins the group before anything else.
    assert all(fs[i + 1] == "subscribe" for i, f in enumerate(fs[:-1]) if f == "crash")
    assert 3 <= fs.count("crash") <= 30


def consume_ops(seed: int, mode: str, n: int, kill_at: int | None = None) -> list[dict]:
    from faultline.workloads.consume import ConsumeGenerator

    gen = ConsumeGenerator.start(seed, 0, 3, KEYS, 3, rate=100, mode=mode)
    out = []
    for i in range(n):
        ctx = one_thread(0)
        op, gen = gen.op(ctx)
        out.append({k: v for k, v in op.items() if k not in ("at", "process")})
        gen = gen.update(ctx, {**op, "type": "info" if i == kill_at else "ok", "thread": 0})
    return out


@given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(["auto", "after", "before"]))
@settings(max_examples=30, deadline=None)
def test_a_consumer_subscribes_then_polls_processes_and_commits_in_its_modes_order(seed, mode):
    from faultline.workloads.consume import CYCLES

    stream = consume_ops(seed, mode, 120, kill_at=60)
    assert stream == consume_ops(seed, mode, 120, kill_at=60)
    assert stream[0] == {"f": "subscribe", "keys": KEYS} and stream[61]["f"] == "subscribe"
    for part in (stream[1:61], stream[62:]):
        steps = [op["f"] for op in part if op["f"] != "send"]
        # A new member starts its cycle over.
        assert steps == [CYCLES[mode][i % len(CYCLES[mode])] for i in range(len(steps))]


def test_a_group_s_final_reader_asks_its_committed_offsets_once_before_it_reads():
    gen = FinalReads(("t/0",), seconds=30, committed=True)
    ctx = one_thread()
    op, gen = gen.op(ctx)
    gen = done(gen, ctx, op, "info")
    op, gen = gen.op(ctx)
    assert (op["f"], op["final"]) == ("committed", True)
    gen = done(gen, ctx, op, offsets={"t/0": 3})
    op, gen = gen.op(ctx)
    assert op["f"] == "assign" and op["seek_to_beginning"] is True


@given(seed=st.integers(0, 2**31 - 1), acked=st.integers(0, 3))
@settings(max_examples=30, deadline=None)
def test_a_resending_worker_sends_what_an_info_send_left_unacknowledged_first_in_its_next_process(seed, acked):
    gen = QueueGenerator.start(seed, 1, 3, KEYS, 3, rate=100, resend=True)
    ctx = one_thread(1)
    op, gen = gen.op(ctx)
    assert op["f"] == "assign"
    gen = done(gen, ctx, op)
    op, gen = gen.op(ctx)
    mops = [{"f": "send", "key": k, "value": v} for k, v in [("t/0", 1001), ("t/1", 1004), ("t/0", 1007)]]
    # The broker acknowledged the first `acked` values before the producer died with the rest.
    gen = done(gen, ctx, {**op, "f": "send", "mops": mops}, "info",
               mops=[{**m, "offset": i if i < acked else None} for i, m in enumerate(mops)])
    ctx = one_thread(1, process=4)
    op, gen = gen.op(ctx)
    assert op["f"] == "assign" and op["process"] == 4
    gen = done(gen, ctx, op)
    op, gen = gen.op(ctx)
    if acked < 3:
        assert (op["f"], op["mops"]) == ("send", mops[acked:])
        gen = done(gen, ctx, op, mops=[{**m, "offset": 9} for m in op["mops"]])
        op, gen = gen.op(ctx)
    # Then on as before: new values only.
    assert op["f"] != "send" or all(m["value"] < 1000 for m in op["mops"])


@pytest.mark.parametrize("latency, mean_gap", [(0.02, 0.1), (0.3, 0.3)])
def test_a_worker_keeps_the_asked_rate_while_its_operations_are_quicker_than_it(latency, mean_gap):
    # 3 workers at 30 ops/s: one operation every 0.1 s each, on average. Operations that take
    # 20 ms keep that rate (they do not add to the gaps); operations that take 0.3 s go back to
    # back, and a worker never bursts to make up for the time they took.
    gen = QueueGenerator.start(7, 0, 3, KEYS, 3, rate=30)
    free_at, starts = 0.0, []
    for _ in range(2000):
        op, gen = gen.op(Context(free_at, frozenset([0]), (0,), {0: 0}, {0: free_at}))
        start = max(op["at"], free_at)
        starts.append(start)
        free_at = start + latency
        gen = done(gen, Context(free_at, frozenset([0]), (0,), {0: 0}, {0: free_at}), op)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(mean_gap, rel=0.05)
    assert min(gaps) >= latency - 1e-9


def steered(seed: int, events: list[dict], n: int = 60, final: bool = False, keys=("t/0",)) -> list[dict]:
    """The next `n` assigns of `keys` a poll-unseen generator gives after `events` completed."""
    ctx = one_thread()
    gen = PollUnseen.around(Seq.of([{"f": "assign", "keys": list(keys), **({"final": True} if final else {})}] * n),
                            seed)
    for event in events:
        gen = done(gen, ctx, event, event["type"])
    out = []
    for _ in range(n):
        op, gen = gen.op(ctx)
        out.append({k: v for k, v in op.items() if k not in ("at", "process")})
    return out


def send(kind, f="send", **offsets):
    return {"f": f, "type": kind, "mops": [{"f": "send", "key": f"t/{k[1:]}", "value": 1, "offset": o}
                                           for k, o in offsets.items()]}


def poll(kind="ok", **offsets):
    return {"f": "poll", "type": kind,
            "mops": [{"f": "poll", "records": [{"key": f"t/{k[1:]}", "offset": o, "value": 1}
                                               for k, o in offsets.items()]}]}


# Acknowledged: t/1 to 4 (ok send), t/3 to 7 (an info send's acknowledged message); not: t/2 (no
# offset), t/0's 9 (a transaction that aborted). Polled: t/1 to 2.
EVENTS = [send("ok", k1=4, k2=None), send("info", k3=7), send("fail", f="txn", k0=9), poll(k1=2)]
UNSEEN = {"t/1": {"polled": 2, "sent": 4}, "t/3": {"polled": -1, "sent": 7}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_about_a_third_of_assigns_also_take_the_keys_with_acknowledged_values_no_poll_returned(seed):
    ops_ = steered(seed, EVENTS)
    assert ops_ == steered(seed, EVENTS), "the same completions give the same invocations"
    plain = {"f": "assign", "keys": ["t/0"]}
    steer = {"f": "assign", "keys": ["t/0", "t/1", "t/3"], "unseen": UNSEEN}
    assert all(op in (plain, steer) for op in ops_), ops_
    assert 10 <= ops_.count(steer) <= 30, ops_.count(steer)
    # Once polls return those offsets (records of a failed poll were read too), nothing is unseen.
    assert steered(seed, EVENTS + [poll("fail", k1=4), poll(k3=7)]) == [plain] * 60
    # The final reads assign every key themselves.
    assert {tuple(op["keys"]) for op in steered(seed, EVENTS, final=True)} == {("t/0",)}
    # `unseen` names only the keys added: the keys the worker drew are the rest.
    drew = ("t/1",)
    assert {(tuple(op["keys"]), tuple(op.get("unseen", ()))) for op in steered(seed, EVENTS, keys=drew)} == {
        (drew, ()), (("t/1", "t/3"), ("t/3",))}
    assert steered(seed, EVENTS, keys=("t/1", "t/3")) == [{"f": "assign", "keys": ["t/1", "t/3"]}] * 60
