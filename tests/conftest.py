"""Shared fixtures: reference brokers run as real `faultline broker` processes, and a real
ZooKeeper on 127.0.0.1 (`zookeeper`, its connect string) for tests of replicated brokers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from faultline.control.wait import wait_until

REPO = Path(__file__).resolve().parent.parent

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the property tests need it; the rest of the suite does not
    _hypothesis_settings = None
if _hypothesis_settings is not None:
    # Profiles for the property tests that do not fix max_examples themselves. `ci`: enough
    # examples to find rare histories, no deadline (a Spark analysis takes seconds), a fresh
    # random start each run, and the blob to replay a failure (@reproduce_failure) printed with
    # it. `dev`: quick. HYPOTHESIS_PROFILE chooses; else `ci` when the CI variable is set.
    _hypothesis_settings.register_profile("ci", max_examples=200, deadline=None, derandomize=False,
                                          print_blob=True)
    _hypothesis_settings.register_profile("dev", max_examples=20, deadline=None, print_blob=True)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                                      or ("ci" if os.environ.get("CI") else "dev"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    """One `faultline broker` subprocess with its data directory and log."""

    def __init__(self, data_dir: Path, settings: dict[str, object] | None = None, node_id: int = 1):
        self.data_dir = data_dir
        self.node_id = node_id
        self.settings = dict(settings or {})
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"broker-{node_id}-{data_dir.name}.log"
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "BrokerProcess":
        cmd = [sys.executable, "-m", "faultline.broker.main", "--node-id", str(self.node_id),
               "--listen", self.bootstrap, "--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        self.starts += 1
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()
        wait_until(self._accepting, 20, f"broker did not accept connections on {self.bootstrap}; see {self.log_path}")
        return self

    def _accepting(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
            return True

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM: a clean shutdown. Returns the exit status."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def broker_factory(tmp_path):
    brokers: list[BrokerProcess] = []

    def make(settings: dict[str, object] | None = None, start: bool = True) -> BrokerProcess:
        b = BrokerProcess(tmp_path / f"data{len(brokers)}", settings)
        brokers.append(b)
        return b.start() if start else b

    yield make
    for b in brokers:
        b.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A ZooKeeper for the whole session (Debian's server, no namespace, no root); yields its
    connect string. Tests share it, so each cluster keeps its znodes under a chroot of its own
    (`zookeeper.connect=<connect>/<name>`)."""
    from faultline.db.zookeeper import LocalZooKeeper

    zk = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk.connect
    zk.stop()


@pytest.fixture(scope="session")
def docker_host():
    """A Docker daemon of the session's own (private socket, data root and exec root), which
    DOCKER_HOST points at while the session lasts; stopped by its pid at the end, and the host's
    FORWARD policy, dockerd's chains and rules and the sysctls it changed put back as they were."""
    if os.geteuid() != 0:
        pytest.skip("the Docker backend's tests start a dockerd, which needs root")
    import shutil

    from tests.dockerd import HostState, PrivateDockerd

    if shutil.which("dockerd") is None:
        message = "dockerd is not installed: run scripts/setup --docker"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    before = HostState.capture()
    daemon = PrivateDockerd()
    previous = os.environ.get("DOCKER_HOST")
    try:
        daemon.start()
        os.environ["DOCKER_HOST"] = daemon.host
        yield daemon.host
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
        daemon.stop()
        before.restore()


@pytest.fixture(scope="session")
def node_image(docker_host) -> str:
    """The node image of this checkout on the session's daemon, built first when it is not there."""
    from faultline.control.docker_cluster import connect
    from faultline.control.docker_image import ensure_image

    return ensure_image(connect(docker_host), say=lambda text: print(f"\n{text}", flush=True))
