"""The interpreter: consumes any generator, performing its operations on worker threads and
recording every invocation and completion in the history (Jepsen's `generator.interpreter`).

In: a generator (`workloads.generator`), the number of client threads, a client factory
(process -> an unopened `Client`), the nemesis (`NemesisClient`, or None for a run without
faults) and a `HistoryWriter`. Out: the history, written as operations happen, once the
generator is exhausted and every operation has completed.

One scheduling loop (the calling thread) asks the generator for the next operation, waits until
it is due, hands it to the free thread it names and records the invocation; each thread performs
one operation at a time and hands its completion back, which the loop records and feeds to the
generator. Only the loop writes the history, so its lines are in the order the loop saw them.

An op's fields whose names start with an underscore go to its client but into no history line:
what the generator hands the client to report (the final reader's record goes only on the
completion, from the client).

Process numbering follows Jepsen: after an `info` completion the thread's client is closed and
the thread carries on as process (old + number of client threads), with a new client.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from ..models.history import HistoryWriter
from ..nemesis.core import RepairFailed
from ..workloads.generator import NEMESIS, PENDING, Context

log = logging.getLogger("faultline.interpreter")

# How long the loop sleeps at most when it has nothing to do: time-bound generators (a time
# limit running out) change their answer with no completion to wake the loop.
IDLE_WAIT = 0.05
_STOP = object()
# Seconds a client operation may run before the interpreter stops waiting for it. Every client
# call has a timeout of its own (a send waits message.timeout.ms and a few seconds more), so an
# operation past this is stuck in its client library: it is recorded as indeterminate, its
# process retired, and its thread given a fresh worker, so that one stuck call cannot hold up
# the run forever. Nemesis operations restart brokers and wait for them: they get longer.
CLIENT_OP_TIMEOUT = 60.0
NEMESIS_OP_TIMEOUT = 600.0


def _private(field: str) -> bool:
    """An op's field for its client only, never recorded: its name starts with an underscore (the
    final reader hands its client the record that the completion is to carry, say)."""
    return field.startswith("_")


def _stack(worker: threading.Thread) -> str:
    frame = sys._current_frames().get(worker.ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(not running)"


class HarnessError(Exception):
    """The harness itself failed (a client raised, a worker could not open its client): the run
    stops, and its verdict is unknown whatever the history shows."""


class NemesisClient:
    """Performs nemesis operations: each f by the nemesis that owns it, and `heal` by every
    nemesis, each in its turn even when one before it failed. A completion is always `info` (a
    fault's effect is never certain), with what was done as its value; an operation that did not
    fully succeed also carries `error`. A heal's value holds each nemesis's own (keyed by its class
    name: per node, under "outcomes", "healed" or the error naming the node; {"error": ...} when it
    failed outright), and its `error` names every repair that did not succeed."""

    def __init__(self, nemeses: dict[str, Any]):
        self.nemeses = nemeses

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def _attempt(f: str, action: Callable[[], Any]) -> tuple[Any, str | None]:
        """(value, error or None) of one nemesis action."""
        try:
            return action(), None
        except RepairFailed as exc:
            log.error("nemesis %s did not fully succeed: %s", f, exc)
            return exc.value, str(exc)
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
            log.exception("nemesis %s failed", f)
            error = f"{type(exc).__name__}: {exc}"
            return {"error": error}, error

    def invoke(self, op: dict) -> dict:
        if op["f"] == "heal":
            # One nemesis serves several fs: heal each once, every one even after another failed.
            distinct = {id(n): n for n in self.nemeses.values()}.values()
            value, errors = {}, []
            for nemesis in distinct:
                name = type(nemesis).__name__
                value[name], error = self._attempt(f"{name} heal", nemesis.heal)
                if error is not None:
                    errors.append(f"{name}: {error}")
            done = {"type": "info", "value": value}
            if errors:
                done["error"] = "; ".join(errors)
            return done
        value, error = self._attempt(op["f"], lambda: self.nemeses[op["f"]].invoke(op))
        if error is None:
            return {"type": "info", "value": value}
        if isinstance(value, dict) and list(value) == ["error"]:
            return {"type": "info", "error": error}
        return {"type": "info", "value": value, "error": error}


class Worker(threading.Thread):
    """One thread of the test: performs the ops it is handed with a client opened for the op's
    process (reopened when the process changes), and hands back (thread, op, completion fields)."""

    def __init__(self, thread, make_client: Callable[[Any], Any], outbox: queue.Queue):
        super().__init__(name=f"worker-{thread}", daemon=True)
        self.thread = thread
        self.make_client = make_client
        self.outbox = outbox
        self.inbox: queue.Queue = queue.Queue()
        self.client = None
        self.process = None

    def _client_for(self, process):
        if self.client is None or process != self.process:
            self._close()
            self.client = self.make_client(process)
            self.client.open()
            self.process = process
        return self.client

    def _close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            client.close()

    def perform(self, op: dict) -> dict:
        client = self._client_for(op["process"])
        fields = {k: v for k, v in op.items() if k not in ("process", "type", "index", "time")}
        # A client turns every error of the system under test it knows (broker and network errors)
        # into a completion; whatever it raises is a fault of the harness, which says nothing
        # about the system: recording it as `info` would make a broken client look like an
        # indeterminate broker. It ends the run, whose verdict is then unknown.
        return client.invoke(fields)

    def run(self) -> None:
        try:
            while (op := self.inbox.get()) is not _STOP:
                try:
                    result = self.perform(op)
                    if result["type"] == "info":
                        self._close()  # the process is over; the next op opens a client for its successor
                except BaseException as exc:  # noqa: BLE001 - the loop stops the run and reports it
                    log.exception("worker %s: %s by process %s raised", self.thread, op["f"], op["process"])
                    self.outbox.put((self.thread, op, exc))
                    return
                self.outbox.put((self.thread, op, result))
        finally:
            try:
                self._close()
            except Exception:  # noqa: BLE001 - closing a broken client must not hide why it broke
                log.exception("closing the client of worker %s failed", self.thread)


def machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU of the machine since boot (/proc/stat); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return sum(ticks) - idle, sum(ticks)


@dataclass
class Invoked:
    """Client invocations per phase: how many, and the first and last (seconds since the start);
    and what they cost, sampled at the first invocation and then at most once a second (reading
    a process's CPU time sums every thread's, librdkafka's many included, and costs more than an
    operation): per sample, the invocations so far, the harness process's CPU seconds and the
    machine's busy and total clock ticks."""
    count: dict[str, int] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    samples: dict[str, list[tuple]] = field(default_factory=dict)  # phase -> [first, latest] samples

    def add(self, phase: str, at: float) -> None:
        self.count[phase] = self.count.get(phase, 0) + 1
        self.first.setdefault(phase, at)
        self.last[phase] = at
        samples = self.samples.get(phase)
        if samples is None or at - samples[1][0] >= 1.0:
            sample = (at, self.count[phase], time.process_time(), machine_jiffies())
            if samples is None:
                self.samples[phase] = [sample, sample]
            else:
                samples[1] = sample

    def cost(self, phase: str) -> dict[str, float]:
        """Between the phase's first and latest samples: `cpu_ms_per_op`, the harness's CPU per
        invocation; `machine_busy`, the share of the machine's CPU time that was busy (every
        process, the brokers' too). Empty before a second sample."""
        if phase not in self.samples:
            return {}
        (_, n0, cpu0, jiffies0), (_, n1, cpu1, jiffies1) = self.samples[phase]
        out: dict[str, float] = {}
        if n1 > n0:
            out["cpu_ms_per_op"] = round(1000 * (cpu1 - cpu0) / (n1 - n0), 3)
        if jiffies0 and jiffies1 and jiffies1[1] > jiffies0[1]:
            out["machine_busy"] = round((jiffies1[0] - jiffies0[0]) / (jiffies1[1] - jiffies0[1]), 3)
        return out

    def rate(self, phase: str, now: float | None = None) -> float | None:
        """Invocations per second in `phase`, from its first invocation to its last (or to `now`,
        while it runs); None before there is a span to measure."""
        n = self.count.get(phase, 0)
        span = (now if now is not None else self.last.get(phase, 0.0)) - self.first.get(phase, 0.0)
        return n / span if n > 1 and span > 0 else None


class Interpreter:
    """Runs one generator to its end. `phase` names the phase of a `Phases` generator being run
    (for progress lines); `invoked` counts client invocations per phase (the achieved rate)."""

    def __init__(self, generator, concurrency: int, make_client: Callable[[int], Any], history: HistoryWriter,
                 nemesis: NemesisClient | None = None):
        self.generator = generator
        self.concurrency = concurrency
        self.history = history
        self.outbox: queue.Queue = queue.Queue()
        self.make_client = make_client
        self.workers = {t: Worker(t, make_client, self.outbox) for t in range(concurrency)}
        if nemesis is not None:
            self.workers[NEMESIS] = Worker(NEMESIS, lambda process: nemesis, self.outbox)
        self.op_timeout = {t: CLIENT_OP_TIMEOUT for t in range(concurrency)}
        self.op_timeout[NEMESIS] = NEMESIS_OP_TIMEOUT
        self.abandoned: list[Worker] = []
        self.processes: dict[Any, Any] = {t: t for t in range(concurrency)}
        if nemesis is not None:
            self.processes[NEMESIS] = NEMESIS
        self.phase = getattr(generator, "phase", "main")
        self.started = time.monotonic()
        self.invoked = Invoked()
        self.since = {t: 0.0 for t in self.workers}  # seconds since the start at which each became free

    def _context(self, free: set) -> Context:
        return Context(time.monotonic() - self.started, frozenset(free), tuple(self.workers), dict(self.processes),
                       {t: self.since[t] for t in free})

    def run(self) -> None:
        for w in self.workers.values():
            w.start()
        try:
            self._loop()
        finally:
            for w in [*self.workers.values(), *self.abandoned]:
                w.inbox.put(_STOP)
            for w in self.workers.values():
                w.join(10)
                if w.is_alive():
                    log.warning("worker %s is still inside an operation; leaving it behind", w.thread)

    def _loop(self) -> None:
        gen = self.generator
        free = set(self.workers)
        self.started = time.monotonic()
        self.since = {t: 0.0 for t in self.workers}

        running: dict[Any, tuple[float, dict]] = {}  # busy thread -> (since when, its op)

        def complete(item) -> None:
            nonlocal gen
            thread, op, result = item
            if running.get(thread, (None, {}))[1].get("index") != op["index"]:
                return  # the completion of an abandoned operation, recorded as info already
            del running[thread]
            if isinstance(result, BaseException):
                raise HarnessError(f"worker {thread} failed: {op['f']} by process {op['process']} (history "
                                   f"line {op['index']}) raised {type(result).__name__}: {result}") from result
            fields = {k: v for k, v in op.items() if k not in ("index", "time", "process", "type") and not _private(k)}
            record = self.history.append({"process": op["process"], "type": result["type"], **fields, **result})
            free.add(thread)
            self.since[thread] = time.monotonic() - self.started
            if record["type"] == "info" and thread != NEMESIS:
                self.processes[thread] = op["process"] + self.concurrency
            gen = gen.update(self._context(free), {**record, "thread": thread})

        def wait(timeout: float) -> bool:
            """Take one completion if it arrives within `timeout`; whether one did."""
            try:
                complete(self.outbox.get(timeout=max(0.0, timeout)))
                return True
            except queue.Empty:
                abandon_stuck()
                return False

        def abandon_stuck() -> None:
            now = time.monotonic()
            for thread, (since, op) in list(running.items()):
                if now - since < self.op_timeout[thread]:
                    continue
                stuck = self.workers[thread]
                log.error("worker %s: %s by process %s (history line %d) has run %.0fs; abandoning it. Its stack:\n%s",
                          thread, op["f"], op["process"], op["index"], now - since, _stack(stuck))
                self.abandoned.append(stuck)
                self.workers[thread] = Worker(thread, stuck.make_client, self.outbox)
                self.workers[thread].start()
                complete((thread, op, {"type": "info", "error": f"no completion within {self.op_timeout[thread]:g}s: "
                                                                 f"the call was abandoned"}))

        while True:
            while True:  # completions that are already in
                try:
                    complete(self.outbox.get_nowait())
                except queue.Empty:
                    break
            ctx = self._context(free)
            answer = gen.op(ctx)
            if answer is None:
                if len(free) == len(self.workers):
                    return
                wait(IDLE_WAIT)
                continue
            if answer is PENDING:
                wait(IDLE_WAIT)
                continue
            op, after = answer
            if op["at"] > ctx.time and wait(min(op["at"] - ctx.time, IDLE_WAIT * 20)):
                continue  # something completed first: ask again, the answer may change
            if op["at"] > self._context(free).time:
                continue
            thread = next(t for t, p in self.processes.items() if p == op["process"])
            fields = {k: v for k, v in op.items() if k not in ("process", "at")}
            record = self.history.append({"process": op["process"], "type": "invoke",
                                          **{k: v for k, v in fields.items() if not _private(k)}})
            free.discard(thread)
            running[thread] = (time.monotonic(), record)
            self.phase = getattr(after, "phase", self.phase)
            if op["process"] != NEMESIS:
                self.invoked.add(self.phase, time.monotonic() - self.started)
            gen = after.update(self._context(free), {**record, "thread": thread})
            self.workers[thread].inbox.put({**record, **{k: v for k, v in fields.items() if _private(k)}})
