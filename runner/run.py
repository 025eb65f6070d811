"""One test run, end to end: spec -> nodes -> brokers -> interpreter ->
history -> teardown -> analysis -> verdict.

In: a `TestSpec`. Out: the run's store folder (test.json, history.jsonl,
results.json, report.html, nodes/<node>/broker.log) and the exit status of its verdict
(0 valid, 1 invalid, 2 unknown). Whatever happens — an error, Ctrl-C,
SIGTERM — the network namespaces, links and processes of the run are
removed before this returns; after a SIGKILL of the harness,
`faultline cleanup` removes them.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from ..checker.check import HARNESS_ERRORS, record_harness_error, record_rate
from ..checker.junit import write_junit
from ..checker.report import REPORT
from ..checker.verdict import summary
from ..control.net import Net
from ..models.history import HistoryWriter
from ..models.spec import TestSpec
from . import testmap
from .check_server import CHECK_SERVER_LOG, RunServer, serving
from .checking import check_with_progress, start_spark_early
from .interpreter import Interpreter, NemesisClient
from .progress import Progress
from .store import create_run_dir

log = logging.getLogger("faultline.run")


class Interrupted(Exception):
    """SIGTERM or Ctrl-C: the run stops, cleans up and is still checked."""


def execute(test: testmap.Test, history: HistoryWriter, run_dir: Path,
            started: Callable[[Interpreter], None] = lambda interpreter: None,
            finished: Callable[[], None] = lambda: None) -> None:
    """Run a test map: set its db up, make the workload's topics, run its generator through the
    interpreter (recording `history`), and always tear the db down, its logs going to `run_dir`.
    `started` is called with the interpreter before it runs, `finished` once it has stopped (the
    history is complete), before the teardown."""
    spec = test.spec
    running = False
    try:
        test.db.setup()
        test.db.create_topics(spec.topic_names, spec.partitions, spec.effective_replication_factor)
        bootstrap = test.db.bootstrap
        if test.workload.setup is not None:
            test.workload.setup(bootstrap)
        interpreter = Interpreter(test.generator, spec.concurrency,
                                  lambda process: test.workload.client(bootstrap, process), history,
                                  NemesisClient(test.nemeses) if test.nemeses else None)
        started(interpreter)
        running = True
        interpreter.run()
    finally:
        if running:
            finished()
        test.db.teardown(run_dir)


def run_test(spec: TestSpec, show_progress: bool = True, report: bool = True,
             junit: str | Path | None = None, server: bool = True) -> tuple[int, Path]:
    """Run `spec` (see the module docstring); `report`: write report.html; `junit`: also write the
    verdict as JUnit XML to this file; `server`: a Spark check goes to a check server (the user's
    when one runs; else one of the run's own, started before the nodes, warming up beside the
    set-up and the run at the lowest CPU priority: `check_server.RunServer`) instead of a JVM
    started after the run."""
    spec = spec.with_seed()
    nodes, support_nodes = testmap.node_names(spec)
    run_dir = create_run_dir(spec)
    tag = secrets.token_hex(3)
    workdir = Path(tempfile.mkdtemp(prefix=f"faultline-{tag}-"))
    history = HistoryWriter(run_dir / "history.jsonl")
    state = {"phase": "setup", "since": time.monotonic(), "interpreter": None, "started": False}
    run_server = None
    cluster = None
    interrupted = failure = setup_failure = None

    def on_signal(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    client_log = logging.FileHandler(run_dir / "clients.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    librdkafka = logging.getLogger("faultline.librdkafka")
    librdkafka.addHandler(client_log)
    # librdkafka emits its `debug=...` contexts at debug level: whoever set one wants to read them.
    asked_debug = any(settings.get("debug") for settings in (spec.producer, spec.consumer))
    librdkafka.setLevel(logging.DEBUG if asked_debug else logging.INFO)
    librdkafka.propagate = False

    def describe() -> str:
        interpreter = state["interpreter"]
        if interpreter is not None and interpreter.phase != state["phase"]:
            state["phase"], state["since"] = interpreter.phase, time.monotonic()
        c = history.counts
        done = c["ok"] + c["fail"] + c["info"]
        rate = ""
        if interpreter is not None and state["phase"] == "main":
            achieved = interpreter.invoked.rate("main", time.monotonic() - interpreter.started)
            rate = f"; {achieved:.0f} ops/s of {spec.rate:g} asked" if achieved is not None else ""
        return (f"phase {state['phase']} ({time.monotonic() - state['since']:.0f}s): {done} ops done: "
                f"{c['ok']} ok, {c['fail']} fail, {c['info']} info{rate}")

    support_note = f" + {len(support_nodes)} ZooKeeper" if support_nodes else ""
    print(f"faultline run: {spec.name}, seed {spec.seed}, {spec.nodes} broker node(s){support_note}, "
          f"{spec.time_limit:g}s at {spec.rate:g} ops/s; store {run_dir}")
    progress = Progress(describe) if show_progress else None
    try:
        if progress:
            progress.__enter__()
        if server and spec.engine == "spark" and spec.spark_master.startswith("local") and \
                serving(spec.spark_master) is None:
            # Started first, so that it has the set-up's time too to warm up in.
            run_server = RunServer(spec.spark_master, run_dir / CHECK_SERVER_LOG)
        cluster = testmap.create_nodes(spec, tag, workdir, say=progress.note if progress else print)
        net = Net(cluster.remotes) if "partition" in spec.nemesis else None
        test = testmap.build(spec, cluster.remotes, workdir, net)

        def finished() -> None:
            # Without a server of its own, the check's JVM starts while the nodes stop.
            if spec.engine == "spark" and run_server is None:
                start_spark_early(spec.spark_master, run_dir / "history.jsonl")

        execute(test, history, run_dir, lambda interpreter: state.update(interpreter=interpreter, started=True),
                finished)
    except (Interrupted, KeyboardInterrupt) as exc:
        interrupted = str(exc) or "interrupt"
        if progress:
            progress.note(f"interrupted ({interrupted}): cleaning up, then checking what was recorded")
    except Exception as exc:  # noqa: BLE001 - a harness failure is recorded, and the verdict is unknown
        failure = f"{type(exc).__name__}: {exc}"
        record_harness_error(run_dir, failure, traceback.format_exc())
        if state["started"]:
            log.error("the run failed: %s", failure, exc_info=True)
        else:
            # Said in one paragraph once everything is cleaned up; the traceback is in the store.
            log.debug("set-up failed", exc_info=True)
            setup_failure = exc
    finally:
        interpreter = state["interpreter"]
        if interpreter is not None and interpreter.invoked.count.get("main"):
            invoked = interpreter.invoked
            record_rate(run_dir, spec.rate, invoked.count["main"], invoked.last["main"] - invoked.first["main"],
                        invoked.cost("main"))
        state["interpreter"], state["phase"], state["since"] = None, "teardown", time.monotonic()
        try:
            if cluster is not None:
                cluster.destroy()
        finally:
            history.close()
            shutil.rmtree(workdir, ignore_errors=True)
            if progress:
                progress.__exit__(None, None, None)
            for s, handler in previous.items():
                signal.signal(s, handler)
            librdkafka.removeHandler(client_log)
            client_log.close()

    if setup_failure is not None:
        if run_server is not None:
            run_server.stop()
        # Nothing ran, so the verdict is unknown: results.json says so, without starting Spark.
        checked = check_with_progress([run_dir], spec.spark_master, spec.model, False, "python", report)[0]
        _junit(junit, run_dir, checked.results)
        print(setup_paragraph(setup_failure, spec, run_dir), file=sys.stderr)
        return 2, run_dir
    how = f"Spark ({spec.spark_master})" if spec.engine == "spark" else "the plain-Python engine"
    print(f"checking {run_dir / 'history.jsonl'} with {how}")
    try:
        if run_server is not None and not run_server.wait_listening():
            # Not started in time: checked here instead, with no second JVM beside this one.
            run_server.stop()
        checked = check_with_progress([run_dir], spec.spark_master, spec.model, show_progress, spec.engine, report,
                                      server, run_server.sock if run_server is not None else None)[0]
    finally:
        if run_server is not None:
            run_server.stop()
    _junit(junit, run_dir, checked.results)
    print(summary(checked.results, str(run_dir)))
    if report and (run_dir / REPORT).exists():
        print(f"report: {run_dir / REPORT}")
    if interrupted:
        print(f"note: the run was interrupted ({interrupted}); the verdict covers what was recorded")
    if failure:
        print(f"note: the harness failed ({failure}); its traceback is in {run_dir / HARNESS_ERRORS}")
    return checked.status, run_dir


def _junit(path: str | Path | None, run_dir: Path, results: dict) -> None:
    if path is not None:
        write_junit(path, [(str(run_dir), results)])


def setup_paragraph(exc: BaseException, spec: TestSpec, run_dir: Path) -> str:
    """What failed while setting the run up, its likely cause and the fix, as one paragraph."""
    from ..control.docker_cluster import DockerUnavailable
    from ..control.docker_image import ImageError
    from ..control.remote import CommandFailed, RemoteError
    from ..db.core import ExitedWhileStarting

    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    # The first line says what failed; a log's tail after it is in the store and the traceback.
    what = lines[0].rstrip(".:;")
    logs = f"{run_dir}/nodes/"
    where = "the containers on Docker" if spec.backend == "docker" else "network namespaces on this machine"
    if isinstance(exc, (DockerUnavailable, ImageError)):
        cause_fix = ""  # their text says why and what to do
    elif isinstance(exc, ExitedWhileStarting):
        what = str(exc).splitlines()[0].split(";")[0]
        cause_fix = (f" Its log's last line: \"{exc.last_line}\". Likely cause: a setting it refuses (a --broker-set "
                     f"value, say) or something missing on the node. Fix: read its log, copied to "
                     f"{run_dir}/nodes/{exc.node}/, correct the setting, and run again.")
    elif isinstance(exc, PermissionError):
        cause_fix = " The local backend creates network namespaces and links, which needs root: run it as root."
    elif isinstance(exc, TimeoutError):
        cause_fix = (f" Likely cause: a node's process started but never answered, or this machine cannot reach "
                     f"the node's address ({where}; a firewall between them). Fix: read the node's log in "
                     f"{logs}; `faultline cleanup` removes anything left over before you try again.")
    elif isinstance(exc, CommandFailed):
        cause_fix = (f" Likely cause: a program the node needs is missing or failed (its output is above). Fix: "
                     f"run scripts/setup{' --docker' if spec.backend == 'docker' else ''}, then try again.")
    elif isinstance(exc, RemoteError):
        cause_fix = " Fix: `faultline cleanup` removes what earlier runs left behind; then try again."
    else:
        cause_fix = (f" Likely cause: a node exited while starting (its log is in {logs}) or a fault in "
                     f"faultline itself (the traceback is in {run_dir / HARNESS_ERRORS}).")
    return (f"faultline run: set-up failed, so nothing was tested (verdict unknown, exit status 2): {what}."
            f"{cause_fix} The store folder {run_dir} keeps the node logs collected so far and the traceback.")
