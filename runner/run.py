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
import threading
import time
from pathlib import Path

from ..checker.verdict import summary
from ..control.netns import LocalCluster
from ..control.wait import wait_until
from ..models.history import HistoryWriter
from ..models.spec import TestSpec
from ..control.net import Net
from ..nemesis import catalog
from ..nemesis.core import Schedule
from ..workloads.queue import QueueClient
from .checking import check_with_progress
from ..db.reference import ReferenceBrokerDB
from ..db.zookeeper import ZooKeeperDB
from .interpreter import Phase, run_phases
from .progress import Progress
from .store import create_run_dir

log = logging.getLogger("faultline.run")


class Interrupted(Exception):
    """SIGTERM or Ctrl-C: the run stops, cleans up and is still checked."""


def create_topics(spec: TestSpec, bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    rf = spec.effective_replication_factor

    def created() -> bool:
        futures = admin.create_topics([NewTopic(t, spec.partitions, rf) for t in spec.topic_names],
                                      operation_timeout=10)
        for topic, fut in futures.items():
            try:
                fut.result(15)
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        return True

    wait_until(created, 60, f"could not create the topics {spec.topic_names} on {bootstrap}")

    def led() -> bool:
        md = admin.list_topics(timeout=10)
        return all(t in md.topics and len(md.topics[t].partitions) == spec.partitions
                   and all(p.leader >= 0 for p in md.topics[t].partitions.values()) for t in spec.topic_names)

    wait_until(led, 60, f"the partitions of {spec.topic_names} did not all get a leader on {bootstrap}")


def run_test(spec: TestSpec, show_progress: bool = True) -> tuple[int, Path]:
    spec = spec.with_seed()
    run_dir = create_run_dir(spec)
    tag = secrets.token_hex(3)
    workdir = Path(tempfile.mkdtemp(prefix=f"faultline-{tag}-"))
    nodes = [f"n{i + 1}" for i in range(spec.nodes)]
    zk_nodes = [f"zk{i + 1}" for i in range(spec.effective_zookeeper_nodes)]
    history = HistoryWriter(run_dir / "history.jsonl")
    phase = Phase()
    stop = threading.Event()
    cluster = None
    db = None
    zookeeper = None
    interrupted = None

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
        c = history.counts
        done = c["ok"] + c["fail"] + c["info"]
        return (f"phase {phase.name} ({time.monotonic() - phase.started:.0f}s): {done} ops done: "
                f"{c['ok']} ok, {c['fail']} fail, {c['info']} info")

    zk_note = f" + {len(zk_nodes)} ZooKeeper" if zk_nodes else ""
    print(f"faultline run: {spec.name}, seed {spec.seed}, {spec.nodes} broker node(s){zk_note}, {spec.time_limit:g}s at "
          f"{spec.rate:g} ops/s; store {run_dir}")
    progress = Progress(describe) if show_progress else None
    try:
        if progress:
            progress.__enter__()
        cluster = LocalCluster.create(tag, nodes + zk_nodes, workdir)
        connect = None
        if zk_nodes:
            zookeeper = ZooKeeperDB({n: cluster.remotes[n] for n in zk_nodes}, workdir)
            zookeeper.setup()
            connect = zookeeper.connect
        db = ReferenceBrokerDB(spec, {n: cluster.remotes[n] for n in nodes}, workdir, connect)
        db.setup()
        create_topics(spec, db.bootstrap)
        net = Net(cluster.remotes) if "partition" in spec.nemesis else None
        nemeses, pairs = catalog.build(spec.nemesis, db, nodes, spec.keys, zk_nodes, net)
        schedule = Schedule(spec.seed, pairs, spec.nemesis_interval) if pairs else None

        def make_client(process: int) -> QueueClient:
            return QueueClient(db.bootstrap, spec.producer, spec.consumer, group_id=f"faultline-{process}")

        workers = run_phases(spec, history, make_client, nemeses, schedule, phase, stop)
        lagging = [w.index for w in workers if not w.caught_up]
        if lagging:
            log.warning("workers %s did not catch up in their final reads within %ss", lagging,
                        spec.final_time_limit)
    except (Interrupted, KeyboardInterrupt) as exc:
        interrupted = str(exc) or "interrupt"
        if progress:
            progress.note(f"interrupted ({interrupted}): cleaning up, then checking what was recorded")
    finally:
        stop.set()
        phase.name, phase.started = "teardown", time.monotonic()
        try:
            if db is not None:
                db.teardown(run_dir)
            if zookeeper is not None:
                zookeeper.teardown(run_dir)
        finally:
            if cluster is not None:
                cluster.destroy()
            history.close()
            shutil.rmtree(workdir, ignore_errors=True)
            if progress:
                progress.__exit__(None, None, None)
            for s, handler in previous.items():
                signal.signal(s, handler)
            librdkafka.removeHandler(client_log)
            client_log.close()

    print(f"checking {run_dir / 'history.jsonl'} with Spark ({spec.spark_master})")
    checked = check_with_progress([run_dir], spec.spark_master, spec.model, show_progress)[0]
    print(summary(checked.results, str(run_dir)))
    if interrupted:
        print(f"note: the run was interrupted ({interrupted}); the verdict covers what was recorded")
    return checked.status, run_dir
