"""Processes as the tests look at them through /proc: a process's descendants, and whether one still runs."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process under `pid` (children, theirs, ...), as /proc lists them now."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            out |= {int(child)} | descendants(int(child))
    return out


def alive(pid: int) -> bool:
    """Whether `pid` runs: it exists and is not a zombie (ended, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"
