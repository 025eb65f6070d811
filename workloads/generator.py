"""Generators: what a test does next, as pure values (Jepsen's `jepsen.generator`).

A generator is an immutable value with two methods:

- `op(ctx)` -> `None` when it is exhausted, `PENDING` when it has nothing to
  give yet (no thread it may use is free, or it waits for something), or
  `(op, next_generator)`: `op` is the operation to invoke, with `process` (who
  performs it) and `at` (seconds since the run started: not before then) set;
- `update(ctx, event)` -> the generator after an invocation or completion
  happened (`event` is the history line, with `thread` added).

`ctx` is a `Context`: the time, which threads are free, and which process each
thread runs. Because generators are values, the interpreter may ask one for an
operation, not take it (a completion arrived first), and ask again.

Combinators build tests out of small parts: a list of ops (`Seq`), `Once`,
`Fn` (an op computed from the context), `Phases` (each runs to its end on
every thread before the next starts; a phase may be made from the one
before), `Any` (the soonest op of several),
`Mix` (a random one of several, reproducibly), `Stagger` (random delays),
`TimeLimit`, `EachThread` (a generator of its own per thread, or per process),
`UntilOk` (until one op completes ok), `OnThreads`, `clients` and `nemesis`
(which threads may run the ops).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, Protocol

Op = dict[str, Any]
Thread = Hashable
NEMESIS = "nemesis"


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()


@dataclass(frozen=True)
class Context:
    """What a generator may look at: `time` (seconds since the run started), the threads that are
    `free`, every thread the generator may use (`threads`), the process each thread runs, and
    since when each free thread has been free (`free_since`).

    A delay is measured from `free_since`, never from `time`: the interpreter may ask again for
    an op it did not take, and an op due `time + delay` would move further away at every ask."""

    time: float
    free: frozenset
    threads: tuple
    processes: Mapping[Thread, Any]
    free_since: Mapping[Thread, float] = field(default_factory=dict)

    def since(self, thread: Thread) -> float:
        return self.free_since.get(thread, self.time)

    def restrict(self, keep: Callable[[Thread], bool]) -> "Context":
        return dataclasses.replace(self, free=frozenset(t for t in self.free if keep(t)),
                                   threads=tuple(t for t in self.threads if keep(t)))

    def some_free_thread(self) -> Thread | None:
        """The free thread an op goes to when its generator does not care which (the lowest)."""
        return min(self.free, key=_order) if self.free else None

    @property
    def all_free(self) -> bool:
        return set(self.threads) <= self.free


def _order(thread: Thread) -> tuple:
    return (1, str(thread)) if isinstance(thread, str) else (0, thread)


class Generator(Protocol):
    def op(self, ctx: Context) -> None | _Pending | tuple[Op, "Generator"]: ...

    def update(self, ctx: Context, event: Op) -> "Generator": ...


def fill(op: Op, ctx: Context, thread: Thread | None = None) -> Op | None:
    """`op` addressed to a free thread's process (the given thread, or any) at the current time
    unless it says otherwise; None when no thread is free."""
    thread = ctx.some_free_thread() if thread is None else thread
    if thread is None:
        return None
    return {**op, "process": ctx.processes[thread], "at": max(op.get("at", ctx.time), ctx.time)}


def soonest(*candidates):
    """Of several `op` answers, the one whose op is due first; PENDING if none has an op but some
    are pending; None if all are exhausted. Returns (index, answer)."""
    best, pending = None, False
    for i, answer in enumerate(candidates):
        if answer is None:
            continue
        if answer is PENDING:
            pending = True
            continue
        if best is None or answer[0]["at"] < best[1][0]["at"]:
            best = (i, answer)
    if best is not None:
        return best
    return (None, PENDING) if pending else (None, None)


@dataclass(frozen=True)
class Seq:
    """Each item in turn: an op (a dict) goes to any free thread; a generator runs until exhausted."""

    items: tuple

    @classmethod
    def of(cls, items: Iterable) -> "Seq":
        return cls(tuple(items))

    def op(self, ctx):
        items = self.items
        while items:
            head = items[0]
            if isinstance(head, dict):
                op = fill(head, ctx)
                return PENDING if op is None else (op, Seq(items[1:]))
            answer = head.op(ctx)
            if answer is None:
                items = items[1:]
                continue
            if answer is PENDING:
                return PENDING
            op, rest = answer
            return op, Seq((rest,) + items[1:])
        return None

    def update(self, ctx, event):
        if self.items and not isinstance(self.items[0], dict):
            return Seq((self.items[0].update(ctx, event),) + self.items[1:])
        return self


def Once(op: Op) -> Seq:
    return Seq((op,))


@dataclass(frozen=True)
class Fn:
    """Ops computed by `f(ctx)` (an op, or None for exhausted), forever."""

    f: Callable[[Context], Op | None]

    def op(self, ctx):
        op = self.f(ctx)
        if op is None:
            return None
        op = fill(op, ctx)
        return PENDING if op is None else (op, self)

    def update(self, ctx, event):
        return self


@dataclass(frozen=True)
class OnThreads:
    """`gen`, run only on the threads `keep` accepts; it sees only their events."""

    keep: Callable[[Thread], bool]
    gen: Any

    def op(self, ctx):
        answer = self.gen.op(ctx.restrict(self.keep))
        if answer is None or answer is PENDING:
            return answer
        op, rest = answer
        return op, OnThreads(self.keep, rest)

    def update(self, ctx, event):
        if not self.keep(event["thread"]):
            return self
        return OnThreads(self.keep, self.gen.update(ctx.restrict(self.keep), event))


def _is_nemesis(thread: Thread) -> bool:
    return thread == NEMESIS


def _is_client(thread: Thread) -> bool:
    return thread != NEMESIS


def clients(gen) -> OnThreads:
    return OnThreads(_is_client, gen)


def nemesis(gen) -> OnThreads:
    return OnThreads(_is_nemesis, gen)


@dataclass(frozen=True)
class Phases:
    """Each generator in turn; the next starts only when the one before is exhausted and every
    thread is free (Jepsen's `phases`, a `then` with `synchronize`). `names` label the phases for
    progress lines.

    An item may instead be a function of the phase before it (that phase's generator, exhausted,
    with every completion of its ops seen): it is called when its phase starts and returns the
    phase's generator, or None to skip it. A phase starts when its last thread became free: the
    generators of a later phase see no thread as free since earlier (so a time limit or deadline of
    the phase runs from its start, not from when a thread finished its last op of the phase before)."""

    gens: tuple
    names: tuple = ()
    index: int = 0
    waiting: bool = False  # the current phase is over; the next waits for every thread to be free
    started: float | None = None  # when the current phase started (None: the first, as it began)

    @property
    def phase(self) -> str:
        if self.index < len(self.names):
            return self.names[self.index]
        return f"phase {self.index + 1}"

    def _within(self, ctx: Context) -> Context:
        if self.started is None:
            return ctx
        return dataclasses.replace(ctx, free_since={t: max(s, self.started) for t, s in ctx.free_since.items()})

    def op(self, ctx):
        gen = self
        while gen.index < len(gen.gens):
            if gen.waiting:
                if not ctx.all_free:
                    return PENDING
                current = gen.gens[gen.index]
                if not hasattr(current, "op"):
                    current = current(gen.gens[gen.index - 1])
                started = max((ctx.free_since.get(t, ctx.time) for t in ctx.threads), default=ctx.time)
                gen = dataclasses.replace(gen, waiting=False, started=started)._with_current(current)
                if current is None:
                    gen = dataclasses.replace(gen, index=gen.index + 1, waiting=True)
                    continue
            answer = gen.gens[gen.index].op(gen._within(ctx))
            if answer is None:
                gen = dataclasses.replace(gen, index=gen.index + 1, waiting=True)
                continue
            if answer is PENDING:
                return PENDING
            op, rest = answer
            return op, gen._with_current(rest)
        return None

    def _with_current(self, rest) -> "Phases":
        gens = self.gens[:self.index] + (rest,) + self.gens[self.index + 1:]
        return dataclasses.replace(self, gens=gens)

    def update(self, ctx, event):
        if self.index >= len(self.gens):
            return self
        return self._with_current(self.gens[self.index].update(self._within(ctx), event))


@dataclass(frozen=True)
class Any_:
    """Whichever of several generators has the soonest op; exhausted when all are."""

    gens: tuple

    def op(self, ctx):
        answers = [g.op(ctx) for g in self.gens]
        i, answer = soonest(*answers)
        if i is None:
            return answer
        op, rest = answer
        return op, Any_(self.gens[:i] + (rest,) + self.gens[i + 1:])

    def update(self, ctx, event):
        return Any_(tuple(g.update(ctx, event) for g in self.gens))


def any_(*gens) -> Any_:
    return Any_(tuple(gens))


def _rng(state) -> random.Random:
    # Not random.Random(): its constructor seeds from the operating system's entropy, which cost
    # more than the rest of a generator's step, and setstate replaces all of it anyway.
    rng = random.Random.__new__(random.Random)
    rng.setstate(state)
    return rng


def rng_state(seed: Any) -> tuple:
    """The state of a random stream named by `seed`, for the generators below that draw from one."""
    return random.Random(seed).getstate()


def resume(state) -> random.Random:
    """The random stream whose state is `state`, to draw from and save again (a generator value
    keeps the state, never the stream)."""
    return _rng(state)


@dataclass(frozen=True)
class Mix:
    """A random one of `gens` for each op, drawn from its own stream (`rng_state(seed)`); exhausted
    generators drop out."""

    gens: tuple
    state: tuple

    def op(self, ctx):
        gens = list(self.gens)
        rng = _rng(self.state)
        while gens:
            i = rng.randrange(len(gens))
            answer = gens[i].op(ctx)
            if answer is None:
                gens.pop(i)
                continue
            if answer is PENDING:
                return PENDING
            op, rest = answer
            gens[i] = rest
            return op, Mix(tuple(gens), rng.getstate())
        return None

    def update(self, ctx, event):
        return Mix(tuple(g.update(ctx, event) for g in self.gens), self.state)


@dataclass(frozen=True)
class Stagger:
    """`gen`'s ops spaced by random delays, uniform in [0, 2 * dt) (mean dt), as Jepsen's stagger."""

    dt: float
    gen: Any
    state: tuple
    next_at: float | None = None

    def op(self, ctx):
        answer = self.gen.op(ctx)
        if answer is None or answer is PENDING:
            return answer
        op, rest = answer
        at = max(op["at"], self.next_at if self.next_at is not None else ctx.time)
        rng = _rng(self.state)
        after = at + rng.uniform(0, 2 * self.dt)
        return {**op, "at": at}, Stagger(self.dt, rest, rng.getstate(), after)

    def update(self, ctx, event):
        return dataclasses.replace(self, gen=self.gen.update(ctx, event))


@dataclass(frozen=True)
class TimeLimit:
    """`gen` for `seconds` from when it started (when its threads were all free and it was first
    asked: the latest moment one of them became free); an op due after that is not given. The
    start does not move when an op is asked for and not taken."""

    seconds: float
    gen: Any
    deadline: float | None = None

    def op(self, ctx):
        deadline = self.deadline
        if deadline is None:
            since = [ctx.free_since[t] for t in ctx.threads if t in ctx.free_since]
            deadline = (max(since) if since else ctx.time) + self.seconds
        if ctx.time >= deadline:
            return None
        answer = self.gen.op(ctx)
        if answer is None:
            return None
        if answer is PENDING:
            return PENDING
        op, rest = answer
        if op["at"] >= deadline:
            return None
        return op, TimeLimit(self.seconds, rest, deadline)

    def update(self, ctx, event):
        return dataclasses.replace(self, gen=self.gen.update(ctx, event))


@dataclass(frozen=True)
class EachThread:
    """A generator of its own for every thread, made by `make(thread)` (or, with `by_process`,
    for every process: a thread whose process crashed starts a fresh one). Exhausted when every
    thread's generator is."""

    make: Callable[[Thread], Any]
    by_process: bool = False
    gens: Mapping = field(default_factory=dict)

    def _key(self, ctx: Context, thread: Thread):
        return ctx.processes[thread] if self.by_process else thread

    def _gen(self, ctx: Context, thread: Thread):
        key = self._key(ctx, thread)
        return self.gens[key] if key in self.gens else self.make(thread)

    def op(self, ctx):
        answers, pending = [], False
        for thread in sorted(ctx.threads, key=_order):
            if thread not in ctx.free:
                if self._gen(ctx, thread) is not None:
                    pending = True  # it may still have ops once its thread is free
                continue
            gen = self._gen(ctx, thread)
            answer = gen.op(dataclasses.replace(ctx, free=frozenset([thread]), threads=(thread,)))
            if answer is PENDING:
                pending = True
            elif answer is not None:
                answers.append((thread, answer))
        if not answers:
            return PENDING if pending else None
        thread, (op, rest) = min(answers, key=lambda a: a[1][0]["at"])
        gens = dict(self.gens)
        gens[self._key(ctx, thread)] = rest
        return op, dataclasses.replace(self, gens=gens)

    def update(self, ctx, event):
        thread = event["thread"]
        if thread not in ctx.threads:
            return self
        key = self._key(ctx, thread)
        gens = dict(self.gens)
        gens[key] = self._gen(ctx, thread).update(
            dataclasses.replace(ctx, free=ctx.free & {thread}, threads=(thread,)), event)
        return dataclasses.replace(self, gens=gens)


@dataclass(frozen=True)
class UntilOk:
    """`gen` until one of the ops it gave completes ok (Jepsen's until-ok)."""

    gen: Any
    mine: frozenset = frozenset()  # processes running one of its ops
    done: bool = False

    def op(self, ctx):
        if self.done:
            return None
        answer = self.gen.op(ctx)
        if answer is None or answer is PENDING:
            return answer
        op, rest = answer
        return op, UntilOk(rest, self.mine | {op["process"]})

    def update(self, ctx, event):
        gen = self.gen.update(ctx, event)
        if event["type"] == "invoke" or event["process"] not in self.mine:
            return UntilOk(gen, self.mine, self.done)
        return UntilOk(gen, self.mine - {event["process"]}, self.done or event["type"] == "ok")


@dataclass(frozen=True)
class Unfold:
    """Ops from a pure step function, forever or until it returns None: `step(state)` ->
    `(op, delay, next_state)`, the op due `delay` seconds after its thread became free."""

    step: Callable[[Any], tuple[Op, float, Any] | None]
    state: Any

    def op(self, ctx):
        thread = ctx.some_free_thread()
        if thread is None:
            return PENDING
        answer = self.step(self.state)
        if answer is None:
            return None
        op, delay, state = answer
        return fill({**op, "at": ctx.since(thread) + delay}, ctx, thread), Unfold(self.step, state)

    def update(self, ctx, event):
        return self


def each_op(gen, ctx: Context, limit: int = 10_000) -> list[Op]:
    """The ops `gen` gives when each is taken at once and completes ok at once, in order, for at
    most `limit` ops: a way to look at a generator in tests and tools."""
    out = []
    while len(out) < limit:
        answer = gen.op(ctx)
        if answer is None or answer is PENDING:
            break
        op, gen = answer
        thread = next(t for t, p in ctx.processes.items() if p == op["process"])
        invoke = {**op, "type": "invoke", "thread": thread}
        gen = gen.update(ctx, invoke)
        gen = gen.update(ctx, {**invoke, "type": "ok"})
        out.append(op)
    return out
