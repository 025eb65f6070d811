"""A progress line for long tasks: elapsed time, phase, operation counts.

In: a function returning the current state as text. Out: that text on
stderr every few seconds (rewritten in place on a terminal), until stopped.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


class Progress:
    def __init__(self, describe: Callable[[], str], interval: float | None = None, stream=sys.stderr):
        self.describe = describe
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval if interval is not None else (1.0 if self.tty else 5.0)
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)
        self._print(final=True)

    def _print(self, final: bool = False) -> None:
        line = f"[{time.monotonic() - self.started:7.1f}s] {self.describe()}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._print()

    def note(self, text: str) -> None:
        """A one-off message that does not disturb the progress line."""
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        self.stream.flush()
