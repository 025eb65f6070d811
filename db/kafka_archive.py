"""A class-data archive of Apache Kafka's JVM: the broker's classes loaded and verified once per
version, mapped in by every later broker, controller and storage-tool JVM of that version.

A Kafka JVM spends most of its start loading and verifying Kafka's and Scala's classes. Measured
on 2 cores, a lone KRaft node of 4.3.1 took 2.26 s and 3.8 s of CPU from `java` to "Transition
from STARTING to STARTED", and 1.3-1.4 s and 2.1-2.25 s of CPU with the archive. A run starts at
least one JVM per node and one per restart, two or three at a time on a busy machine, so what
the cores save goes to the run itself. The archive is HotSpot's dynamic class-data sharing
(JDK 13 and later): one training node of the version started with `-XX:ArchiveClassesAtExit`,
made to create a topic, take writes, serve a consumer group and commit its offsets, then stopped
cleanly, whereupon its JVM writes every class it loaded. It changes no behaviour: a class is the
same class whether read from a jar or from the archive.

In: a Kafka version whose jars `kafka_jars` resolved, and the `java` a node starts. Out: the
archive at `path()` in the version's cache folder, keyed by the `java` binary (another Java gets
another archive), and the JVM option a node's command gets (`options()`). Nodes whose `java` is
not this machine's (containers bring their own) get none. An archive the JVM cannot use (another
build, a damaged file) is ignored by the JVM, which then starts as it would without one.

    .venv/bin/python -m faultline.db.kafka_archive [--force] [VERSION ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..control.wait import wait_until
from . import kafka_jars

# Set to 0 to start Kafka's JVMs without the archive (to measure what it saves).
USE_ENV = "FAULTLINE_KAFKA_ARCHIVE"
TRAINING_TOPIC = "faultline-training"


def host_java() -> Path | None:
    """This machine's java (JAVA_HOME's, else the one on PATH), resolved through links."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(w) if (w := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def path(version: str, java: Path) -> Path:
    """Where the archive of `version` for `java` lives (whether built or not)."""
    st = java.stat()
    key = hashlib.sha256(f"{java}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return kafka_jars.version_dir(version) / f"classes-{key}.jsa"


def _usable_java(java: str) -> Path | None:
    """`java` resolved, when it is this machine's java (an archive is built with that one only)."""
    if os.environ.get(USE_ENV) == "0" or not os.path.isabs(java):
        return None
    mine = host_java()
    return mine if mine is not None and Path(java).resolve() == mine else None


def options(version: str, java: str) -> list[str]:
    """The JVM option that maps the archive in, for a node of `version` started with `java`; none
    when the archive is not built or that java is not this machine's."""
    resolved = _usable_java(java)
    if resolved is None:
        return []
    archive = path(version, resolved)
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def ensure(version: str, java: str, progress=None) -> Path | None:
    """The archive of `version` for `java`, built first if it is not there (once per version and
    java: a failed build leaves a note beside it and is not tried again until `--force`). None when
    `java` is not this machine's or the build failed; a run goes on without it either way."""
    resolved = _usable_java(java)
    if resolved is None:
        return None
    archive = path(version, resolved)
    failed = archive.with_suffix(".failed")
    if archive.is_file():
        return archive
    if failed.exists():
        return None
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    with kafka_jars.version_lock(version):  # parallel runs of a fresh machine build it once
        if archive.is_file():
            return archive
        if failed.exists():
            return None
        try:
            return build(version, resolved, say)
        except Exception as exc:  # noqa: BLE001 - any failure only costs the archive
            failed.write_text(f"{exc}\n")
            say(f"faultline: warning: the class archive of Apache Kafka {version} was not built ({exc}); "
                f"Kafka starts without it, only slower. `python -m faultline.db.kafka_archive --force "
                f"{version}` tries again.")
            return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train(bootstrap: str) -> None:
    """Work that loads the classes a run's brokers use beyond start-up: a topic created, idempotent
    writes acknowledged by all, a consumer group that reads them and commits."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TRAINING_TOPIC, 1, 1)])[TRAINING_TOPIC].result(60)
    # Errors only: a fresh node answers "coordinator load in progress" at first, which is no news.
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "log_level": 3})
    for i in range(20):
        producer.produce(TRAINING_TOPIC, str(i).encode())
    if producer.flush(60) != 0:
        raise RuntimeError("the training node did not acknowledge its writes within 60 s")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "faultline-training",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3})
    consumer.subscribe([TRAINING_TOPIC])
    seen, deadline = 0, time.monotonic() + 60
    try:
        while seen < 20 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen += 1
        if seen < 20:
            raise RuntimeError(f"the training consumer read {seen} of 20 writes within 60 s")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def build(version: str, java: Path, progress=print) -> Path:
    """Build the archive by one training node (about 10 s on 2 cores). Raises RuntimeError (or the
    client's or the wait's error), saying why, when the node did not start, train or write it."""
    # Resolved already (callers resolve first): resolving here would take the version's lock again.
    home = kafka_jars.resolved(version)
    if home is None:
        raise RuntimeError(f"Apache Kafka {version}'s jars are not resolved")
    archive = path(version, java)
    started = time.monotonic()
    progress(f"faultline: building the class archive of Apache Kafka {version} (one training node, once) ...")
    with tempfile.TemporaryDirectory(prefix="faultline-kafka-archive-") as tmp:
        root = Path(tmp)
        broker, controller = _free_port(), _free_port()
        props = root / "server.properties"
        props.write_text(
            "process.roles=broker,controller\nnode.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{controller}\ncontroller.listener.names=CONTROLLER\n"
            f"listeners=PLAINTEXT://127.0.0.1:{broker},CONTROLLER://127.0.0.1:{controller}\n"
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
            f"log.dirs={root / 'data'}\noffsets.topic.replication.factor=1\noffsets.topic.num.partitions=1\n"
            "transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n")
        config = home / kafka_jars.log_config_name(version)
        common = [str(java), kafka_jars.log_config_property(version, config), f"-Dkafka.logs.dir={root / 'logs'}",
                  "-cp", f"{home / 'lib'}/*"]
        fmt = subprocess.run([*common[:1], "-Xmx256m", *common[1:], "kafka.tools.StorageTool", "format",
                              "-t", "ZmF1bHRsaW5lLXRyYWluaQ", "-c", str(props)],
                             capture_output=True, text=True, timeout=120)
        if fmt.returncode != 0:
            raise RuntimeError(f"the storage tool exited {fmt.returncode}: {(fmt.stdout + fmt.stderr)[-1500:]}")
        dump = archive.with_name(f".{archive.name}.{os.getpid()}")
        out = root / "kafka.out"
        with open(out, "wb") as sink:
            node = subprocess.Popen([*common[:1], *kafka_jars.BROKER_JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={dump}",
                                     "-Xlog:cds=off", "-Xlog:cds+dynamic=off", *common[1:], "kafka.Kafka", str(props)],
                                    stdout=sink, stderr=subprocess.STDOUT)
        try:
            def accepting() -> bool | str:
                if node.poll() is not None:
                    return "exited"
                with socket.create_connection(("127.0.0.1", broker), timeout=1):
                    return True

            if wait_until(accepting, 90, "the training node did not accept connections") == "exited":
                raise RuntimeError(f"the training node exited {node.returncode}: "
                                   f"{out.read_text(errors='replace')[-1500:]}")
            _train(f"127.0.0.1:{broker}")
            node.send_signal(signal.SIGTERM)
            node.wait(90)
        except BaseException:
            dump.unlink(missing_ok=True)
            raise
        finally:
            if node.poll() is None:
                node.kill()
                node.wait()
        if not dump.is_file():
            raise RuntimeError(f"the training node exited {node.returncode} and wrote no archive: "
                               f"{out.read_text(errors='replace')[-1500:]}")
        # Renamed into place: a node starting meanwhile sees no archive or a whole one.
        dump.replace(archive)
    progress(f"faultline: class archive of Apache Kafka {version}: {archive} "
             f"({archive.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - started:.1f} s")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faultline.db.kafka_archive",
        description="Build the class-data archive that starts Apache Kafka's JVMs faster (brokers, "
                    "controllers, the storage tool): one training node per version (about 10 s), written "
                    "beside the version's jars in ~/.cache/faultline/kafka/<version>/. scripts/setup runs it, "
                    "and a run builds it when it is missing; run it again with --force after a failed "
                    f"build. {USE_ENV}=0 makes nodes start without it.")
    parser.add_argument("versions", nargs="*", metavar="VERSION",
                        help=f"Kafka versions (default: {' '.join(kafka_jars.TESTED_VERSIONS)})")
    parser.add_argument("--force", action="store_true", help="build it again even if it is there")
    args = parser.parse_args(argv)
    java = host_java()
    if java is None:
        print("faultline: no java found (set JAVA_HOME or put java on PATH)", file=sys.stderr)
        return 1
    for version in args.versions or kafka_jars.TESTED_VERSIONS:
        archive = path(version, java)
        if args.force:
            archive.unlink(missing_ok=True)
            archive.with_suffix(".failed").unlink(missing_ok=True)
        try:
            kafka_jars.resolve(version)
        except kafka_jars.KafkaJarsError as exc:
            print(f"faultline: {exc}", file=sys.stderr)
            return 1
        if archive.is_file():
            print(f"Apache Kafka {version}: class archive {archive} is there already")
        elif ensure(version, str(java)) is None:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
