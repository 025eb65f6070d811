"""The system under test on each node: the reference broker, through a Remote.

In: the test spec and one `Remote` per node. Out: brokers started, stopped,
killed, paused and resumed on their nodes (the `DB` of a Jepsen test), their
readiness awaited, and their logs collected into the run's store folder.
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path

from ..control.wait import wait_until
from ..models.spec import TestSpec

log = logging.getLogger("faultline.db")

BROKER_PORT = 9092
DAEMON = "broker"


class ReferenceBrokerDB:
    """Runs `faultline broker` on every node; node i (from 1) is broker id i."""

    def __init__(self, spec: TestSpec, remotes: dict, workdir: Path):
        self.spec = spec
        self.remotes = remotes
        self.workdir = workdir
        self.node_ids = {name: i + 1 for i, name in enumerate(remotes)}

    def node_dir(self, node: str) -> Path:
        return self.workdir / node

    def address(self, node: str) -> str:
        return f"{self.remotes[node].address}:{BROKER_PORT}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(n) for n in self.remotes)

    def command(self, node: str) -> list[str]:
        cmd = [sys.executable, "-m", "faultline.broker.main", "--node-id", str(self.node_ids[node]),
               "--listen", self.address(node), "--data-dir", str(self.node_dir(node) / "data")]
        for key, value in self.spec.broker_settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def log_path(self, node: str) -> Path:
        return self.node_dir(node) / "broker.log"

    def start(self, node: str) -> int:
        remote = self.remotes[node]
        pid = remote.spawn(DAEMON, self.command(node), self.log_path(node))
        log.info("started broker %d on %s (pid %d)", self.node_ids[node], node, pid)
        return pid

    def wait_ready(self, node: str, timeout: float = 30) -> None:
        host, port = self.remotes[node].address, BROKER_PORT

        def accepting() -> bool:
            if self.remotes[node].pid(DAEMON) is None:
                tail = self.log_path(node).read_text()[-1500:] if self.log_path(node).exists() else ""
                raise RuntimeError(f"the broker on {node} exited; its log ends:\n{tail}")
            with socket.create_connection((host, port), timeout=1):
                return True

        wait_until(accepting, timeout, f"the broker on {node} did not accept connections on {host}:{port}")

    def setup(self) -> None:
        for node in self.remotes:
            self.node_dir(node).mkdir(parents=True, exist_ok=True)
            self.start(node)
        for node in self.remotes:
            self.wait_ready(node)

    def kill(self, node: str) -> None:
        self.remotes[node].kill(DAEMON)

    def stop(self, node: str) -> int | None:
        return self.remotes[node].stop(DAEMON, 20)

    def pause(self, node: str) -> None:
        self.remotes[node].pause(DAEMON)

    def resume(self, node: str) -> None:
        self.remotes[node].resume(DAEMON)

    def running(self, node: str) -> bool:
        return self.remotes[node].pid(DAEMON) is not None

    def teardown(self, store_dir: Path) -> None:
        """Stop every broker cleanly and copy its log into store/nodes/<node>/."""
        for node, remote in self.remotes.items():
            try:
                remote.resume(DAEMON)  # a paused broker cannot act on SIGTERM
            except Exception:  # noqa: BLE001 - it may not be running at all
                pass
            try:
                status = self.stop(node)
                if status not in (0, None):
                    log.warning("broker on %s exited with status %s", node, status)
            except Exception as exc:  # noqa: BLE001 - teardown goes on for the other nodes
                log.warning("stopping the broker on %s failed: %s", node, exc)
        for node, remote in self.remotes.items():
            dest = store_dir / "nodes" / node
            dest.mkdir(parents=True, exist_ok=True)
            if self.log_path(node).exists():
                remote.download(self.log_path(node), dest / "broker.log")
