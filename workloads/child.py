"""A client of the harness in a process of its own, so that a nemesis can SIGKILL it as it would an
application's: no close, no flush, no leave.

Child side: `serve(start, handle)` reads the setup, makes the process die with its parent
(PR_SET_PDEATHSIG: a harness killed with SIGKILL leaves no client behind), writes its pid to
`pid_file` once it runs (the client nemeses find it there), builds the client (`start(setup)`) and
answers each command with `handle(client, command)`: `{"error": text}` for a Kafka error, and
after `close` it ends. Parent side: `Child` starts `python -m <module>`, hands it its
setup (the first line on its stdin), and asks it commands, one JSON object a line each way;
`ChildGone` says the process is dead or did not answer in time.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import KafkaException

PR_SET_PDEATHSIG = 1


class ChildGone(Exception):
    """The client's process is dead, or did not answer in time."""


def become_child(pid_file: str | None) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() == 1:  # the parent died before the prctl took
        os._exit(1)
    if pid_file:
        write_atomically(pid_file, str(os.getpid()))


def write_atomically(path: str, text: str) -> None:
    """Write `path` under a temporary name, then rename it: a reader (a client nemesis) sees the
    old text or the new, never half of it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def serve(start: Callable[[dict], Any], handle: Callable[[Any, dict], dict]) -> None:
    setup = json.loads(sys.stdin.readline())
    become_child(setup.get("pid_file"))
    client = start(setup)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = handle(client, cmd)
        except (KafkaException, RuntimeError) as exc:
            answer = {"error": str(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        if cmd["f"] == "close":
            return


class Child:
    """One client process: `python -m module`, its pid in `pid_file` (None: nowhere), librdkafka's
    log lines beside it (`.log`), and what it holds, if it says (`.keys`)."""

    def __init__(self, module: str, pid_file: Path | None):
        self.module = module
        self.pid_file = pid_file
        self.proc: subprocess.Popen | None = None

    def start(self, setup: dict) -> None:
        if self.pid_file is not None:
            self.pid_file.parent.mkdir(parents=True, exist_ok=True)
            # A killed predecessor's keys are not this process's.
            self.pid_file.with_suffix(".keys").unlink(missing_ok=True)
        log = open(self.pid_file.with_suffix(".log"), "a") if self.pid_file is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", self.module], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        self.proc.stdin.write(json.dumps({**setup, "pid_file": str(self.pid_file or "")}) + "\n")
        self.proc.stdin.flush()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ask(self, cmd: dict, timeout: float) -> dict:
        if not self.alive:
            raise ChildGone("the client's process is not running")
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ChildGone(f"writing to the client's process failed: {exc}") from exc
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else None
        if not line:
            raise ChildGone("the client's process died" if ready else f"no answer within {timeout:g}s")
        return json.loads(line)

    def close(self, timeout: float = 10) -> None:
        """Ask it to close; kill it if it will not; forget its pid file (and the keys it said it held)."""
        if self.proc is not None:
            try:
                self.ask({"f": "close"}, timeout)
            except ChildGone:
                pass
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            self.proc = None
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)
            self.pid_file.with_suffix(".keys").unlink(missing_ok=True)
