"""One node of the local backend: a `Remote` whose commands run inside a network namespace.

In: the node's name, IPv4 address, namespace and home folder, and what to
call when its set of daemons changes (the cluster saves its state then).
Out: a `NamespaceRemote` that runs commands and daemons through
`ip netns exec`, each daemon in a process group of its own so kill, stop,
pause and resume reach everything it started; the node shares this
machine's file system, so upload and download are copies.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .processes import _cmdline_raw, process_state
from .remote import (DEFAULT_RUN_TIMEOUT, DEFAULT_STOP_TIMEOUT, AlreadyRunning, CommandFailed, CommandTimeout,
                     NotRunning, Remote, RemoteError)
from .wait import wait_until

log = logging.getLogger("faultline.control")


@dataclass
class _Daemon:
    proc: subprocess.Popen
    cmd: list[str]
    log_path: Path
    started_at: float = field(default_factory=time.time)


class NamespaceRemote(Remote):
    """A node that is a network namespace on this machine; files are shared, so upload/download are copies."""

    # The node shares this machine's programs: the harness's own Python, and its java.
    python = sys.executable
    java = shutil.which("java") or "/usr/bin/java"

    def __init__(self, name: str, address: str, namespace: str, home: Path,
                 on_change: Callable[[], None] | None = None):
        self.name = name
        self.address = address
        self.namespace = namespace
        self.home = home
        self._on_change = on_change or (lambda: None)
        self._daemons: dict[str, _Daemon] = {}
        self._lock = threading.RLock()

    # -- commands

    def _wrap(self, cmd: Sequence[str], host_mounts: bool = False) -> list[str]:
        if isinstance(cmd, (str, bytes)):
            raise TypeError(f"cmd must be a list of arguments, not a string: {cmd!r}")
        if not cmd:
            raise ValueError("cmd must not be empty")
        if host_mounts:
            # `ip netns exec` gives each command a mount namespace of its own, so a mount made
            # there would be invisible to the node's other processes: enter the harness's.
            cmd = ["nsenter", f"--mount=/proc/{os.getpid()}/ns/mnt", "--", *cmd]
        return ["ip", "netns", "exec", self.namespace, *map(str, cmd)]

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        merged = dict(os.environ)
        if env:
            merged.update({str(k): str(v) for k, v in env.items()})
        return merged

    def _path(self, path: Path | str) -> Path:
        path = Path(path)
        return path if path.is_absolute() else self.home / path

    def run(self, cmd: Sequence[str], timeout: float = DEFAULT_RUN_TIMEOUT, check: bool = True,
            input: str | None = None, env: dict[str, str] | None = None,
            host_mounts: bool = False) -> subprocess.CompletedProcess:
        wrapped = self._wrap(cmd, host_mounts)
        # Its own session, so a timeout can kill everything the command started.
        proc = subprocess.Popen(wrapped, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                env=self._env(env), cwd=self.home, start_new_session=True)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise CommandTimeout(self.name, list(map(str, cmd)), timeout, out, err) from None
        result = subprocess.CompletedProcess(list(map(str, cmd)), proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise CommandFailed(self.name, proc.returncode, result.args, out, err)
        return result

    # -- daemons

    def spawn(self, name: str, cmd: Sequence[str], log_path: Path | str,
              env: dict[str, str] | None = None, host_mounts: bool = False) -> int:
        wrapped = self._wrap(cmd, host_mounts)
        merged_env = self._env(env)
        program = str(cmd[0])
        # `ip netns exec` would report a missing program only in the log; say so here instead.
        if shutil.which(program, path=merged_env.get("PATH")) is None:
            raise FileNotFoundError(f"on {self.name}: cannot start daemon {name!r}: no program {program!r}")
        log_path = self._path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.pid(name) is not None:
                raise AlreadyRunning(f"on {self.name}: daemon {name!r} is already running "
                                     f"(pid {self._daemons[name].proc.pid})")
            with open(log_path, "ab") as log_file:
                # `ip netns exec` execs the command itself, so this pid is the
                # daemon's, and start_new_session makes it the leader of its
                # own session and process group (pgid == pid).
                proc = subprocess.Popen(wrapped, stdin=subprocess.DEVNULL, stdout=log_file,
                                        stderr=subprocess.STDOUT, env=merged_env, cwd=self.home,
                                        start_new_session=True)
            self._daemons[name] = _Daemon(proc, list(map(str, cmd)), log_path)
            # Until `ip` has entered the namespace and exec'd the command, a
            # signal (a pause, say) would catch `ip` outside the namespace
            # instead of the daemon. Popen returns while the kernel is still
            # inside execve of `ip` (cmdline empty), then `ip` runs (cmdline
            # is `ip netns exec ...`), then the daemon's own cmdline appears.
            wrapper = "\0".join(wrapped) + "\0"
            wait_until(lambda: proc.poll() is not None or _cmdline_raw(proc.pid) not in ("", wrapper), 10,
                       f"on {self.name}: `ip netns exec {self.namespace}` did not exec daemon {name!r}")
        log.debug("%s: spawned %s (pid %d): %s", self.name, name, proc.pid, cmd)
        self._on_change()
        return proc.pid

    def pid(self, name: str) -> int | None:
        with self._lock:
            daemon = self._daemons.get(name)
        if daemon is None or daemon.proc.poll() is not None:
            return None
        return daemon.proc.pid

    def daemons(self) -> dict[str, dict]:
        """name -> {pid, running, cmd, log} for every daemon this remote remembers."""
        with self._lock:
            items = list(self._daemons.items())
        return {name: {"pid": d.proc.pid, "running": d.proc.poll() is None, "cmd": d.cmd, "log": str(d.log_path)}
                for name, d in items}

    def _signal_group(self, daemon: _Daemon, sig: int) -> bool:
        try:
            os.killpg(daemon.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _reap(self, daemon: _Daemon, what: str, timeout: float = 10) -> None:
        try:
            daemon.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"on {self.name}: {what} (pid {daemon.proc.pid}) did not exit after SIGKILL "
                              f"within {timeout:g}s; it may be stuck in uninterruptible sleep") from None

    # kill and stop wait without holding the lock, so pid() of other daemons
    # (a readiness probe, say) is never blocked behind a slow shutdown.

    def kill(self, name: str) -> None:
        daemon = self._get(name)
        if daemon is None:
            return
        # Always signal the group: the leader may have exited and left children behind.
        self._signal_group(daemon, signal.SIGKILL)
        self._reap(daemon, f"daemon {name!r}")
        log.debug("%s: killed %s (pid %d)", self.name, name, daemon.proc.pid)
        self._drop(name, daemon)

    def stop(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        daemon = self._get(name)
        if daemon is None:
            return None
        if daemon.proc.poll() is None:
            self._signal_group(daemon, signal.SIGTERM)
            # A paused daemon would hold SIGTERM pending forever.
            self._signal_group(daemon, signal.SIGCONT)
            try:
                daemon.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s: daemon %s (pid %d) ignored SIGTERM for %gs; sending SIGKILL",
                            self.name, name, daemon.proc.pid, timeout)
                self._signal_group(daemon, signal.SIGKILL)
                self._reap(daemon, f"daemon {name!r}")
        # Whatever the leader left running in its group goes too.
        self._signal_group(daemon, signal.SIGKILL)
        self._drop(name, daemon)
        return daemon.proc.returncode

    def pause(self, name: str) -> None:
        daemon = self._get(name)
        if daemon is None or daemon.proc.poll() is not None:
            raise NotRunning(f"on {self.name}: cannot pause daemon {name!r}: it is not running")
        self._signal_group(daemon, signal.SIGSTOP)
        pid = daemon.proc.pid
        # SIGSTOP takes effect asynchronously; once this returns the daemon is known to be stopped.
        wait_until(lambda: process_state(pid) in ("T", "t", "Z", None), 10,
                   f"on {self.name}: daemon {name!r} (pid {pid}) did not stop after SIGSTOP", interval=0.005)

    def resume(self, name: str) -> bool:
        daemon = self._get(name)
        if daemon is None:
            return False
        # Even when the leader has exited, stopped members of its group would otherwise stay stopped.
        delivered = self._signal_group(daemon, signal.SIGCONT)
        if daemon.proc.poll() is not None:
            return False
        pid = daemon.proc.pid
        wait_until(lambda: process_state(pid) not in ("T", "t"), 10,
                   f"on {self.name}: daemon {name!r} (pid {pid}) stayed stopped after SIGCONT", interval=0.005)
        return delivered

    def _forget_all(self, timeout: float = 10) -> None:
        """Reap every daemon after the namespace's processes were killed, so none stays a zombie."""
        with self._lock:
            daemons, self._daemons = list(self._daemons.values()), {}
        for daemon in daemons:
            self._signal_group(daemon, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(timeout)

    # -- files

    def upload(self, local: Path | str, remote_path: Path | str) -> None:
        _copy(Path(local), self._path(remote_path), f"upload to {self.name}")

    def download(self, remote_path: Path | str, local: Path | str) -> None:
        _copy(self._path(remote_path), Path(local), f"download from {self.name}")

    def close(self) -> None:
        pass


def _copy(src: Path, dst: Path, what: str) -> None:
    if not src.exists():
        raise FileNotFoundError(errno.ENOENT, f"{what}: no such file or directory", str(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)
