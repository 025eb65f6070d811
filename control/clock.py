"""Skewed clocks for the processes of a node, through Debian's libfaketime.

In: a node's offset file. Out: the environment that makes a process started
with it read its wall clock through libfaketime (preloaded), offset by what
the file says; `set_offset` changes it while the process runs (libfaketime
rereads the file at most once a second). Only the wall clock moves: the
monotonic clock, which timers and timeouts use, is left alone, as a node's
NTP step would leave it.
"""

from __future__ import annotations

import os
from pathlib import Path

CANDIDATES = [Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
              Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"),
              Path("/usr/lib/faketime/libfaketimeMT.so.1")]


class ClockError(RuntimeError):
    pass


def library() -> Path:
    for path in CANDIDATES:
        if path.exists():
            return path
    raise ClockError("libfaketime is not installed, so clocks cannot be skewed: run scripts/setup, "
                     "or apt-get install libfaketime")


def environment(offset_file: Path) -> dict[str, str]:
    """Environment for a process whose wall clock follows `offset_file` (created at +0 if absent)."""
    lib = library()
    if not offset_file.exists():
        set_offset(offset_file, 0)
    return {"LD_PRELOAD": str(lib), "FAKETIME_TIMESTAMP_FILE": str(offset_file),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_CACHE_DURATION": "1"}


def set_offset(offset_file: Path, seconds: int) -> None:
    """Offset the wall clock by whole `seconds` (libfaketime's relative format: +N or -N)."""
    tmp = offset_file.with_suffix(".tmp")
    tmp.write_text(f"{int(seconds):+d}\n")
    os.replace(tmp, offset_file)
