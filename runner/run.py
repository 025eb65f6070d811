"""One test run, end to end: spec -> nodes -> brokers -> interpreter ->
history -> teardown -> analysis -> verdict.

In: a `TestSpec`. Out: the run's store folder (test.json, history.jsonl,
results.json, nodes/<node>/broker.log) and the exit status of its verdict
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
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from ..checker.check import HARNESS_ERRORS, record_harness_error
from ..checker.verdict import summary
from ..control.net import Net
from ..control.local_cluster import LocalCluster
from ..models.history import HistoryWriter
from ..models.spec import TestSpec
from . import testmap
from .checking import check_with_progress
from .interpreter import Interpreter, NemesisClient
from .progress import Progress
from .store import create_run_dir

log = logging.getLogger("faultline.run")


class Interrupted(Exception):
    """SIGTERM or Ctrl-C: the run stops, cleans up and is still checked."""


def execute(test: testmap.Test, history: HistoryWriter, run_dir: Path,
            started: Callable[[Interpreter], None] = lambda interpreter: None) -> None:
    """Run a test map: set its db up, make the workload's topics, run its generator through the
    interpreter (recording `history`), and always tear the db down, its logs going to `run_dir`."""
    spec = test.spec
    try:
        test.db.setup()
        test.db.create_topics(spec.topic_names, spec.partitions, spec.effective_replication_factor)
        bootstrap = test.db.bootstrap
        interpreter = Interpreter(test.generator, spec.concurrency,
                                  lambda process: test.workload.client(bootstrap, process), history,
                                  NemesisClient(test.nemeses) if test.nemeses else None)
        started(interpreter)
        interpreter.run()
    finally:
        test.db.teardown(run_dir)


def run_test(spec: TestSpec, show_progress: bool = True) -> tuple[int, Path]:
    spec = spec.with_seed()
    nodes, support_nodes = testmap.node_names(spec)
    run_dir = create_run_dir(spec)
    tag = secrets.token_hex(3)
    workdir = Path(tempfile.mkdtemp(prefix=f"faultline-{tag}-"))
    history = HistoryWriter(run_dir / "history.jsonl")
    state = {"phase": "setup", "since": time.monotonic(), "interpreter": None}
    cluster = None
    interrupted = failure = None

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
        return (f"phase {state['phase']} ({time.monotonic() - state['since']:.0f}s): {done} ops done: "
                f"{c['ok']} ok, {c['fail']} fail, {c['info']} info")

    support_note = f" + {len(support_nodes)} ZooKeeper" if support_nodes else ""
    print(f"faultline run: {spec.name}, seed {spec.seed}, {spec.nodes} broker node(s){support_note}, "
          f"{spec.time_limit:g}s at {spec.rate:g} ops/s; store {run_dir}")
    progress = Progress(describe) if show_progress else None
    try:
        if progress:
            progress.__enter__()
        cluster = LocalCluster.create(tag, nodes + support_nodes, workdir)
        net = Net(cluster.remotes) if "partition" in spec.nemesis else None
        test = testmap.build(spec, cluster.remotes, workdir, net)
        execute(test, history, run_dir, lambda interpreter: state.update(interpreter=interpreter))
    except (Interrupted, KeyboardInterrupt) as exc:
        interrupted = str(exc) or "interrupt"
        if progress:
            progress.note(f"interrupted ({interrupted}): cleaning up, then checking what was recorded")
    except Exception as exc:  # noqa: BLE001 - a harness failure is recorded, and the verdict is unknown
        failure = f"{type(exc).__name__}: {exc}"
        log.error("the run failed: %s", failure, exc_info=True)
        record_harness_error(run_dir, failure, traceback.format_exc())
    finally:
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

    how = f"Spark ({spec.spark_master})" if spec.engine == "spark" else "the plain-Python engine"
    print(f"checking {run_dir / 'history.jsonl'} with {how}")
    checked = check_with_progress([run_dir], spec.spark_master, spec.model, show_progress, spec.engine)[0]
    print(summary(checked.results, str(run_dir)))
    if interrupted:
        print(f"note: the run was interrupted ({interrupted}); the verdict covers what was recorded")
    if failure:
        print(f"note: the harness failed ({failure}); its traceback is in {run_dir / HARNESS_ERRORS}")
    return checked.status, run_dir
