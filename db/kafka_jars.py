"""Apache Kafka's jars from Maven Central, resolved once per version into a cache folder.

In: a Kafka version (any that Maven Central serves as `org.apache.kafka:kafka_2.13`). Out: the
folder `~/.cache/faultline/kafka/<version>/` (or `$FAULTLINE_KAFKA_CACHE/<version>/`) holding
`lib/` (every runtime jar of the broker and its storage tool, plus the logging binding the
version needs) and the logging configuration the nodes start with (`log4j.properties` for 3.x,
`log4j2.properties` for 4.x). The Maven project is `docker/kafka/pom.xml` in the repository
(`$FAULTLINE_KAFKA_MAVEN_PROJECT` names another folder); resolution is
`mvn -q dependency:copy-dependencies` into a temporary folder renamed into place when complete,
under a lock, so concurrent runs resolve a version once and a half-copied folder is never used.
Later runs, and CI after `scripts/setup`, use the folder offline.

`resolve_tools(version)` gives `<version>/tools/`, the same way: Kafka's own test clients
(`kafka-tools`: VerifiableProducer, the console consumer) with everything they need, kept off the
broker's classpath.

`$FAULTLINE_MAVEN_ARGS` adds arguments to every mvn command (`-s settings.xml` for a mirror, say).
`python -m faultline.db.kafka_jars [--tools] 3.9.1 4.3.1` resolves versions (and their tools)
ahead of time (scripts/setup does).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTED_VERSIONS = ("4.3.1", "3.9.1")
DEFAULT_VERSION = "4.3.1"
# The goal by its full name: a prefix (dependency:...) would need Maven Central's plugin index.
PLUGIN_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies"
MARKER = "resolved"  # written last: a folder without it is incomplete
# Every broker and controller JVM's options before its class path (kafka.py, kafka_archive.py).
# The client compiler alone (TieredStopAtLevel=1): a run's brokers live a minute or so at a few
# hundred operations a second, and the server compiler's work in that minute was a third of their
# CPU (a 3-broker Kafka 4.3.1 run of 20 s: 32-33 s of CPU with it, 20-21 s without), taken from the
# clients and nemesis of a small machine. Only speed differs; what the brokers do is the same.
BROKER_JVM_OPTIONS = ("-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                      "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")


class KafkaJarsError(RuntimeError):
    """The jars could not be resolved; the message says what failed and what to do."""


def cache_root() -> Path:
    env = os.environ.get("FAULTLINE_KAFKA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "faultline" / "kafka"


def maven_project() -> Path:
    env = os.environ.get("FAULTLINE_KAFKA_MAVEN_PROJECT")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "docker" / "kafka"


def major(version: str) -> int:
    match = re.match(r"(\d+)\.", version)
    if not match:
        raise KafkaJarsError(f"Kafka version {version!r} is not a version number such as 4.3.1")
    return int(match[1])


def log_config_name(version: str) -> str:
    return "log4j2.properties" if major(version) >= 4 else "log4j.properties"


def log_config_property(version: str, path: Path) -> str:
    """The JVM property that points the version's logging at `path`."""
    if major(version) >= 4:
        return f"-Dlog4j2.configurationFile={path}"
    return f"-Dlog4j.configuration=file:{path}"


@contextlib.contextmanager
def version_lock(version: str):
    """Held while anything in the version's cache folder is being made (its jars, its tools, its
    class archive), so that concurrent runs make it once."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def version_dir(version: str) -> Path:
    return cache_root() / version


def resolved(version: str) -> Path | None:
    folder = version_dir(version)
    return folder if (folder / MARKER).exists() and (folder / "lib").is_dir() else None


def resolve(version: str, progress=None) -> Path:
    """The version's cache folder, resolving it from Maven Central first if it is not there yet.

    `progress(line)` is told when a resolution starts and ends (default: stderr)."""
    if not re.fullmatch(r"[0-9A-Za-z.\-]+", version):
        raise KafkaJarsError(f"Kafka version {version!r} is not a version number such as 4.3.1")
    major(version)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    if (folder := resolved(version)) is not None:
        return folder
    with version_lock(version):  # another run may be resolving the same version
        if (folder := resolved(version)) is not None:
            return folder
        started = time.monotonic()
        say(f"faultline: resolving Apache Kafka {version} from Maven Central into {version_dir(version)} "
            f"(once per version; later runs use it offline) ...")
        folder = _resolve_locked(version)
        jars = len(list((folder / "lib").glob("*.jar")))
        say(f"faultline: Apache Kafka {version} resolved: {jars} jars in {time.monotonic() - started:.0f} s")
        return folder


def resolve_tools(version: str, progress=None) -> Path:
    """The folder of Kafka's own client tools of `version` (`<version>/tools/`: jars to put on a
    classpath), resolving them from Maven Central first if they are not there yet."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    folder = resolve(version, progress) / "tools"
    if (folder / MARKER).exists():
        return folder
    with version_lock(version):
        if (folder / MARKER).exists():
            return folder
        say(f"faultline: resolving Apache Kafka {version}'s tools (kafka-tools) into {folder} ...")

        def build(staging: Path) -> None:
            _mvn(maven_project(), version, staging, [], profiles=("tools",))
            if not list(staging.glob(f"kafka-tools-{version}.jar")):
                raise KafkaJarsError(f"resolving Apache Kafka {version}'s tools gave no kafka-tools-{version}.jar")

        _install(folder, version, build)
    return folder


def _mvn(project: Path, version: str, out: Path, extra: list[str], profiles: tuple[str, ...] = ()) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaJarsError("Maven (mvn) is not installed, and faultline resolves Apache Kafka's jars with it: "
                             "run scripts/setup, or apt-get install maven")
    cmd = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(project / "pom.xml"), PLUGIN_GOAL,
           f"-Dkafka.version={version}", "-P" + ",".join([f"kafka{4 if major(version) >= 4 else 3}", *profiles]),
           "-DincludeScope=runtime",
           f"-DoutputDirectory={out}", *os.environ.get("FAULTLINE_MAVEN_ARGS", "").split(), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900)
    if proc.returncode != 0:
        raise KafkaJarsError(_explain(version, " ".join(cmd), proc.stdout + proc.stderr))


def _explain(version: str, cmd: str, output: str) -> str:
    tail = "\n".join(line for line in output.splitlines()[-12:] if line.strip())
    unreachable = ("UnknownHostException", "Connection refused", "Network is unreachable", "connect timed out",
                   "Connect to repo", "Could not transfer", "Temporary failure in name resolution",
                   "No route to host", "offline mode", "No plugin found for prefix", "could not be resolved")
    if "Could not find artifact" in output or "was not found in" in output:
        return (f"Apache Kafka {version} could not be resolved: Maven Central does not serve "
                f"org.apache.kafka:kafka_2.13:{version} (or one of its dependencies). Check the version "
                f"(--kafka-version; tested: {', '.join(TESTED_VERSIONS)}).\nMaven said:\n{tail}")
    if any(word in output for word in unreachable):
        return (f"Apache Kafka {version} is not in faultline's cache ({version_dir(version)}) and Maven Central "
                f"could not be reached to resolve it: `{cmd}` failed to download. faultline runs Kafka from its "
                f"own jars, which it fetches once per version from https://repo.maven.apache.org; connect this "
                f"machine to Maven Central (or a mirror in ~/.m2/settings.xml), or resolve the version on a "
                f"machine that can and copy {version_dir(version)} here, then run again.\nMaven said:\n{tail}")
    return f"resolving Apache Kafka {version} failed: `{cmd}` exited with an error.\nMaven said:\n{tail}"


def _resolve_locked(version: str) -> Path:
    project = maven_project()
    config = project / log_config_name(version)
    if not (project / "pom.xml").exists() or not config.exists():
        raise KafkaJarsError(f"the Maven project for Apache Kafka ({project}/pom.xml and {config.name}) is missing; "
                             f"run faultline from its repository, or set FAULTLINE_KAFKA_MAVEN_PROJECT")

    def build(staging: Path) -> None:
        lib = staging / "lib"
        _mvn(project, version, lib, [])
        if major(version) >= 4:
            # The SLF4J binding must match the log4j-core that kafka_2.13 brings.
            core = _jar_version(lib, "log4j-core")
            binding = _jar_version(lib, "log4j-slf4j-impl")
            if core and core != binding:
                for jar in lib.glob("log4j-slf4j-impl-*.jar"):
                    jar.unlink()
                _mvn(project, version, lib, [f"-Dlog4j2.version={core}"])
        if not list(lib.glob(f"kafka_2.13-{version}.jar")):
            raise KafkaJarsError(f"resolving Apache Kafka {version} gave no kafka_2.13-{version}.jar in {lib}")
        shutil.copy2(config, staging / config.name)

    return _install(version_dir(version), version, build)


def _install(final: Path, version: str, build) -> Path:
    """Fill a staging folder beside `final` with `build(staging)`, mark it complete and rename it
    into place (replacing an incomplete earlier attempt); the caller holds the version's lock."""
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(staging)
        (staging / MARKER).write_text(f"{version}\n")
        if final.exists():  # an incomplete earlier attempt
            shutil.rmtree(final)
        os.replace(staging, final)
        return final
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)


def _jar_version(lib: Path, artifact: str) -> str | None:
    for jar in lib.glob(f"{artifact}-*.jar"):
        match = re.fullmatch(re.escape(artifact) + r"-(\d[^/]*)\.jar", jar.name)
        if match:
            return match[1]
    return None


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    tools = "--tools" in args
    versions = [a for a in args if a != "--tools"] or list(TESTED_VERSIONS)
    for version in versions:
        try:
            folder = resolve(version)
            if tools:
                resolve_tools(version)
        except KafkaJarsError as exc:
            print(f"faultline: {exc}", file=sys.stderr)
            return 1
        print(f"Apache Kafka {version}: {folder}" + (" (and its tools)" if tools else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
