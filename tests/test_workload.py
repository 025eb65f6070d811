"""The queue workload's generator: a seed fixes every worker's operations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.nemesis.core import Schedule
from faultline.workloads.queue import QueueGenerator

KEYS = [f"t/{i}" for i in range(4)]


def ops(seed: int, worker: int, n: int, crash_every: int = 0) -> list[dict]:
    gen = QueueGenerator(seed, worker, 3, KEYS, 3)
    out = []
    for i in range(n):
        out.append(gen.next_op())
        gen.delay(100)
        if crash_every and i % crash_every == crash_every - 1:
            gen.crashed()
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


def test_nemesis_schedule_replays_and_alternates_fault_and_repair():
    def run(seed):
        s = Schedule(seed, [("kill", "start"), ("pause", "resume")], 5)
        return [(s.next_op(), round(s.delay(), 9)) for _ in range(20)]

    assert run(9) == run(9) and run(9) != run(10)
    fs = [op["f"] for op, _ in run(9)]
    for fault, repair in zip(fs[::2], fs[1::2]):
        assert (fault, repair) in (("kill", "start"), ("pause", "resume"))
