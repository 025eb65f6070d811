"""The registry of runs on this machine: one `<tag>.json` per live or crashed run.

In: a run's tag and state. Out: the registry folder ($FAULTLINE_REGISTRY_DIR,
else /run/faultline), every entry by tag, the lock that runs hold while
they choose a subnet, atomic JSON writes, and the identity of this harness
with the test of whether an entry's harness still runs; `cleanup` reads the
registry to tell crashed runs from live ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from pathlib import Path

from .names import TAG_RE
from .processes import process_start_time

REGISTRY_ENV = "FAULTLINE_REGISTRY_DIR"
DEFAULT_REGISTRY = Path("/run/faultline")


def registry_dir() -> Path:
    """Where each live or crashed run leaves `<tag>.json`; /run is emptied by a reboot, as are namespaces."""
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY)


def registry_path(tag: str) -> Path:
    return registry_dir() / f"{tag}.json"


def harness_identity() -> dict:
    return {"pid": os.getpid(), "start_time": process_start_time(os.getpid())}


def harness_alive(entry: dict) -> bool:
    """Whether the process that created a registry entry still runs (same pid and same start time)."""
    harness = entry.get("harness") or {}
    pid, start = harness.get("pid"), harness.get("start_time")
    if not isinstance(pid, int):
        return False
    return start is not None and process_start_time(pid) == start


def write_json_atomically(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_registry() -> dict[str, dict]:
    """tag -> registry entry, for every readable `<tag>.json` in the registry (unreadable ones map to {})."""
    entries: dict[str, dict] = {}
    directory = registry_dir()
    if not directory.is_dir():
        return entries
    for path in sorted(directory.glob("*.json")):
        if not TAG_RE.match(path.stem):
            continue
        try:
            entries[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            entries[path.stem] = {}
    return entries


@contextlib.contextmanager
def registry_lock():
    """Serialises subnet choice among harnesses on this machine, so two runs never take the same /24."""
    directory = registry_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
