"""Client faults: SIGKILL a consumer group member as one would an application's process.

In: the folder where the consume workloads' members leave their pid files (`consumer-<process>.pid`;
workloads/consumer_child.py). Out: `kill-consumer` SIGKILLs one live member, chosen from the op's
seed, and reports its process number and pid (or that none was running); `consumers-rejoin` ends the
fault: nothing to repair, since the killed member's worker finds it dead at its next operation,
ends the process and starts a new member in the same group.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

from .core import Op


class KillConsumerNemesis:
    fs = ("kill-consumer", "consumers-rejoin")

    def __init__(self, clients_dir: Path | None):
        self.clients_dir = clients_dir

    def _members(self) -> dict[int, int]:
        """Live members: process number -> pid."""
        found = {}
        for path in sorted(self.clients_dir.glob("consumer-*.pid")) if self.clients_dir else []:
            try:
                pid = int(path.read_text().strip())
                os.kill(pid, 0)
            except (OSError, ValueError):
                continue
            found[int(path.stem.partition("-")[2])] = pid
        return found

    def invoke(self, op: Op) -> Any:
        if op["f"] == "kill-consumer":
            members = self._members()
            if not members:
                return {"processes": [], "note": "no consumer group member was running"}
            process = random.Random(op.get("seed", 0)).choice(sorted(members))
            try:
                os.kill(members[process], signal.SIGKILL)
            except ProcessLookupError:
                return {"processes": [], "note": f"the member of process {process} ended first"}
            return {"processes": [process], "pids": {str(process): members[process]}, "signal": "SIGKILL"}
        if op["f"] == "consumers-rejoin":
            return self.heal()
        raise ValueError(f"KillConsumerNemesis cannot perform {op['f']!r}")

    def heal(self) -> Any:
        return {"note": "each killed member's worker starts a new member at its next operation"}
