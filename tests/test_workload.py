"""The queue workload's generator: a seed fixes every worker's operations; final reads read every
key to the end the broker named, and ask again whether it moved."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.nemesis.core import Schedule
from faultline.workloads.generator import Context
from faultline.workloads.queue import FinalReads, QueueGenerator

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


def test_final_reads_poll_to_the_named_ends_then_ask_again_and_stop_when_they_did_not_move():
    ctx = one_thread()
    gen = FinalReads(("t/0", "t/1"))
    op, gen = gen.op(ctx)
    assert (op["f"], op["seek_to_beginning"], op["final"]) == ("assign", True, True)
    gen = gen.update(ctx, {**op, "type": "ok", "thread": 0, "end_offsets": {"t/0": 2, "t/1": 0}})
    op, gen = gen.op(ctx)
    assert op["f"] == "poll"
    gen = gen.update(ctx, {**op, "type": "ok", "thread": 0,
                           "mops": [{"f": "poll", "records": [{"key": "t/0", "offset": 1, "value": 5}]}]})
    op, gen = gen.op(ctx)
    assert op["f"] == "assign" and op["seek_to_beginning"] is False, "the ends are reached: ask whether they moved"
    moved = gen.update(ctx, {**op, "type": "ok", "thread": 0, "end_offsets": {"t/0": 3, "t/1": 0}})
    assert moved.op(ctx)[0]["f"] == "poll", "an end moved: read on to it"
    same = gen.update(ctx, {**op, "type": "ok", "thread": 0, "end_offsets": {"t/0": 2, "t/1": 0}})
    assert same.op(ctx) is None


def test_final_reads_start_over_after_a_crash():
    ctx = one_thread()
    op, gen = FinalReads(("t/0",)).op(ctx)
    gen = gen.update(ctx, {**op, "type": "ok", "thread": 0, "end_offsets": {"t/0": 4}})
    op, gen = gen.op(ctx)
    gen = gen.update(ctx, {**op, "type": "info", "thread": 0})
    op, _ = gen.op(one_thread(process=4))
    assert (op["f"], op["seek_to_beginning"], op["process"]) == ("assign", True, 4)


def test_nemesis_schedule_replays_and_alternates_fault_and_repair():
    def run(seed):
        return [(op, round(delay, 9)) for op, delay in Schedule(seed, [("kill", "start"), ("pause", "resume")], 5).ops(20)]

    assert run(9) == run(9) and run(9) != run(10)
    fs = [op["f"] for op, _ in run(9)]
    for fault, repair in zip(fs[::2], fs[1::2]):
        assert (fault, repair) in (("kill", "start"), ("pause", "resume"))
