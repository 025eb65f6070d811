"""One node, as the harness sees it: the `Remote` interface every backend implements.

In: a node (a local network namespace, a Docker container, an SSH host) and
the commands to run there. Out: command results (`CompletedProcess` with
text stdout/stderr), pids of long-running daemons the remote remembers by
name, signals delivered to a daemon's whole process group (kill, stop,
pause, resume), and files copied to and from the node.

As in Jepsen, the interface is small and the same for every backend, so
nemeses and the broker adapter never know where a node lives. Paths on the
node are absolute, or relative to the node's `home`.

Errors say which node and which command: `CommandFailed` (a
`subprocess.CalledProcessError` whose text includes stderr),
`CommandTimeout` (a `subprocess.TimeoutExpired`), `NotRunning` and
`AlreadyRunning`.
"""

from __future__ import annotations

import shlex
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Sequence

DEFAULT_RUN_TIMEOUT = 60.0
DEFAULT_STOP_TIMEOUT = 20.0


def _tail(text: str | bytes | None, limit: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


class RemoteError(RuntimeError):
    """Something a node could not do; the text names the node."""


class CommandFailed(RemoteError, subprocess.CalledProcessError):
    """A command run on a node exited non-zero (and `check` was set)."""

    def __init__(self, node: str, returncode: int, cmd: Sequence[str], output: str | None, stderr: str | None):
        subprocess.CalledProcessError.__init__(self, returncode, list(cmd), output, stderr)
        self.node = node

    def __str__(self) -> str:
        text = f"on {self.node}: `{shlex.join(self.cmd)}` exited with status {self.returncode}"
        err, out = _tail(self.stderr), _tail(self.output)
        if err:
            text += f"; stderr:\n{err}"
        elif out:
            text += f"; stdout (stderr was empty):\n{out}"
        return text


class CommandTimeout(RemoteError, subprocess.TimeoutExpired):
    """A command run on a node did not finish in time; it (and its process group) was killed."""

    def __init__(self, node: str, cmd: Sequence[str], timeout: float, output: str | None = None,
                 stderr: str | None = None):
        subprocess.TimeoutExpired.__init__(self, list(cmd), timeout, output, stderr)
        self.node = node

    def __str__(self) -> str:
        text = f"on {self.node}: `{shlex.join(self.cmd)}` did not finish within {self.timeout:g}s and was killed"
        err = _tail(self.stderr)
        if err:
            text += f"; stderr so far:\n{err}"
        return text


class NotRunning(RemoteError):
    """A daemon that had to be running (e.g. to pause it) is not."""


class AlreadyRunning(RemoteError):
    """A daemon with this name is still running; kill or stop it before spawning another."""


class Remote(ABC):
    """One node. Daemons are long-running processes the remote remembers by name.

    Every daemon runs in its own session and process group, so signals reach
    the processes it starts too, and none of them shares the harness's
    terminal or process group (a Ctrl-C to the harness does not reach them).
    """

    #: the node's name, e.g. "n1"
    name: str
    #: the IP address clients (and other nodes) use to reach this node
    address: str
    #: the node's working directory; relative paths on the node resolve against it
    home: Path
    #: the Python interpreter on the node that has faultline installed (the reference broker, the
    #: power-loss file system run on it)
    python: str
    #: the node's java launcher (ZooKeeper, Apache Kafka)
    java: str

    @abstractmethod
    def run(self, cmd: Sequence[str], timeout: float = DEFAULT_RUN_TIMEOUT, check: bool = True,
            input: str | None = None, env: dict[str, str] | None = None,
            host_mounts: bool = False) -> subprocess.CompletedProcess:
        """Run `cmd` on the node and wait for it; stdout and stderr are captured as text.

        `host_mounts`: as for `spawn` (to unmount what a daemon mounted, say).
        `env` adds to (does not replace) the environment. Raises `CommandFailed`
        on a non-zero exit unless `check=False`, and `CommandTimeout` (after
        killing the command's process group) when `timeout` passes.
        """

    @abstractmethod
    def spawn(self, name: str, cmd: Sequence[str], log_path: Path | str,
              env: dict[str, str] | None = None, host_mounts: bool = False) -> int:
        """Start `cmd` as the daemon `name`, stdout and stderr appended to `log_path`; return its pid.

        With `host_mounts`, a file system the daemon mounts is seen by processes started on the
        node afterwards (a node that gives each command a mount namespace of its own must run
        this one in the node's shared one). Raises `AlreadyRunning` if a daemon called `name`
        still runs.
        """

    @abstractmethod
    def pid(self, name: str) -> int | None:
        """The pid of daemon `name`, or None if it was never started or is no longer running.

        A paused daemon is still running.
        """

    @abstractmethod
    def kill(self, name: str) -> None:
        """SIGKILL the daemon's whole process group and reap it. A no-op if it is not running."""

    @abstractmethod
    def stop(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        """SIGTERM the daemon's process group and wait; SIGKILL it if it outlives `timeout`.

        Returns the exit status as `subprocess` reports it (negative: killed by
        that signal); for a daemon that had already exited by itself, the status
        it exited with; None if there was no such daemon (or it was killed).
        """

    @abstractmethod
    def pause(self, name: str) -> None:
        """SIGSTOP the daemon's process group. Raises `NotRunning` if it is not running."""

    @abstractmethod
    def resume(self, name: str) -> bool:
        """SIGCONT the daemon's process group; False (and nothing done) if it is not running.

        Never raises for a missing daemon, because resuming is a repair and
        repairs must always be safe to attempt.
        """

    @abstractmethod
    def upload(self, local: Path | str, remote_path: Path | str) -> None:
        """Copy a local file or directory to `remote_path` on the node, creating parent directories."""

    @abstractmethod
    def download(self, remote_path: Path | str, local: Path | str) -> None:
        """Copy a file or directory from the node to `local`, creating parent directories."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection to the node. Daemons keep running; the cluster's teardown ends them."""

    # -- the daemons a remote remembers by name: its subclasses keep them in `_daemons`, under
    # `_lock`, and call `_on_change` when the set changes (the cluster saves its record then).

    def _get(self, name: str):
        with self._lock:
            return self._daemons.get(name)

    def _drop(self, name: str, daemon) -> None:
        with self._lock:
            # A respawn may already have replaced it.
            if self._daemons.get(name) is daemon:
                del self._daemons[name]
        self._on_change()

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.address}>"
