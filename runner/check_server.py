"""A check server: one warm Spark session kept between `faultline check` calls.

A check's JVM starts cold: most of a small history's check is Spark planning and compiling in a
JVM whose code is not yet compiled (a synthetic history of 1.5k operations: 17 s from a fresh
process, 4.5 s in a session that has checked a few; a default run's 5 MB history: 17-29 s and
9-10 s). The server keeps such a session, warmed up on synthetic histories when it starts, and
checks what `faultline check` and `faultline run` send it. A run without a user's server starts
one of its own (`RunServer`: private socket, lowest CPU priority, ending with the run's harness)
to warm up while the run runs.

In: requests over a Unix socket at `socket_path()` (0600, in a 0700 folder), one JSON line each:
`{"op": "check", "paths": [...], "spark_master": ..., "model": ..., "report": ...}`,
`{"op": "status"}` (pid, master, checks served, queued, whether still warming up and the warm-up
checks done) or `{"op": "stop"}`. Out, on the same connection, JSON lines: for a check,
`{"progress": text}` while it runs, then `{"results": [[folder, results], ...]}` (the server
has also written results.json and report.html, as an in-process check would) or
`{"error": text}`; a status or stop request gets one line. A check asked of another Spark master
than the server's is refused (`{"refused": why}`); the client then checks in its own process.

Status and stop requests are answered at once; checks are served one at a time, in the order
they come, and a queued client hears every second where it stands. The server listens from the
moment its Spark session has started: a check that comes during the warm-up cancels the warm-up's
Spark jobs and is served next. The server exits after `idle_timeout` seconds without a request,
on a stop request, or on SIGTERM/SIGINT, and removes its socket. The client side
(`checked_by_server`) gives up, and the check runs in the client's own process, when no server
answers, when the server fails the check, goes away during it, or says nothing for SILENCE_LIMIT
seconds.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..checker.check import Checked, check_paths
from ..control.wait import wait_until

SOCKET_ENV = "FAULTLINE_CHECK_SERVER"
SILENCE_LIMIT = 120.0
log = logging.getLogger("faultline.check_server")


def socket_path() -> Path:
    """$FAULTLINE_CHECK_SERVER, else ~/.cache/faultline/check-server/socket."""
    env = os.environ.get(SOCKET_ENV)
    return Path(env) if env else Path.home() / ".cache" / "faultline" / "check-server" / "socket"


def log_path(sock: Path) -> Path:
    return sock.with_name(sock.name + ".log")


def _connect(sock: Path, timeout: float | None) -> socket.socket | None:
    """A connection to the server at `sock`, or None when none listens there."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(sock))
    except (FileNotFoundError, ConnectionRefusedError, OSError):
        s.close()
        return None
    return s


def _lines(conn: socket.socket):
    """The JSON lines the other side sends, until it closes the connection."""
    with conn.makefile("r", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _tell(conn: socket.socket, message: dict) -> bool:
    """The server's `_send`: False when the client has gone (what it asked is done all the same)."""
    try:
        _send(conn, message)
        return True
    except OSError:
        return False


def ask(message: dict, sock: Path | None = None, timeout: float | None = 10.0) -> dict | None:
    """One request with a one-line answer (status, stop): the answer, or None without a server."""
    conn = _connect(sock or socket_path(), timeout)
    if conn is None:
        return None
    try:
        _send(conn, message)
        for answer in _lines(conn):
            return answer
        return None
    except OSError:
        return None
    finally:
        conn.close()


def serving(spark_master: str, sock: Path | None = None) -> dict | None:
    """The status of the server at `sock` (default socket_path()) when it runs with `spark_master` (so it
    would take a check), else None."""
    answer = ask({"op": "status"}, sock)
    return answer if answer is not None and answer.get("spark_master") == spark_master else None


def checked_by_server(paths: list[str | Path], spark_master: str, model: str | None, report: bool,
                      progress: Callable[[str], None] | None = None,
                      sock: Path | None = None) -> list[Checked] | None:
    """The check of `paths` by the server at `sock` (default socket_path()), or None when no server takes
    it (none runs, another master, or it went away before answering: then nothing it may have written
    is relied on)."""
    # The server says how it is doing every second while it checks; this long without a word, it is
    # taken for hung and the check runs here.
    conn = _connect(sock or socket_path(), SILENCE_LIMIT)
    if conn is None:
        return None
    try:
        _send(conn, {"op": "check", "paths": [str(Path(p).resolve()) for p in paths], "spark_master": spark_master,
                     "model": model, "report": report})
        for answer in _lines(conn):
            if "progress" in answer:
                if progress:
                    progress(answer["progress"])
            elif "results" in answer:
                return [Checked(Path(d), r) for d, r in answer["results"]]
            elif "refused" in answer:
                log.info("the check server refused the check: %s", answer["refused"])
                return None
            elif "error" in answer:
                log.warning("the check server failed (%s); checking here instead", answer["error"])
                return None
        log.warning("the check server went away during the check; checking here instead")
        return None
    except (OSError, ValueError) as exc:
        log.warning("the check server's connection failed (%s); checking here instead", exc)
        return None
    finally:
        conn.close()


# --- the server ---------------------------------------------------------------------------------

# The warm-up's synthetic histories, in operations: one that runs compiled (3,000 operations, 1.2 MB,
# as a default run's 5 MB history does) and one that runs interpreted (600, 0.2 MB: under
# session.INTERPRETED_INPUT_BYTES), so both kinds of check find their code compiled.
WARM_UP_OPERATIONS = (3000, 600, 3000)
WARM_UP_CHECKS = len(WARM_UP_OPERATIONS)


# The Spark jobs of the warm-up carry this tag, so that a real check can cancel them (cancel_warm_up).
WARM_UP_TAG = "faultline-warm-up"


def _warm_up(spark, say: Callable[[str], None], halt: Callable[[], str | None] = lambda: None) -> int:
    """Check small synthetic histories, so the JVM has compiled the analysis's hot code before the
    first real check (a default run's 5 MB history: 17-29 s in a fresh JVM, 9-10 s after a few
    checks; README). Before each, `halt()` is asked; a reason (a real check is waiting, the server
    is stopping) ends the warm-up there, as does a warm-up check whose jobs were cancelled. Returns
    the warm-up checks done."""
    # A cancelled warm-up check is a failed check to the checker, which logs it with Spark's trace.
    checker_log = logging.getLogger("faultline.checker")
    level = checker_log.level
    checker_log.setLevel(logging.CRITICAL)
    try:
        return _warm_up_checks(spark, say, halt)
    finally:
        checker_log.setLevel(level)


def _warm_up_checks(spark, say: Callable[[str], None], halt: Callable[[], str | None]) -> int:
    from ..models.synthetic_history import write_history

    context, done = spark.sparkContext, 0
    with tempfile.TemporaryDirectory(prefix="faultline-check-server-") as tmp:
        for i, operations in enumerate(WARM_UP_OPERATIONS):
            if (why := halt()) is not None:
                say(f"warm-up ended after {done} check(s): {why}")
                break
            run = Path(tmp) / f"run{i}"
            run.mkdir()
            write_history(run / "history.jsonl", operations, processes=4, keys=5)
            started = time.monotonic()
            context.addJobTag(WARM_UP_TAG)
            try:
                checked = check_paths([run], spark=spark, report=False)[0]
            except Exception as exc:  # noqa: BLE001 - a warm-up check's failure only ends the warm-up
                checked = None
                say(f"warm-up check {i + 1}/{WARM_UP_CHECKS} failed: {type(exc).__name__}")
            finally:
                context.removeJobTag(WARM_UP_TAG)
            if checked is None or checked.results.get("valid") is not True:
                verdict = checked.results.get("valid") if checked is not None else "no verdict"
                why = halt() or f"warm-up check {i + 1} gave {verdict}"
                say(f"warm-up ended after {done} check(s): {why}")
                break
            done += 1
            say(f"warm-up check {i + 1}/{WARM_UP_CHECKS}: {time.monotonic() - started:.1f} s")
    return done


def cancel_warm_up(spark) -> None:
    """Cancel the warm-up's Spark jobs under way (a real check is waiting for the session)."""
    spark.sparkContext.cancelJobsWithTag(WARM_UP_TAG)


def lowest_priority() -> None:
    """This process and what it starts from now on (Spark's JVM) at the lowest CPU priority: nice 19,
    and, where the kernel groups processes by session for scheduling (autogroup), its session's
    group too; otherwise nice would weigh it only against this session's own processes, not against
    brokers that run in sessions of their own. Best effort: a kernel without either is left as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:
        pass


class Server:
    def __init__(self, sock: Path, spark_master: str, idle_timeout: float, warm_up: bool = True,
                 say: Callable[[str], None] = print):
        self.sock, self.master, self.idle_timeout, self.warm, self.say = sock, spark_master, idle_timeout, warm_up, say
        self.started = time.time()
        self.served = 0
        self.stopping = False
        self.spark = None
        self.queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.busy = 0  # checks queued or under way
        self.waiting: list[socket.socket] = []  # the queued checks' connections, in order
        self.last = time.monotonic()  # when the last request came or the last check ended
        self.warming = warm_up  # until the warm-up is over (done, or ended early by a waiting check)
        self.warm_up_checks = 0

    def status(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "spark_master": self.master, "started": self.started,
                "checks": self.served, "queued": self.busy, "idle_timeout": self.idle_timeout,
                "socket": str(self.sock), "warming": self.warming, "warm_up_checks": self.warm_up_checks}

    def serve(self) -> None:
        from ..history_analysis.session import get_session
        from .checking import spark_status

        self._spark_status = spark_status
        self.sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if _connect(self.sock, 2.0) is not None:
            raise RuntimeError(f"a check server already answers at {self.sock}")
        self.sock.unlink(missing_ok=True)  # a dead server's
        self.spark = get_session(self.master)
        # Listening from the start: a check that comes during the warm-up waits only for the warm-up
        # check under way, and ends the warm-up.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(str(self.sock))
        finally:
            os.umask(old_umask)
        listener.listen(16)
        self.say(f"check server: listening at {self.sock} (pid {os.getpid()}, Spark {self.master}); "
                 f"stops after {self.idle_timeout:g} s without a request")
        worker = threading.Thread(target=self._work, name="check-server-worker", daemon=True)
        worker.start()
        threading.Thread(target=self._tell_waiting, name="check-server-queue", daemon=True).start()
        self.last = time.monotonic()
        try:
            while not self.stopping:
                listener.settimeout(1.0)
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    if self.busy == 0 and time.monotonic() - self.last >= self.idle_timeout:
                        self.say(f"check server: {self.idle_timeout:g} s without a request; stopping")
                        break
                    continue
                self.last = time.monotonic()
                self._take(conn)
        finally:
            listener.close()
            self.sock.unlink(missing_ok=True)
            self.queue.put(None)
            if self.warming:
                self._end_warm_up()
            worker.join()
            try:
                self.spark.stop()
            except Exception:  # noqa: BLE001 - a dead session has nothing left to stop
                pass

    def _take(self, conn: socket.socket) -> None:
        """Answer a status or stop request at once; queue a check for the worker."""
        conn.settimeout(10.0)
        try:
            request = json.loads(conn.makefile("r", encoding="utf-8").readline() or "null")
        except (OSError, ValueError) as exc:
            self.say(f"check server: an unreadable request ({exc}); ignored")
            conn.close()
            return
        op = request.get("op") if isinstance(request, dict) else None
        if op == "check":
            # A client that stops reading (suspended, say) is taken for gone after this long, rather
            # than holding up the checks behind its own.
            conn.settimeout(30.0)
            with self.lock:
                self.busy += 1
                self.waiting.append(conn)
            self.queue.put((conn, request))
            if self.warming:
                threading.Thread(target=self._end_warm_up, name="check-server-warm-up-end", daemon=True).start()
            return
        with conn:
            if op == "status":
                _tell(conn, self.status())
            elif op == "stop":
                self.stopping = True
                _tell(conn, {"stopping": os.getpid()})
            else:
                _tell(conn, {"error": f"unknown request {op!r}"})

    def _halt_warm_up(self) -> str | None:
        return "the server is stopping" if self.stopping else "a check is waiting" if self.busy else None

    def _end_warm_up(self) -> None:
        """Cancel the warm-up's jobs until it ends (a check is waiting, or the server stops): a cancel
        reaches only the jobs under way, and the warm-up check may start another before it sees why
        to end."""
        while self.warming:
            cancel_warm_up(self.spark)
            time.sleep(0.2)

    def _tell_waiting(self) -> None:
        """Every second, tell each queued check's client where it stands (a client takes a long silence
        for a hung server)."""
        while not self.stopping:
            with self.lock:
                for ahead, conn in enumerate(self.waiting, start=1):
                    _tell(conn, {"progress": "waiting for the check server's warm-up check under way to end"
                                 if self.warming else f"queued at the check server behind {ahead} check(s)"})
            time.sleep(1.0)

    def _work(self) -> None:
        """Warm up, then serve the queued checks one at a time; those queued when the server stops are
        told so, for their clients to check in their own processes."""
        if self.warm:
            try:
                self.warm_up_checks = _warm_up(self.spark, self.say, self._halt_warm_up)
            finally:
                self.warming = False
            self.say("check server: warmed up" if self.warm_up_checks == WARM_UP_CHECKS else
                     f"check server: serving after {self.warm_up_checks} of {WARM_UP_CHECKS} warm-up checks")
            self.last = time.monotonic()
        while (item := self.queue.get()) is not None:
            conn, request = item
            with self.lock:
                self.waiting.remove(conn)
            with conn:
                if self.stopping:
                    _tell(conn, {"error": "the check server is stopping"})
                else:
                    self._check(conn, request)
            with self.lock:
                self.busy -= 1
            self.last = time.monotonic()

    def _check(self, conn: socket.socket, request: dict) -> None:
        if request.get("spark_master") != self.master:
            _tell(conn, {"refused": f"this server runs Spark {self.master}, not {request.get('spark_master')}"})
            return
        state = {"what": "checking"}
        done, gone = threading.Event(), threading.Event()

        def beat() -> None:
            while not done.wait(1.0):
                try:
                    stage = self._spark_status(self.spark)
                except Exception:  # noqa: BLE001 - the check itself will say what became of Spark
                    stage = "Spark does not answer"
                if not _tell(conn, {"progress": f"{state['what']}: {stage} (check server)"}):
                    gone.set()
                    return

        ticker = threading.Thread(target=beat, name="check-server-progress", daemon=True)
        ticker.start()
        started = time.monotonic()
        try:
            checked = check_paths(request["paths"], self.master, request.get("model"),
                                  progress=lambda text: state.update(what=text), spark=self.spark,
                                  report=bool(request.get("report", True)))
            answer: dict = {"results": [[str(c.directory), c.results] for c in checked]}
        except Exception as exc:  # noqa: BLE001 - told to the client, which checks in its own process
            log.exception("check failed")
            answer = {"error": f"{type(exc).__name__}: {exc}"}
            if not self._spark_alive():
                self.say("check server: its Spark session no longer answers; stopping")
                self.stopping = True
        finally:
            done.set()
            ticker.join()
        self.served += 1
        self.say(f"check server: checked {len(request['paths'])} path(s) in {time.monotonic() - started:.1f} s"
                 + ("; the client had gone" if gone.is_set() else ""))
        _tell(conn, answer)


    def _spark_alive(self) -> bool:
        try:
            return self.spark.range(1).count() == 1
        except Exception:  # noqa: BLE001 - any failure means the session cannot serve
            return False


def serve_foreground(spark_master: str, idle_timeout: float, warm_up: bool, background: bool = False) -> int:
    """Serve in this process until stopped or idle; `background`: at the lowest CPU priority
    (`lowest_priority`), as `faultline run` starts its own server beside the system under test."""
    if background:
        lowest_priority()
    server = Server(socket_path(), spark_master, idle_timeout, warm_up,
                    say=lambda text: print(text, flush=True))

    own_folder = background and server.sock.parent.name.startswith("faultline-run-check-")

    def stop(signum, _frame) -> None:
        server.stopping = True

    def end_now(signum, _frame) -> None:
        # A run's own server hears SIGTERM when its harness has ended (the parent-death signal): there
        # is no check left to finish, and `faultline cleanup` may look for its processes at once. The
        # server leads its process group, Spark's JVM included: all of it ends here, now.
        if own_folder:
            shutil.rmtree(server.sock.parent, ignore_errors=True)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, end_now if background and os.getpgrp() == os.getpid() else stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve()
    except RuntimeError as exc:
        print(f"check server: not started: {exc}", file=sys.stderr)
        return 1
    finally:
        if own_folder:
            # A run's own (RunServer): its folder is the server's alone, and its run may be gone.
            shutil.rmtree(server.sock.parent, ignore_errors=True)
    return 0


def start(spark_master: str, idle_timeout: float, warm_up: bool, say: Callable[[str], None] = print,
          timeout: float = 300.0) -> int:
    """Start a server in the background and wait until it answers; 0 when it does (or one already
    did), 1 with the reason said when it did not start."""
    sock = socket_path()
    running = ask({"op": "status"}, sock)
    if running is not None:
        say(f"check server: already running at {sock} (pid {running['pid']}, Spark {running['spark_master']})")
        return 0
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    logfile = log_path(sock)
    cmd = [sys.executable, "-m", "faultline.runner.cli", "check-server", "start", "--foreground",
           "--spark-master", spark_master, "--idle-timeout", f"{idle_timeout:g}"]
    if not warm_up:
        cmd.append("--no-warm-up")
    with open(logfile, "w") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, SOCKET_ENV: str(sock)})
    say(f"check server: starting (pid {proc.pid}): Spark, then {WARM_UP_CHECKS if warm_up else 'no'} warm-up "
        f"checks; log {logfile}")
    told: set[str] = set()

    def started() -> bool:
        # The warm-up's steps, as the server logs them: starting takes half a minute.
        for line in logfile.read_text(errors="replace").splitlines():
            if line.startswith("warm-up check") and line not in told:
                told.add(line)
                say(f"check server: {line}")
        if proc.poll() is not None:
            return True
        answer = ask({"op": "status"}, sock, 2.0)
        return answer is not None and not answer.get("warming")

    try:
        wait_until(started, timeout, f"the check server did not answer at {sock}", interval=0.5)
    except TimeoutError as exc:
        proc.terminate()
        say(f"check server: not started: {exc}; its log: {logfile}")
        return 1
    if proc.poll() is not None:
        tail = logfile.read_text(errors="replace").strip().splitlines()[-5:]
        say(f"check server: not started: it exited with status {proc.returncode}: " + " / ".join(tail))
        return 1
    say(f"check server: ready at {sock} (pid {proc.pid}); `faultline check` and `faultline run` use it "
        f"until it stops (after {idle_timeout:g} s without a request, or `faultline check-server stop`)")
    return 0


# --- a run's own server ----------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
# A run's own server's log, in its store folder.
CHECK_SERVER_LOG = "check-server.log"


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it ends, however it ends (a
    SIGKILLed harness leaves no server behind; the server's JVM ends with the server)."""
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class RunServer:
    """A check server of one run's own: started before the run's nodes, it warms up beside the set-up
    and the clients at the lowest CPU priority, so that the run's check, sent to it once the run
    ends, finds its JVM warm instead of starting one. Private: its socket is in a folder of its own
    (which the server removes when it ends), so it serves no other check, and a user's server is
    left alone; it logs to `log` (the run's store folder). It ends with the process that started
    it (which must be a thread that lives until `stop`: the main thread), on `stop`, or after an
    hour idle."""

    IDLE_TIMEOUT = 3600.0

    def __init__(self, spark_master: str, log: Path):
        self.folder = Path(tempfile.mkdtemp(prefix="faultline-run-check-"))
        self.sock = self.folder / "socket"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "faultline.runner.cli", "check-server", "start", "--foreground",
                 "--background", "--spark-master", spark_master, "--idle-timeout", f"{self.IDLE_TIMEOUT:g}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, SOCKET_ENV: str(self.sock)}, preexec_fn=_die_with_parent)

    def wait_listening(self, timeout: float = 120.0) -> bool:
        """Wait until the server listens (its Spark session started: a run shorter than that ends
        first); False when it ended instead, or did not listen within `timeout` s, and the check is
        then better run in the caller's own process."""
        try:
            wait_until(lambda: self.proc.poll() is not None or ask({"op": "status"}, self.sock, 2.0) is not None,
                       timeout, "the run's check server did not listen", interval=0.2)
        except TimeoutError:
            log.warning("the run's check server did not listen within %g s; checking here instead", timeout)
            return False
        return self.proc.poll() is None

    def _kill(self) -> None:
        """The server and its JVM (its process group: the server leads a session of its own), now."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # A server starts listening within a minute or so; a folder this old without one is not a
    # starting server's.
    STALE_AFTER = 300.0

    @staticmethod
    def stale_folders() -> list[Path]:
        """Socket folders of run servers that no longer answer (one that died before it could remove
        its own: its harness killed while it started), this user's only."""
        now = time.time()
        return [f for f in Path(tempfile.gettempdir()).glob("faultline-run-check-*")
                if f.is_dir() and f.stat().st_uid == os.getuid()
                and now - f.stat().st_mtime > RunServer.STALE_AFTER
                and ask({"op": "status"}, f / "socket", 2.0) is None]

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server and wait for it; killed when it does not stop within `timeout` s."""
        if self.proc.poll() is None:
            if ask({"op": "stop"}, self.sock, 5.0) is None:
                # Not listening yet (Spark still starting: a set-up that failed early): nothing of it
                # is worth a wait.
                self._kill()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
                self.proc.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


def stop(say: Callable[[str], None] = print, timeout: float = 60.0) -> int:
    sock = socket_path()
    answer = ask({"op": "stop"}, sock)
    if answer is None:
        say(f"check server: none runs at {sock}")
        return 0
    pid = answer["stopping"]
    try:
        wait_until(lambda: not _alive(pid), timeout, f"the check server (pid {pid}) did not stop")
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        sock.unlink(missing_ok=True)
        say(f"check server: pid {pid} did not stop within {timeout:g} s; killed")
        return 0
    say(f"check server: stopped (pid {pid})")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child, not yet reaped) has stopped.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def status(say: Callable[[str], None] = print) -> int:
    sock = socket_path()
    answer = ask({"op": "status"}, sock)
    if answer is None:
        say(f"check server: none runs at {sock}")
        return 1
    up = time.time() - answer["started"]
    say(f"check server: running at {sock}: pid {answer['pid']}, Spark {answer['spark_master']}, up {up:.0f} s, "
        f"{answer['checks']} check(s) served, stops after {answer['idle_timeout']:g} s without a request")
    return 0
