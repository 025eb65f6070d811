"""One real ZooKeeper server on 127.0.0.1 for broker tests, configured and started as
`faultline run` starts one (Debian's package, run with java), without a namespace."""

from __future__ import annotations

import subprocess
from pathlib import Path

from faultline.control.wait import wait_until
from faultline.runner.zookeeper import four_letter, java_command, zoo_cfg
from tests.conftest import free_port


class LocalZooKeeper:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "LocalZooKeeper":
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.root / "zoo.cfg"
        cfg.write_text(zoo_cfg(data, "127.0.0.1", {}, client_port=self.port))
        log = open(self.root / "zookeeper.log", "a")
        self.proc = subprocess.Popen(java_command(cfg, self.root), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(self._serving, 60, f"ZooKeeper did not serve on {self.connect}; see {self.root}/zookeeper.log")
        return self

    def _serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ZooKeeper exited: {(self.root / 'zookeeper.log').read_text()[-2000:]}")
        return four_letter("127.0.0.1", "ruok", port=self.port) == "imok"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
