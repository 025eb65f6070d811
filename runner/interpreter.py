"""The interpreter: runs client workers and the nemesis, recording every
invocation and completion in the history.

In: the spec, a `HistoryWriter`, a client factory (worker -> client), the
nemeses by function and their schedule. Out: the history, written as the
operations happen: a main phase of `time_limit` seconds at `rate` ops/s over
`concurrency` workers while the nemesis acts, a heal phase that undoes every
fault, then a final phase in which every worker reads every key to its end.

Process numbering follows Jepsen: after an `info` completion the worker's
client is reopened and it carries on as process (old + concurrency).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..models.history import HistoryWriter
from ..models.spec import TestSpec
from ..nemesis.core import Schedule
from ..workloads.queue import QueueGenerator, final_read

log = logging.getLogger("faultline.interpreter")


class Phase:
    def __init__(self) -> None:
        self.name = "setup"
        self.started = time.monotonic()


class Worker(threading.Thread):
    def __init__(self, index: int, spec: TestSpec, history: HistoryWriter, make_client: Callable[[int], Any],
                 stop: threading.Event, main_deadline: float, final_deadline_of: Callable[[], float]):
        super().__init__(name=f"worker-{index}", daemon=True)
        self.index = index
        self.spec = spec
        self.history = history
        self.make_client = make_client
        self.stop = stop
        self.main_deadline = main_deadline
        self.final_deadline_of = final_deadline_of
        self.process = index
        self.generator = QueueGenerator(spec.seed, index, spec.concurrency, spec.keys, spec.max_sends_per_op)
        self.client = None
        self.main_done = threading.Event()
        self.caught_up = False
        self.error: BaseException | None = None

    def _open(self) -> None:
        self.client = self.make_client(self.process)
        self.client.open()

    def invoke(self, op: dict) -> dict:
        self.history.append({"process": self.process, "type": "invoke", **op})
        try:
            result = self.client.invoke(op)
        except Exception as exc:  # noqa: BLE001 - an unknown outcome is an info, as in Jepsen
            log.warning("process %d: %s raised %r", self.process, op["f"], exc)
            result = {"type": "info", "error": f"{type(exc).__name__}: {exc}"}
        completion = self.history.append({"process": self.process, "type": result["type"], **op, **result})
        if completion["type"] == "info":
            self.client.close()
            self.process += self.spec.concurrency
            self.generator.crashed()
            self._open()
        return completion

    def run(self) -> None:
        try:
            self._open()
            while not self.stop.is_set():
                op = self.generator.next_op()
                delay = self.generator.delay(self.spec.rate)
                if time.monotonic() + delay >= self.main_deadline or self.stop.wait(delay):
                    break
                self.invoke(op)
            self.main_done.set()
            # The final phase starts once the runner has healed the cluster.
            while not self.stop.is_set() and self.final_deadline_of() == 0:
                time.sleep(0.05)
            deadline = self.final_deadline_of()
            while not self.stop.is_set() and time.monotonic() < deadline:
                if final_read(self.client, self.invoke, self.spec.keys, deadline):
                    self.caught_up = True
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by the runner
            self.error = exc
            log.exception("worker %d failed", self.index)
        finally:
            self.main_done.set()
            if self.client is not None:
                self.client.close()


class NemesisThread(threading.Thread):
    def __init__(self, history: HistoryWriter, nemeses: dict[str, Any], schedule: Schedule | None,
                 stop: threading.Event, deadline: float):
        super().__init__(name="nemesis", daemon=True)
        self.history = history
        self.nemeses = nemeses
        self.schedule = schedule
        self.stop = stop
        self.deadline = deadline
        self.error: BaseException | None = None

    def perform(self, op: dict, heal: bool = False) -> None:
        self.history.append({"process": "nemesis", "type": "invoke", **op})
        try:
            if heal:
                # One nemesis serves several fs: heal each once.
                distinct = {id(n): n for n in self.nemeses.values()}.values()
                value = {type(n).__name__: n.heal() for n in distinct}
            else:
                value = self.nemeses[op["f"]].invoke(op)
            self.history.append({"process": "nemesis", "type": "info", **op, "value": value})
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
            log.exception("nemesis %s failed", op["f"])
            self.history.append({"process": "nemesis", "type": "info", **op, "error": f"{type(exc).__name__}: {exc}"})

    def run(self) -> None:
        if not self.schedule:
            return
        try:
            while not self.stop.is_set():
                op = self.schedule.next_op()
                delay = self.schedule.delay()
                if time.monotonic() + delay >= self.deadline or self.stop.wait(delay):
                    break
                self.perform(op)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def heal(self) -> None:
        if self.nemeses:
            self.perform({"f": "heal"}, heal=True)


def run_phases(spec: TestSpec, history: HistoryWriter, make_client: Callable[[int], Any],
               nemeses: dict[str, Any], schedule: Schedule | None, phase: Phase,
               stop: threading.Event) -> list[Worker]:
    """Run the main, heal and final phases; returns the workers (for their state)."""
    start = time.monotonic()
    main_deadline = start + spec.time_limit
    final_deadline = [0.0]
    workers = [Worker(i, spec, history, make_client, stop, main_deadline, lambda: final_deadline[0])
               for i in range(spec.concurrency)]
    nemesis = NemesisThread(history, nemeses, schedule, stop, main_deadline)
    phase.name, phase.started = "main", start
    for w in workers:
        w.start()
    nemesis.start()
    nemesis.join()
    for w in workers:
        while not w.main_done.wait(0.2):
            if stop.is_set():
                break
    if stop.is_set():
        return workers
    phase.name, phase.started = "heal", time.monotonic()
    nemesis.heal()
    phase.name, phase.started = "final", time.monotonic()
    final_deadline[0] = time.monotonic() + spec.final_time_limit
    for w in workers:
        while w.is_alive():
            w.join(0.2)
            if stop.is_set():
                return workers
    for w in workers:
        if w.error is not None:
            raise RuntimeError(f"worker {w.index} failed: {w.error!r}") from w.error
    if nemesis.error is not None:
        raise RuntimeError(f"the nemesis failed: {nemesis.error!r}") from nemesis.error
    return workers
