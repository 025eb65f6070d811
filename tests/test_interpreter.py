"""A test is a map of small parts: the runner drives any db, workload and nemesis through the
interpreter's main, heal and final phases, and the generator combinators compose as values.

The db, workload client and nemesis here are small fakes defined in this file, so that what is
tested is the runner and the interpreter alone; every end-to-end test uses the real parts."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from faultline.db.core import DB, Unsupported
from faultline.models.history import HistoryWriter, read_history
from faultline.models.spec import TestSpec
from faultline.nemesis.core import Schedule
from faultline.runner.interpreter import HarnessError, Interpreter
from faultline.runner.run import execute
from faultline.runner.testmap import Test, generator_of
from faultline.workloads.core import Workload
from faultline.workloads.generator import (PENDING, Context, EachThread, Fn, Mix, Once, Phases, Seq, Stagger,
                                           TimeLimit, UntilOk, any_, clients, each_op, nemesis, rng_state)


class FakeDB(DB):
    """Records what the runner asks of it."""

    def __init__(self):
        self.nodes, self.support_nodes = ["n1", "n2"], []
        self.calls: list[str] = []

    @property
    def bootstrap(self):
        return "fake:9092"

    def setup(self):
        self.calls.append("setup")

    def teardown(self, store_dir):
        self.calls.append("teardown")

    def create_topics(self, topics, partitions, replication_factor):
        self.calls.append(f"create_topics {topics} {partitions}")

    def start(self, node):
        return 1

    def wait_ready(self, node, timeout=30):
        pass

    def kill(self, node):
        return 1

    def stop(self, node):
        return 0

    def pause(self, node):
        pass

    def resume(self, node):
        pass

    def running(self, node):
        return True

    def leader(self, topic, partition):
        return "n1"

    def controller(self):
        return "n1"


class FakeClient:
    """Sends are acknowledged at increasing offsets of one shared log; every third send of
    process 1 times out (info), so the runner must renumber that process."""

    log: list[int] = []
    lock = threading.Lock()

    def __init__(self, bootstrap, process):
        self.bootstrap, self.process, self.sent = bootstrap, process, 0
        self.opened = self.closed = False

    def open(self):
        self.opened = True

    def close(self):
        self.closed = True

    def invoke(self, op):
        assert self.opened and not self.closed
        if op["f"] == "send":
            self.sent += 1
            if self.process == 1 and self.sent % 3 == 0:
                return {"type": "info", "error": "timed out"}
            with self.lock:
                self.log.append(op["mops"][0]["value"])
                offset = len(self.log) - 1
            return {"type": "ok", "mops": [dict(op["mops"][0], offset=offset)]}
        if op["f"] == "poll":
            with self.lock:
                records = [{"key": "t/0", "offset": i, "value": v} for i, v in enumerate(self.log)]
            return {"type": "ok", "mops": [{"f": "poll", "records": records}]}
        raise AssertionError(op)


class FakeNemesis:
    fs = ("break", "fix")

    def __init__(self):
        self.broken = 0

    def invoke(self, op):
        self.broken += 1 if op["f"] == "break" else -1
        return {"broken": self.broken}

    def heal(self):
        self.broken = 0
        return {"broken": 0}


def fake_workload(spec: TestSpec) -> Workload:
    def sends(thread):
        counter = iter(range(10**9))
        return Fn(lambda ctx: {"f": "send", "mops": [{"f": "send", "key": "t/0",
                                                      "value": next(counter) * spec.concurrency + thread}],
                               "at": ctx.since(thread) + 0.01})

    return Workload("fake", EachThread(sends),
                    EachThread(lambda thread: Once({"f": "poll", "mops": [{"f": "poll"}], "final": True})),
                    FakeClient)


def test_the_runner_drives_any_test_map_through_main_heal_and_final_phases(tmp_path: Path):
    FakeClient.log = []
    spec = TestSpec(seed=1, time_limit=1.5, final_time_limit=5, concurrency=3, nemesis_interval=0.2)
    db, nem = FakeDB(), FakeNemesis()
    workload = fake_workload(spec)
    test = Test(spec, db, workload, {"break": nem, "fix": nem},
                generator_of(spec, workload, Schedule(spec.seed, [("break", "fix")], spec.nemesis_interval)))
    history = HistoryWriter(tmp_path / "history.jsonl")
    seen = []
    execute(test, history, tmp_path, seen.append)
    history.close()
    ops = read_history(tmp_path / "history.jsonl").ops

    assert db.calls == ["setup", "create_topics ['faultline-0'] 3", "teardown"]
    assert len(seen) == 1 and seen[0].phase == "final"
    heal = [o for o in ops if o["f"] == "heal"]
    assert [o["type"] for o in heal] == ["invoke", "info"] and heal[1]["value"] == {"FakeNemesis": {"broken": 0}}
    heal_at = heal[0]["index"]
    before, after = ops[:heal_at], ops[heal_at + 2:]
    assert {o["f"] for o in before} == {"send", "break", "fix"}, "main phase: client sends and faults"
    assert all(o["f"] == "poll" and o["final"] for o in after), "final phase: final reads only"
    assert len([o for o in after if o["type"] == "invoke"]) == 3, "one final read on each client thread"
    faults = [o["f"] for o in before if o["process"] == "nemesis" and o["type"] == "invoke"]
    assert faults[:4] == ["break", "fix", "break", "fix"]
    assert all(o["time"] <= 1.7e9 for o in before if o["type"] == "invoke"), "nothing starts after the time limit"
    # Every invocation completes, in one process at a time; an info retires its process.
    open_ops = {}
    for o in ops:
        if o["type"] == "invoke":
            assert o["process"] not in open_ops
            open_ops[o["process"]] = o
        else:
            assert open_ops.pop(o["process"])["f"] == o["f"]
    assert not open_ops
    infos = [o for o in ops if o["type"] == "info" and o["process"] != "nemesis"]
    assert infos and {o["process"] for o in infos} == {1}
    assert {o["process"] for o in ops if o["process"] != "nemesis"} == {0, 1, 2, 4}
    final_values = [r["value"] for r in after[-1]["mops"][0]["records"]]
    acked = [m["value"] for o in before if o["type"] == "ok" and o["f"] == "send" for m in o["mops"]]
    assert sorted(final_values) == sorted(acked)


def test_a_client_that_cannot_open_stops_the_run_and_says_which_worker():
    class Broken(FakeClient):
        def open(self):
            raise OSError("no such broker")

    gen = clients(TimeLimit(1, EachThread(lambda t: Once({"f": "send", "mops": [{"f": "send", "key": "t/0",
                                                                              "value": t}]}))))

    class Sink:
        counts = {}

        def append(self, op):
            return dict(op, index=0, time=0)

    with pytest.raises(HarnessError, match="worker 0 failed: send by process 0 .*raised OSError: no such broker"):
        Interpreter(gen, 1, lambda process: Broken("x", process), Sink()).run()


def ctx_of(threads=(0, 1), free=None, time=0.0) -> Context:
    free = frozenset(threads if free is None else free)
    return Context(time, free, tuple(threads), {t: t for t in threads}, {t: time for t in free})


def test_phases_wait_until_every_thread_is_free_before_the_next_starts():
    gen = Phases((Seq.of([{"f": "a"}]), Seq.of([{"f": "b"}])), names=("one", "two"))
    op, gen = gen.op(ctx_of())
    assert op["f"] == "a" and gen.phase == "one"
    assert gen.op(ctx_of(free=[1])) is PENDING, "thread 0 still runs phase one"
    op, gen = gen.op(ctx_of())
    assert op["f"] == "b" and gen.phase == "two"
    assert gen.op(ctx_of()) is None


def test_time_limit_stagger_and_mix_are_values_that_replay():
    def ops():
        gen = TimeLimit(10, Stagger(1.0, Mix((Fn(lambda c: {"f": "x"}), Fn(lambda c: {"f": "y"})), rng_state(3)),
                                    rng_state(4)))
        return each_op(gen, ctx_of(), 1000)

    first = ops()
    assert first == ops()
    assert {o["f"] for o in first} == {"x", "y"}
    assert all(o["at"] < 10 for o in first) and 4 < len(first) < 20, "mean gap 1 s over 10 s"
    assert [o["at"] for o in first] == sorted(o["at"] for o in first)


def test_until_ok_stops_after_the_first_ok_completion_of_its_own_ops():
    gen = UntilOk(Fn(lambda c: {"f": "try"}))
    ctx = ctx_of(threads=(0,))
    op, gen = gen.op(ctx)
    gen = gen.update(ctx, {**op, "type": "invoke", "thread": 0})
    gen = gen.update(ctx, {**op, "type": "fail", "thread": 0})
    op, gen = gen.op(ctx)
    gen = gen.update(ctx, {**op, "type": "invoke", "thread": 0})
    gen = gen.update(ctx, {**op, "type": "ok", "thread": 0})
    assert gen.op(ctx) is None


def test_clients_and_nemesis_keep_their_ops_to_their_threads():
    threads = (0, "nemesis")
    gen = any_(clients(Fn(lambda c: {"f": "send"})), nemesis(Seq.of([{"f": "kill"}])))

    def first(free):
        answer = gen.op(Context(0.0, frozenset(free), threads, {0: 0, "nemesis": "nemesis"}, {}))
        return answer if answer is PENDING else (answer[0]["f"], answer[0]["process"])

    assert first([0]) == ("send", 0)
    assert first(["nemesis"]) == ("kill", "nemesis")
    assert first([]) is PENDING


def test_a_db_without_a_capability_says_so():
    with pytest.raises(Unsupported, match="cannot cut the power"):
        FakeDB().power_off("n1")


def test_a_time_limit_starts_when_its_threads_became_free_not_when_its_op_is_finally_taken():
    # The nemesis's first fault is due at 8 s; the interpreter asks again and again before then
    # (client completions wake it). The limit must still end 10 s after the phase began.
    gen = TimeLimit(10, Fn(lambda c: {"f": "kill", "at": 8.0}))
    for now in (0.0, 3.0, 7.9):
        ctx = Context(now, frozenset(["nemesis"]), ("nemesis",), {"nemesis": "nemesis"}, {"nemesis": 0.0})
        op, after = gen.op(ctx)
    assert op["at"] == 8.0 and after.deadline == 10.0


def test_an_operation_stuck_in_its_client_is_abandoned_as_indeterminate_and_the_thread_goes_on():
    release = threading.Event()

    class Stuck(FakeClient):
        def invoke(self, op):
            if self.process == 0:
                release.wait(30)  # a client library call that does not return
            return {"type": "ok", "mops": [dict(op["mops"][0], offset=self.process)]}

    class Sink:
        counts = {}

        def __init__(self):
            self.lines = []

        def append(self, op):
            self.lines.append(dict(op, index=len(self.lines), time=0))
            return self.lines[-1]

    sends = EachThread(lambda t: Seq.of([{"f": "send", "mops": [{"f": "send", "key": "t/0", "value": 10 * n + t}]}
                                         for n in range(2)]))
    sink = Sink()
    interpreter = Interpreter(clients(sends), 1, lambda process: Stuck("x", process), sink)
    interpreter.op_timeout[0] = 0.3
    try:
        interpreter.run()
    finally:
        release.set()
    assert [(o["process"], o["type"]) for o in sink.lines] == [(0, "invoke"), (0, "info"), (1, "invoke"), (1, "ok")]
    assert sink.lines[1]["error"] == "no completion within 0.3s: the call was abandoned"
