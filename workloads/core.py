"""The workload interface: what clients do in a test, as a Jepsen workload map.

A `Workload` bundles the client operations of the main phase (a generator,
`workloads.generator`), the final reads (a generator run on every client
thread after the heal; it keeps its own time limit, so that it can record
running out of time, and ends by itself), what the final phase does instead
after a heal that did not succeed, a client factory and the model hints it
implies (assign or subscribe, transactions). The runner and
the interpreter know only this interface, never a concrete workload.

A `Client` is opened for one process, performs one operation at a time
(`invoke(op)` -> completion fields: `type` and results) and is closed when
its process ends (after an `info`, or at the end of the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

Op = dict[str, Any]


class Client(Protocol):
    def open(self) -> None: ...

    def invoke(self, op: Op) -> Op: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Workload:
    """`generator`: the main phase's client ops; `final_generator`: the final reads;
    `client(bootstrap, process)`: a new, unopened client; `hints`: what the model needs to know of how
    clients consume (`consumer_mode`: "assign" or "subscribe"; `transactions`); `final_unhealed(why)`:
    the final phase after a heal that did not succeed, which must not read from the broken cluster
    as if healed (the queue workload's records that no key was read; None: no final phase then);
    `setup(bootstrap)`: what the cluster must be ready for before the first operation, once its
    topics exist (raises when it cannot be; None: nothing)."""

    name: str
    generator: Any
    final_generator: Any
    client: Callable[[str, int], Client]
    hints: dict[str, Any] = field(default_factory=dict)
    final_unhealed: Callable[[str], Any] | None = None
    setup: Callable[[str], None] | None = None
