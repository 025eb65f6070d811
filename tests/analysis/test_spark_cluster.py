"""`faultline check --spark-master spark://...` against a real Spark standalone cluster.

A master and one worker are started from the classes that ship inside the pyspark package
(`bin/spark-class org.apache.spark.deploy.master.Master`, `...worker.Worker`; the package has no
`sbin/start-master.sh`), bound to 127.0.0.1. A history with anomalies of several types is checked
through the cluster and in local mode; both results.json must be the same, and the cluster's
executor must have run the analysis's tasks (its work folder holds the application's logs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from faultline.control.wait import wait_until

from ..conftest import REPO, free_port
from .generate import write_with_anomalies

pytest.importorskip("pyspark")


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class Daemon:
    """One Spark daemon class run in its own process group, its output in a log file."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]):
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen([str(_spark_home() / "bin" / "spark-class"), name, *args], stdout=out,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.log.name} exited with {self.proc.returncode}: {self.text()[-2000:]}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def standalone(tmp_path):
    """A Spark standalone master and one worker (1 core, 1 GB) on 127.0.0.1: yields the master's URL
    and the worker's work folder; both are stopped afterwards."""
    env = {**os.environ, "SPARK_HOME": str(_spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    work = tmp_path / "worker"
    master = Daemon("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())],
                    tmp_path / "master.log", env)
    worker = None
    try:
        wait_until(lambda: master.alive() and "I have been elected leader" in master.text(), 60,
                   f"the Spark master did not become leader; see {master.log}")
        worker = Daemon("org.apache.spark.deploy.worker.Worker",
                        [url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                         "--webui-port", str(free_port()), "--work-dir", str(work)],
                        tmp_path / "worker.log", env)
        wait_until(lambda: worker.alive() and "Successfully registered with master" in worker.text(), 60,
                   f"the Spark worker did not register with the master; see {worker.log}")
        yield url, work
    finally:
        for d in (worker, master):
            if d is not None:
                d.stop()


def _check(run: Path, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", str(run), "--no-progress",
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return json.loads((run / "results.json").read_text())


def test_a_check_through_a_standalone_cluster_gives_the_results_of_local_mode(tmp_path, standalone):
    url, work = standalone
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    expected = write_with_anomalies(local)
    assert len(expected) >= 4, expected
    shutil.copytree(local, remote)

    on_cluster = _check(remote, "--spark-master", url)
    in_process = _check(local)

    assert on_cluster == in_process
    assert set(in_process["anomaly_types"]) == expected
    for name in sorted(p.name for p in (local / "anomalies").iterdir()):
        assert (remote / "anomalies" / name).read_text() == (local / "anomalies" / name).read_text(), name
    # The tasks ran in the worker's executor, not in the driver: the application's executor folder
    # is there, with its output.
    apps = list(work.glob("app-*/*/stderr"))
    assert apps, f"no executor ran on the worker; its folder holds {list(work.rglob('*'))}"
