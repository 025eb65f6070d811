"""Client faults: SIGKILL a client's process as one would an application's.

In: the role (`consumer`: the consume workloads' group members, workloads/consumer_child.py;
`producer`: the resend workload's producers, workloads/producer_child.py) and the folder where
those processes leave their pid files (`<role>-<process>.pid`) and, group members, the keys they
hold (`<role>-<process>.keys`). Out: `kill-<role>` SIGKILLs one live client, chosen from the op's
seed among those that hold keys when any does (a member without partitions has nothing to lose or
repeat), and reports its process number, pid and keys (or that none was running); the paired end
(`consumers-rejoin`, `producers-restart`) has nothing to repair: the killed client's worker finds
it dead at its next operation, ends the process and starts a new one (a new group member; a new
producer session).
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

from .core import Op

ENDS = {"consumer": "consumers-rejoin", "producer": "producers-restart"}
NAMES = {"consumer": "consumer group member", "producer": "producer"}
HEALED = {"consumer": "each killed member's worker starts a new member at its next operation",
          "producer": "each killed producer's worker starts a new producer session at its next operation"}


class KillClientNemesis:
    def __init__(self, role: str, clients_dir: Path | None):
        self.role = role
        self.clients_dir = clients_dir
        self.fs = (f"kill-{role}", ENDS[role])

    def _live(self) -> dict[int, int]:
        """Live clients of the role: process number -> pid."""
        found = {}
        for path in sorted(self.clients_dir.glob(f"{self.role}-*.pid")) if self.clients_dir else []:
            try:
                pid = int(path.read_text().strip())
                os.kill(pid, 0)
            except (OSError, ValueError):
                continue
            found[int(path.stem.partition("-")[2])] = pid
        return found

    def _held(self, process: int) -> list[str]:
        """The keys a live client said it holds (none, when it says nothing)."""
        try:
            return json.loads((self.clients_dir / f"{self.role}-{process}.keys").read_text())
        except (OSError, ValueError):
            return []

    def invoke(self, op: Op) -> Any:
        if op["f"] == self.fs[0]:
            live = self._live()
            if not live:
                return {"processes": [], "note": f"no {NAMES[self.role]} was running"}
            held = {process: self._held(process) for process in live}
            choices = sorted(p for p in live if held[p]) or sorted(live)
            process = random.Random(op.get("seed", 0)).choice(choices)
            try:
                os.kill(live[process], signal.SIGKILL)
            except ProcessLookupError:
                return {"processes": [], "note": f"the {NAMES[self.role]} of process {process} ended first"}
            return {"processes": [process], "pids": {str(process): live[process]}, "signal": "SIGKILL",
                    **({"keys": held[process]} if held[process] else {})}
        if op["f"] == self.fs[1]:
            return self.heal()
        raise ValueError(f"the kill-{self.role} nemesis cannot perform {op['f']!r}")

    def heal(self) -> Any:
        return {"note": HEALED[self.role]}
