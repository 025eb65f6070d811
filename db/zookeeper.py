"""ZooKeeper for a test's cluster: Debian's ZooKeeper run with java on its own node(s).

In: the ZooKeeper nodes' `Remote`s and a work directory. Out: a standalone
server or an ensemble (`server.N` lines, `myid`), started on its nodes, awaited
until it serves (`ruok` answered `imok`, and for an ensemble `srvr` naming a
leader or follower), stopped, with `zoo.cfg` and its log copied to
`store/nodes/<node>/`; and `connect`, the `zookeeper.connect` string brokers
are given. `ClusterView` reads Kafka's znodes (controller, partition states)
so that the harness can find a partition's leader or the controller.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
from pathlib import Path

from ..control.wait import wait_until
from .core import EXITED, wait_serving

log = logging.getLogger("faultline.zookeeper")

CLIENT_PORT = 2181
PEER_PORT, ELECTION_PORT = 2888, 3888
DAEMON = "zookeeper"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# slf4j-simple (from libslf4j-java, a dependency of Debian's zookeeper) sends ZooKeeper's own log to
# stderr, which lands in the node's zookeeper.log; without a binding slf4j would drop it.
CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"
JAR = Path("/usr/share/java/zookeeper.jar")


def zoo_cfg(data_dir: Path, client_address: str, servers: dict[int, str], tick_ms: int = 500,
            client_port: int = CLIENT_PORT) -> str:
    """zoo.cfg text. `servers`: myid -> address, for an ensemble (empty for a standalone server)."""
    lines = [
        f"tickTime={tick_ms}",
        f"dataDir={data_dir}",
        f"clientPort={client_port}",
        f"clientPortAddress={client_address}",
        "initLimit=20",
        "syncLimit=10",
        # Sessions from 2 ticks up to 60 s: brokers choose theirs with zookeeper.session.timeout.ms.
        f"minSessionTimeout={2 * tick_ms}",
        "maxSessionTimeout=60000",
        "admin.enableServer=false",
        "4lw.commands.whitelist=ruok,srvr,mntr",
    ]
    lines += [f"server.{i}={addr}:{PEER_PORT}:{ELECTION_PORT}" for i, addr in sorted(servers.items())]
    return "\n".join(lines) + "\n"


def java_command(cfg: Path, log_dir: Path, java: str | None = None) -> list[str]:
    java = java or shutil.which("java") or "/usr/bin/java"
    return [java, "-Xms64m", "-Xmx256m", "-cp", CLASSPATH, f"-Dzookeeper.log.dir={log_dir}",
            "-Dorg.slf4j.simpleLogger.showDateTime=true", MAIN_CLASS, str(cfg)]


def four_letter(host: str, command: str, timeout: float = 2.0, port: int = CLIENT_PORT) -> str:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperDB:
    """ZooKeeper on its own nodes; server ids are 1..n in node order."""

    def __init__(self, remotes: dict, workdir: Path):
        if not JAR.exists():
            raise RuntimeError(f"{JAR} is missing: install Debian's zookeeper package (scripts/setup does)")
        self.remotes = remotes
        self.workdir = workdir
        self.ids = {node: i + 1 for i, node in enumerate(remotes)}

    @property
    def connect(self) -> str:
        return ",".join(f"{r.address}:{CLIENT_PORT}" for r in self.remotes.values())

    def node_dir(self, node: str) -> Path:
        return self.workdir / node

    def log_path(self, node: str) -> Path:
        return self.node_dir(node) / "zookeeper.log"

    def start(self, node: str) -> int:
        remote = self.remotes[node]
        home = self.node_dir(node)
        data = home / "data"
        data.mkdir(parents=True, exist_ok=True)
        ensemble = len(self.remotes) > 1
        servers = {self.ids[n]: r.address for n, r in self.remotes.items()} if ensemble else {}
        (data / "myid").write_text(f"{self.ids[node]}\n")
        cfg = home / "zoo.cfg"
        cfg.write_text(zoo_cfg(data, remote.address, servers))
        pid = remote.spawn(DAEMON, java_command(cfg, home, remote.java), self.log_path(node))
        log.info("started ZooKeeper %d on %s (pid %d)", self.ids[node], node, pid)
        return pid

    def wait_ready(self, node: str, timeout: float = 60) -> None:
        remote = self.remotes[node]
        ensemble = len(self.remotes) > 1

        def serving() -> str | bool:
            # wait_until takes exceptions for "not yet", so an exit is returned and raised below:
            # a server that cannot start is reported at once, not after the whole timeout.
            if remote.pid(DAEMON) is None:
                return EXITED
            if four_letter(remote.address, "ruok") != "imok":
                return False
            # ruok is answered before the server serves clients (a standalone server still
            # loading its database, an ensemble member before a quorum has formed); srvr names
            # the mode only once it serves.
            modes = ("Mode: leader", "Mode: follower") if ensemble else ("Mode: standalone",)
            return any(m in four_letter(remote.address, "srvr") for m in modes)

        wait_serving(serving, timeout, f"ZooKeeper on {node} ({remote.address}:{CLIENT_PORT}) did not serve; "
                                       f"see {self.log_path(node)}", "ZooKeeper", node, self.log_path(node))

    def setup(self) -> None:
        for node in self.remotes:
            self.start(node)
        for node in self.remotes:
            self.wait_ready(node)

    def kill(self, node: str) -> None:
        self.remotes[node].kill(DAEMON)

    def running(self, node: str) -> bool:
        return self.remotes[node].pid(DAEMON) is not None

    def teardown(self, store_dir: Path) -> None:
        for node, remote in self.remotes.items():
            try:
                remote.resume(DAEMON)
                remote.kill(DAEMON)
            except Exception as exc:  # noqa: BLE001 - teardown goes on for the other nodes
                log.warning("stopping ZooKeeper on %s failed: %s", node, exc)
            dest = store_dir / "nodes" / node
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("zookeeper.log", "zoo.cfg"):
                src = self.node_dir(node) / name
                if src.exists():
                    remote.download(src, dest / name)


class LocalZooKeeper:
    """One ZooKeeper server on 127.0.0.1 on a free port, no namespace: for broker tests and
    benchmarks that run brokers on localhost."""

    def __init__(self, root: Path):
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "LocalZooKeeper":
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.root / "zoo.cfg"
        cfg.write_text(zoo_cfg(data, "127.0.0.1", {}, client_port=self.port))
        with open(self.root / "zookeeper.log", "a") as out:
            self.proc = subprocess.Popen(java_command(cfg, self.root), stdout=out, stderr=subprocess.STDOUT)
        if wait_until(self._serving, 60, f"ZooKeeper did not serve on {self.connect}; "
                                         f"see {self.root}/zookeeper.log") == EXITED:
            raise RuntimeError(f"ZooKeeper exited with status {self.proc.returncode} while starting; "
                               f"{self.root}/zookeeper.log ends:\n"
                               f"{(self.root / 'zookeeper.log').read_text(errors='replace')[-2000:]}")
        return self

    def _serving(self) -> str | bool:
        if self.proc.poll() is not None:
            return EXITED
        return "Mode: standalone" in four_letter("127.0.0.1", "srvr", port=self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ClusterView:
    """Read-only: who is the controller, who leads a partition, as ZooKeeper says."""

    def __init__(self, connect: str):
        from kazoo.client import KazooClient

        self.zk = KazooClient(hosts=connect, timeout=10)
        self.zk.start(15)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def controller(self) -> int | None:
        from kazoo.exceptions import NoNodeError

        try:
            return int(json.loads(self.zk.get("/controller")[0])["brokerid"])
        except NoNodeError:
            return None

    def partition_state(self, topic: str, partition: int) -> dict | None:
        from kazoo.exceptions import NoNodeError

        try:
            return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])
        except NoNodeError:
            return None

    def brokers(self) -> list[int]:
        return sorted(int(c) for c in self.zk.get_children("/brokers/ids"))
