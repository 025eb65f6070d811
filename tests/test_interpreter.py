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
    # The client invocations of each phase, and the span over which they came (the achieved rate).
    invoked = seen[0].invoked
    clients_in = {"main": [o for o in before if o["type"] == "invoke" and o["process"] != "nemesis"],
                  "final": [o for o in after if o["type"] == "invoke"]}
    assert invoked.count == {phase: len(ops) for phase, ops in clients_in.items()}
    span = invoked.last["main"] - invoked.first["main"]
    assert span == pytest.approx((clients_in["main"][-1]["time"] - clients_in["main"][0]["time"]) / 1e9, abs=0.05)
    assert invoked.rate("main") == pytest.approx(len(clients_in["main"]) / span)
    assert invoked.rate("heal") is None


def one_send_each():
    """Each client thread sends once, within a second."""
    return clients(TimeLimit(1, EachThread(lambda t: Once({"f": "send", "mops": [{"f": "send", "key": "t/0",
                                                                                "value": t}]}))))


class Sink:
    """A history that records nothing."""

    counts = {}

    def append(self, op):
        return dict(op, index=0, time=0)


def test_a_client_that_cannot_open_stops_the_run_and_says_which_worker():
    class Broken(FakeClient):
        def open(self):
            raise OSError("no such broker")


    with pytest.raises(HarnessError, match="worker 0 failed: send by process 0 .*raised OSError: no such broker"):
        Interpreter(one_send_each(), 1, lambda process: Broken("x", process), Sink()).run()



def test_a_client_whose_close_fails_after_an_info_stops_the_run_instead_of_losing_its_worker():
    class FailsToClose(FakeClient):
        def invoke(self, op):
            return {"type": "info", "error": "timed out"}

        def close(self):
            raise RuntimeError("the producer is fenced")


    with pytest.raises(HarnessError, match="worker 0 failed: send by process 0 .*raised RuntimeError: the producer"):
        Interpreter(one_send_each(), 1, lambda process: FailsToClose("x", process), Sink()).run()

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


class FinalClient(FakeClient):
    """Answers the final reader's operations: every key ends at offset 3, and `polls` records of
    t/0 are read one per poll (fewer than 3: the reader runs out of time)."""

    polls = 3

    def invoke(self, op):
        if op["f"] == "crash":
            return {"type": "info", "error": "crashed on purpose"}
        if op["f"] == "final-reads":
            return {"type": "ok", "final_reads": op["_final_reads"]}
        if op["f"] == "assign":
            self.read = 0
            return {"type": "ok", "end_offsets": {k: 3 for k in op["keys"]}}
        if op["f"] == "poll":
            records = []
            if self.read < self.polls:
                records = [{"key": "t/0", "offset": self.read, "value": self.read}]
                self.read += 1
            return {"type": "ok", "mops": [{"f": "poll", "records": records}]}
        return super().invoke(op)


class Stubborn:
    """A nemesis whose fault does nothing and whose repair takes `seconds`, then fails on `broken`
    nodes (through the real repair helpers)."""

    fs = ("stub", "unstub")

    def __init__(self, seconds=0.0, broken=()):
        self.seconds, self.broken, self.healed = seconds, set(broken), 0

    def invoke(self, op):
        return self.heal() if op["f"] == "unstub" else {"nodes": []}

    def heal(self):
        import time

        from faultline.nemesis.core import finish, repair_each

        time.sleep(self.seconds)
        self.healed += 1

        def fix(node):
            if node in self.broken:
                raise RuntimeError(f"the broker on {node} exited")

        outcomes, _ = repair_each(["n1", "n2"], fix)
        return finish({"outcomes": outcomes})


def final_workload(spec: TestSpec, seconds: float) -> Workload:
    from faultline.workloads.queue import FinalReads

    keys = ("t/0", "t/1")
    return Workload("fake", EachThread(lambda thread: Seq.of([])),
                    EachThread(lambda thread: FinalReads(keys, seconds)), FinalClient,
                    final_unhealed=lambda why: EachThread(lambda thread: FinalReads(keys, seconds, unread=why)))


def run_map(tmp_path, spec, workload, nemeses) -> list[dict]:
    test = Test(spec, FakeDB(), workload, {f: n for n in nemeses for f in n.fs},
                generator_of(spec, workload, Schedule(spec.seed, [("stub", "unstub")], 0.05)))
    history = HistoryWriter(tmp_path / "history.jsonl")
    execute(test, history, tmp_path)
    history.close()
    return read_history(tmp_path / "history.jsonl").ops


def test_every_repair_runs_and_records_its_nodes_and_after_a_failed_heal_nothing_is_read(tmp_path):
    spec = TestSpec(seed=1, time_limit=0.3, final_time_limit=5, concurrency=2, nemesis_interval=0.05)
    broken, fine = Stubborn(broken={"n2"}), Stubborn()

    class Other(Stubborn):  # a second nemesis of its own class, healed after the one that fails
        fs = ("other", "unother")

    other = Other()
    ops = run_map(tmp_path, spec, final_workload(spec, 5), [broken, other])
    heal = [o for o in ops if o["f"] == "heal"][-1]
    assert heal["type"] == "info"
    assert heal["value"]["Stubborn"] == {"outcomes": {"n1": "healed", "n2": "n2: RuntimeError: the broker on n2 "
                                                                            "exited"}}
    assert heal["value"]["Other"] == {"outcomes": {"n1": "healed", "n2": "healed"}}, "run after the one that failed"
    assert heal["error"] == "Stubborn: n2: RuntimeError: the broker on n2 exited"
    after = ops[heal["index"] + 1:]
    assert {o["f"] for o in after} == {"final-reads"}, "nothing is read from a cluster that was not healed"
    records = [o for o in after if o["type"] == "ok"]
    assert len(records) == spec.concurrency
    assert all(o["final_reads"] == [{"key": k, "end": None, "read_to": 0, "outcome": "unavailable"}
                                    for k in ("t/0", "t/1")] for o in records)


def test_the_final_reads_run_after_the_heal_and_record_how_far_they_got_when_their_time_runs_out(tmp_path):
    spec = TestSpec(seed=1, time_limit=0.3, final_time_limit=1.0, concurrency=2, nemesis_interval=0.05)
    slow = Stubborn(seconds=1.5)  # longer than the final time limit: it must not eat into it
    FinalClient.polls = 2
    ops = run_map(tmp_path, spec, final_workload(spec, spec.final_time_limit), [slow])
    heal = [o for o in ops if o["f"] == "heal"][-1]
    assert "error" not in heal and heal["value"] == {"Stubborn": {"outcomes": {"n1": "healed", "n2": "healed"}}}
    after = ops[heal["index"] + 1:]
    crashes = [o for o in after if o["f"] == "crash" and o["type"] == "info"]
    assert len(crashes) == spec.concurrency, "each final reader starts a fresh client"
    polls = [o for o in after if o["f"] == "poll" and o["type"] == "ok"]
    assert polls and all(o["process"] >= spec.concurrency for o in polls)
    records = [o for o in after if o["f"] == "final-reads" and o["type"] == "ok"]
    assert len(records) == spec.concurrency
    assert not [o for o in after if o["type"] == "invoke" and {"final_reads", "_final_reads"} & set(o)], \
        "the record is on the completion only"
    for record in records:
        assert record["final_reads"] == [{"key": "t/0", "end": 3, "read_to": 2, "outcome": "timeout"},
                                         {"key": "t/1", "end": 3, "read_to": 0, "outcome": "timeout"}]
        started = heal["time"] / 1e9
        assert started + 0.9 < record["time"] / 1e9 < started + 2.0, "the time limit runs from the heal's end"


def test_a_phase_made_from_the_one_before_starts_its_time_limit_when_its_last_thread_became_free():
    gen = Phases((clients(Seq.of([{"f": "a"}])), nemesis(Seq.of([{"f": "heal"}])),
                  lambda heal: clients(TimeLimit(1.0, Fn(lambda c: {"f": "b"})))))
    threads, processes = (0, "nemesis"), {0: 0, "nemesis": "nemesis"}
    op, gen = gen.op(Context(0.0, frozenset(threads), threads, processes, {0: 0.0, "nemesis": 0.0}))
    gen = gen.update(Context(0.0, frozenset(["nemesis"]), threads, processes, {"nemesis": 0.0}),
                     {**op, "type": "invoke", "thread": 0})
    op, gen = gen.op(Context(0.5, frozenset(threads), threads, processes, {0: 0.5, "nemesis": 0.0}))
    assert op["f"] == "heal"
    # The heal took until 10 s; the client thread has been free since 0.5 s.
    op, _ = gen.op(Context(10.0, frozenset(threads), threads, processes, {0: 0.5, "nemesis": 10.0}))
    assert op["f"] == "b" and op["at"] == 10.0
