"""One real ZooKeeper server on 127.0.0.1 for broker tests (Debian's package, run with java)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from faultline.control.wait import wait_until
from tests.conftest import free_port

CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"


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
        # tickTime 500 ms allows sessions down to 1 s, so tests see failures quickly.
        cfg.write_text(f"tickTime=500\ndataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                       f"minSessionTimeout=1000\nmaxSessionTimeout=60000\nadmin.enableServer=false\n"
                       f"4lw.commands.whitelist=srvr,ruok\n")
        log = open(self.root / "zookeeper.log", "a")
        self.proc = subprocess.Popen(["java", "-cp", CLASSPATH, f"-Dzookeeper.log.dir={self.root}",
                                      "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(self._serving, 30, f"ZooKeeper did not serve on {self.connect}; see {self.root}/zookeeper.log")
        return self

    def _serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ZooKeeper exited: {(self.root / 'zookeeper.log').read_text()[-2000:]}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
