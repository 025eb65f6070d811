"""Processes on this machine, as /proc and `ip netns pids` show them.

In: a pid or a namespace name. Out: a process's start time (with its pid,
an identity that survives pid reuse), its state letter and command line,
the pids in a namespace, and the killing of every process in a namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from .iproute import ip
from .wait import wait_until


def namespace_pids(namespace: str) -> list[int]:
    """Every process whose network namespace is `namespace`, whoever started it ([] if it does not exist)."""
    proc = ip("netns", "pids", namespace, check=False)
    if proc.returncode != 0:
        return []
    return [int(p) for p in proc.stdout.split()]


def process_start_time(pid: int) -> int | None:
    """Clock ticks after boot when `pid` started; with the pid it identifies a process despite pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after the last ")" do not.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` (R, S, D, T, Z, ...) or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _cmdline_raw(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None


def process_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def kill_namespace_processes(namespace: str, timeout: float = 10) -> list[int]:
    """SIGKILL every process in `namespace` until none is left; return the pids killed.

    Repeats because a process may fork between the listing and the kill.
    SIGKILL needs no SIGCONT first: it ends stopped (paused) processes too.
    """
    killed: list[int] = []

    def none_left() -> bool:
        pids = namespace_pids(namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        return not pids

    wait_until(none_left, timeout,
               f"processes in namespace {namespace} survived SIGKILL (stuck in uninterruptible sleep?)",
               interval=0.02)
    return killed
