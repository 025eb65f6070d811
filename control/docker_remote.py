"""One node of the Docker backend: a `Remote` whose commands run inside a container.

In: a docker SDK client, the node's container id, name and IPv4 address, and
its home folder (a folder of this machine, bind-mounted into the container at
the same path, so node files the db layer writes or reads are the
container's own). Out: a `DockerRemote`: `run` and `spawn` are `docker exec`s
through the Engine API (the `docker` package); every exec is the leader of
its own session and process group inside the container, so kill, stop, pause
and resume signal the whole group with `kill -SIG -PID` run in the
container; upload and download are the API's tar archives.

A daemon is an exec whose shell writes its pid (in the container's pid
namespace) to a file, then execs the command with its output appended to
the log. Docker keeps the exec's state, so `pid` asks the API whether it
still runs and `stop` returns the status Docker reports (128+N, for a death
by signal N, is given as -N, as `subprocess` would). The container's init
(`docker run --init`) reaps whatever a killed daemon leaves.
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Sequence

from .remote import (DEFAULT_RUN_TIMEOUT, DEFAULT_STOP_TIMEOUT, AlreadyRunning, CommandFailed, CommandTimeout,
                     NotRunning, Remote, RemoteError)
from .wait import wait_until

log = logging.getLogger("faultline.control")

#: Where, inside every node container, the node's own files of the harness live (pid files, stdin).
STATE_DIR = "/run/faultline"
#: The virtual environment the node image installs faultline into (docker/Dockerfile).
NODE_PYTHON = "/opt/faultline/bin/python"

# $0: pid file, $1: log; the rest is the command. A missing program is told by exit status 127
# before anything is started, so `spawn` can say so at once instead of in the log.
_SPAWN = ('mkdir -p "$(dirname "$1")" && command -v "$2" >/dev/null 2>&1 || exit 127; '
          'echo $$ > "$0"; log=$1; shift; exec "$@" >>"$log" 2>&1')
# $0: pid file; $1: a file for stdin ("" for none); the rest is the command.
_RUN = 'echo $$ > "$0"; if [ -n "$1" ]; then exec <"$1"; fi; shift; exec "$@"'


@dataclass
class _Daemon:
    exec_id: str
    pid: int
    cmd: list[str]
    log_path: Path


def _status(code: int | None) -> int | None:
    # Docker reports a death by signal N as 128+N.
    if code is None:
        return None
    return -(code - 128) if code > 128 else code


class DockerRemote(Remote):
    """A node that is a container; its home is bind-mounted from this machine at the same path."""

    python = NODE_PYTHON
    java = "java"

    def __init__(self, client, container_id: str, name: str, address: str, home: Path,
                 on_change: Callable[[], None] | None = None):
        self.api = client.api
        self.container_id = container_id
        self.name = name
        self.address = address
        self.home = home
        self._on_change = on_change or (lambda: None)
        self._daemons: dict[str, _Daemon] = {}
        self._lock = threading.RLock()

    def _path(self, path: Path | str) -> Path:
        path = Path(path)
        return path if path.is_absolute() else self.home / path

    @staticmethod
    def _args(cmd: Sequence[str]) -> list[str]:
        if isinstance(cmd, (str, bytes)):
            raise TypeError(f"cmd must be a list of arguments, not a string: {cmd!r}")
        if not cmd:
            raise ValueError("cmd must not be empty")
        return [str(c) for c in cmd]

    def _exec(self, cmd: list[str], env: dict[str, str] | None, detach: bool = False) -> str:
        return self.api.exec_create(self.container_id, cmd, stdout=not detach, stderr=not detach,
                                    environment={str(k): str(v) for k, v in (env or {}).items()} or None,
                                    workdir=str(self.home))["Id"]

    def _sh(self, script: str, *args: str, timeout: float = 30) -> tuple[int, str, str]:
        """A short shell command of the harness's own (signals, probes): (status, stdout, stderr)."""
        exec_id = self._exec(["sh", "-c", script, "sh", *args], None)
        out, err = self._start(exec_id, timeout, ["sh", "-c", script])
        return self.api.exec_inspect(exec_id)["ExitCode"], out, err

    def _start(self, exec_id: str, timeout: float, cmd: list[str], on_timeout: Callable[[], None] = lambda: None):
        result: dict = {}

        def start() -> None:
            try:
                result["output"] = self.api.exec_start(exec_id, demux=True)
            except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread
                result["error"] = exc

        thread = threading.Thread(target=start, name=f"exec {self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            on_timeout()
            thread.join(10)
            out, err = (result.get("output") or (None, None))
            raise CommandTimeout(self.name, cmd, timeout, _text(out), _text(err))
        if "error" in result:
            raise RemoteError(f"on {self.name}: `{shlex.join(cmd)}` could not be run: {result['error']}")
        out, err = result["output"]
        return _text(out), _text(err)

    # -- commands

    def run(self, cmd: Sequence[str], timeout: float = DEFAULT_RUN_TIMEOUT, check: bool = True,
            input: str | None = None, env: dict[str, str] | None = None,
            host_mounts: bool = False) -> subprocess.CompletedProcess:
        # host_mounts needs nothing here: every process of a container shares its mount namespace.
        args = self._args(cmd)
        token = uuid.uuid4().hex
        pidfile = f"{STATE_DIR}/run-{token}.pid"
        stdin = ""
        if input is not None:
            stdin = f"{STATE_DIR}/run-{token}.in"
            self._put_bytes(stdin, input.encode())
        exec_id = self._exec(["sh", "-c", _RUN, pidfile, stdin, *args], env)

        def kill_group() -> None:
            # Everything the command started is in its process group.
            self._sh('kill -KILL -"$(cat "$1")" 2>/dev/null; rm -f "$1"', pidfile)

        try:
            out, err = self._start(exec_id, timeout, args, kill_group)
        finally:
            if input is not None:
                self._sh('rm -f "$1"', stdin)
        code = self.api.exec_inspect(exec_id)["ExitCode"]
        result = subprocess.CompletedProcess(args, code, out, err)
        if check and code != 0:
            raise CommandFailed(self.name, code, args, out, err)
        return result

    # -- daemons

    def spawn(self, name: str, cmd: Sequence[str], log_path: Path | str,
              env: dict[str, str] | None = None, host_mounts: bool = False) -> int:
        args = self._args(cmd)
        log_path = self._path(log_path)
        pidfile = f"{STATE_DIR}/{name}.pid"
        with self._lock:
            if self.pid(name) is not None:
                raise AlreadyRunning(f"on {self.name}: daemon {name!r} is already running "
                                     f"(pid {self._daemons[name].pid})")
            self._sh('mkdir -p "$(dirname "$1")"; rm -f "$1"', pidfile)
            exec_id = self._exec(["sh", "-c", _SPAWN, pidfile, str(log_path), *args], env, detach=True)
            self.api.exec_start(exec_id, detach=True)

            def started() -> int | str | None:
                state = self.api.exec_inspect(exec_id)
                if not state["Running"] and state["ExitCode"] == 127:
                    return "missing"  # wait_until takes exceptions for "not yet": raised below
                code, out, _ = self._sh('cat "$1" 2>/dev/null', pidfile)
                return int(out) if code == 0 and out.strip().isdigit() else None

            pid = wait_until(started, 10, f"on {self.name}: daemon {name!r} did not start")
            if pid == "missing":
                raise FileNotFoundError(f"on {self.name}: cannot start daemon {name!r}: no program {args[0]!r}")
            self._daemons[name] = _Daemon(exec_id, pid, args, log_path)
        log.debug("%s: spawned %s (pid %d): %s", self.name, name, pid, args)
        self._on_change()
        return pid

    def _running(self, daemon: _Daemon) -> bool:
        try:
            return bool(self.api.exec_inspect(daemon.exec_id)["Running"])
        except Exception:  # noqa: BLE001 - a container that is gone runs nothing
            return False

    def pid(self, name: str) -> int | None:
        with self._lock:
            daemon = self._daemons.get(name)
        if daemon is None or not self._running(daemon):
            return None
        return daemon.pid

    def daemons(self) -> dict[str, dict]:
        """name -> {pid, running, cmd, log} for every daemon this remote remembers."""
        with self._lock:
            items = list(self._daemons.items())
        return {name: {"pid": d.pid, "running": self._running(d), "cmd": d.cmd, "log": str(d.log_path)}
                for name, d in items}

    def _signal_group(self, daemon: _Daemon, sig: str) -> bool:
        # dash, the node's sh, takes no `--`: "-PID" after the signal is the process group.
        code, _, _ = self._sh(f'kill -{sig} -"$1" 2>/dev/null', str(daemon.pid))
        return code == 0

    def _wait_exit(self, daemon: _Daemon, timeout: float) -> bool:
        """Whether the daemon exited within `timeout`."""
        try:
            wait_until(lambda: not self._running(daemon), timeout, "exit", interval=0.02)
            return True
        except TimeoutError:
            return False

    def kill(self, name: str) -> None:
        daemon = self._get(name)
        if daemon is None:
            return
        self._signal_group(daemon, "KILL")
        if not self._wait_exit(daemon, 10):
            raise RemoteError(f"on {self.name}: daemon {name!r} (pid {daemon.pid}) did not exit after SIGKILL "
                              f"within 10s; it may be stuck in uninterruptible sleep")
        log.debug("%s: killed %s (pid %d)", self.name, name, daemon.pid)
        self._drop(name, daemon)

    def stop(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        daemon = self._get(name)
        if daemon is None:
            return None
        if self._running(daemon):
            self._signal_group(daemon, "TERM")
            # A paused daemon would hold SIGTERM pending forever.
            self._signal_group(daemon, "CONT")
            if not self._wait_exit(daemon, timeout):
                log.warning("%s: daemon %s (pid %d) ignored SIGTERM for %gs; sending SIGKILL",
                            self.name, name, daemon.pid, timeout)
                self._signal_group(daemon, "KILL")
                if not self._wait_exit(daemon, 10):
                    raise RemoteError(f"on {self.name}: daemon {name!r} (pid {daemon.pid}) did not exit "
                                      f"after SIGKILL within 10s")
        # Whatever the leader left running in its group goes too.
        self._signal_group(daemon, "KILL")
        self._drop(name, daemon)
        return _status(self.api.exec_inspect(daemon.exec_id).get("ExitCode"))

    def _state(self, pid: int) -> str | None:
        code, out, _ = self._sh('cat "/proc/$1/stat" 2>/dev/null', str(pid))
        if code != 0 or ")" not in out:
            return None
        return out.rsplit(")", 1)[1].split()[0]

    def pause(self, name: str) -> None:
        daemon = self._get(name)
        if daemon is None or not self._running(daemon):
            raise NotRunning(f"on {self.name}: cannot pause daemon {name!r}: it is not running")
        self._signal_group(daemon, "STOP")
        # SIGSTOP takes effect asynchronously; once this returns the daemon is known to be stopped.
        wait_until(lambda: self._state(daemon.pid) in ("T", "t", "Z", None), 10,
                   f"on {self.name}: daemon {name!r} (pid {daemon.pid}) did not stop after SIGSTOP",
                   interval=0.01)

    def resume(self, name: str) -> bool:
        daemon = self._get(name)
        if daemon is None:
            return False
        delivered = self._signal_group(daemon, "CONT")
        if not self._running(daemon):
            return False
        wait_until(lambda: self._state(daemon.pid) not in ("T", "t"), 10,
                   f"on {self.name}: daemon {name!r} (pid {daemon.pid}) stayed stopped after SIGCONT",
                   interval=0.01)
        return delivered

    def _forget_all(self) -> None:
        """Forget every daemon (the container is being removed, and its processes with it)."""
        with self._lock:
            self._daemons = {}

    # -- files

    def _put_bytes(self, path: str, data: bytes) -> None:
        target = PurePosixPath(path)
        self._sh('mkdir -p "$1"', str(target.parent))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(target.name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
        self.api.put_archive(self.container_id, str(target.parent), buffer.getvalue())

    def upload(self, local: Path | str, remote_path: Path | str) -> None:
        local, target = Path(local), self._path(remote_path)
        if not local.exists():
            raise FileNotFoundError(f"upload to {self.name}: no such file or directory: {local}")
        self._sh('mkdir -p "$1"', str(target.parent))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(str(local), arcname=target.name)
        if not self.api.put_archive(self.container_id, str(target.parent), buffer.getvalue()):
            raise RemoteError(f"upload to {self.name}: Docker refused the archive for {target}")

    def download(self, remote_path: Path | str, local: Path | str) -> None:
        import docker.errors

        source, local = self._path(remote_path), Path(local)
        try:
            stream, _ = self.api.get_archive(self.container_id, str(source))
        except docker.errors.NotFound:
            raise FileNotFoundError(f"download from {self.name}: no such file or directory: {source}") from None
        local.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=local.parent, prefix=".download-") as tmp:
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as tar:
                tar.extractall(tmp, filter="data")
            fetched = Path(tmp) / source.name
            if fetched.is_dir():
                shutil.copytree(fetched, local, dirs_exist_ok=True)
            else:
                os.replace(fetched, local)

    def close(self) -> None:
        pass


def _text(data: bytes | None) -> str:
    return data.decode(errors="replace") if data else ""
