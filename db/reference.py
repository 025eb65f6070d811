"""The reference broker as a system under test (a `DB`), through a Remote per node.

In: the test spec and one `Remote` per node (brokers `n1..nN`, and for a
replicated cluster ZooKeeper on `zk1..zkM`). Out: ZooKeeper and the brokers started, stopped,
killed, paused and resumed on their nodes (the `DB` of a Jepsen test), their
readiness awaited, and their logs collected into the run's store folder.
With the power-loss nemesis, each node's data directory is a mount of the
file system that keeps unsynced writes in memory (`control/lazyfs`), run as
the node's daemon "disk"; `power_off` kills the node's broker and that file
system at once, `power_on` mounts the disk again and starts the broker.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from ..control import lazyfs
from ..models.spec import TestSpec
from .core import DB, EXITED, log_end_on_disk, wait_serving
from .zookeeper import ZooKeeperDB

log = logging.getLogger("faultline.db")

BROKER_PORT = 9092
DAEMON = "broker"
DISK = "disk"


# What a replicated run gives its brokers unless the test's --broker-set says otherwise: failures
# are noticed in seconds (Kafka 2.x's session timeout and its lag limit before 2.5), not half a minute.
CLUSTER_DEFAULTS = {"zookeeper.session.timeout.ms": "6000", "replica.lag.time.max.ms": "10000"}


class ReferenceBrokerDB(DB):
    """Runs `faultline broker` on every broker node; node i (from 1) is broker id i.

    With ZooKeeper nodes (`zk1`..) the brokers form a replicated cluster; `leader()` and
    `controller()` then say, from ZooKeeper, which node leads a partition and which
    is the controller (for nemeses that target them). Standalone, the one node is both."""

    @staticmethod
    def node_names(spec: TestSpec) -> tuple[list[str], list[str]]:
        """(broker nodes, ZooKeeper nodes) a test of this spec runs on."""
        return ([f"n{i + 1}" for i in range(spec.nodes)],
                [f"zk{i + 1}" for i in range(spec.effective_zookeeper_nodes)])

    def __init__(self, spec: TestSpec, remotes: dict, workdir: Path):
        self.spec = spec
        self.nodes, self.support_nodes = self.node_names(spec)
        self.remotes = {n: remotes[n] for n in self.nodes}
        self.workdir = workdir
        self.node_ids = {name: i + 1 for i, name in enumerate(self.nodes)}
        self.zookeeper = (ZooKeeperDB({n: remotes[n] for n in self.support_nodes}, workdir)
                          if self.support_nodes else None)
        self.zookeeper_connect = self.zookeeper.connect if self.zookeeper else None
        self._view = None

    def settings(self) -> dict[str, str]:
        settings: dict[str, str] = {}
        if self.zookeeper_connect:
            settings = dict(CLUSTER_DEFAULTS, **{"zookeeper.connect": self.zookeeper_connect,
                                                 "default.replication.factor": str(self.spec.effective_replication_factor)})
        settings.update(self.spec.broker_settings)
        return settings

    def node_of(self, broker_id: int | None) -> str | None:
        return next((n for n, i in self.node_ids.items() if i == broker_id), None)

    def _cluster_view(self):
        if self._view is None:
            from .zookeeper import ClusterView

            self._view = ClusterView(self.zookeeper_connect)
        return self._view

    def leader(self, topic: str, partition: int) -> str | None:
        if not self.zookeeper_connect:
            return next(iter(self.remotes))
        state = self._cluster_view().partition_state(topic, partition)
        return self.node_of(state["leader"]) if state else None

    def in_sync_replicas(self, topic: str, partition: int) -> list[str]:
        if not self.zookeeper_connect:
            return list(self.remotes)
        state = self._cluster_view().partition_state(topic, partition)
        return sorted(n for n in (self.node_of(b) for b in (state or {}).get("isr", [])) if n is not None)

    def controller(self) -> str | None:
        if not self.zookeeper_connect:
            return next(iter(self.remotes))
        return self.node_of(self._cluster_view().controller())

    def node_dir(self, node: str) -> Path:
        return self.workdir / node

    def address(self, node: str) -> str:
        return f"{self.remotes[node].address}:{BROKER_PORT}"

    def partition_dir(self, node: str, topic: str, partition: int) -> Path:
        return self.node_dir(node) / "data" / f"{topic}-{partition}"

    def log_end_offset(self, node: str, topic: str, partition: int) -> int | None:
        # Every backend keeps a node's home at the same path on this machine (a container's is
        # bind-mounted), so a stopped broker's files are read here directly.
        return log_end_on_disk(self.partition_dir(node, topic, partition))

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(n) for n in self.remotes)

    def command(self, node: str) -> list[str]:
        cmd = [self.remotes[node].python, "-m", "faultline.broker.main", "--node-id", str(self.node_ids[node]),
               "--listen", self.address(node), "--data-dir", str(self.node_dir(node) / "data")]
        for key, value in self.settings().items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def log_path(self, node: str) -> Path:
        return self.node_dir(node) / "broker.log"

    @property
    def power_loss(self) -> bool:
        return any(kind.startswith("power-loss") for kind in self.spec.nemesis)

    def disk_dir(self, node: str) -> Path:
        """What the node's disk holds: its data directory as of the last fsyncs (power-loss runs)."""
        return self.node_dir(node) / "disk"

    def mount_disk(self, node: str) -> int:
        """Mount the node's disk on its data directory through the power-loss file system; its pid."""
        remote, data = self.remotes[node], self.node_dir(node) / "data"
        for path in (self.disk_dir(node), data):
            path.mkdir(parents=True, exist_ok=True)
        pid = remote.spawn(DISK, [remote.python, "-m", "faultline.control.lazyfs", str(self.disk_dir(node)),
                                  str(data)], self.node_dir(node) / "disk.log", host_mounts=True)

        def mounted() -> bool | str:
            if remote.pid(DISK) is None:
                return EXITED
            probe = remote.run(["findmnt", "-n", "-o", "SOURCE", "--mountpoint", str(data)], check=False,
                               host_mounts=True)
            return probe.stdout.strip() == lazyfs.FSNAME

        wait_serving(mounted, 30, f"the power-loss file system on {node} did not mount {data}",
                     "the power-loss file system", node, self.node_dir(node) / "disk.log")
        return pid

    def unmount_disk(self, node: str) -> None:
        self.remotes[node].run(["sh", "-c", 'findmnt --mountpoint "$1" >/dev/null && umount -l "$1" || true', "-",
                                str(self.node_dir(node) / "data")], host_mounts=True)

    def power_off(self, node: str) -> dict:
        """Cut the node's power: SIGKILL its broker and its file system at once, so what the broker
        wrote but did not fsync is gone. Says the pids killed and how many bytes of file length
        were not on the disk."""
        remote = self.remotes[node]
        pids = {"broker": remote.pid(DAEMON), "disk": remote.pid(DISK)}
        remote.kill(DAEMON)
        unsynced = self._bytes(node, self.node_dir(node) / "data") - self._bytes(node, self.disk_dir(node))
        remote.kill(DISK)
        self.unmount_disk(node)
        return {"pids": pids, "unsynced_bytes": max(0, unsynced)}

    def power_on(self, node: str) -> int:
        """Mount the node's disk again and start its broker (which recovers its log); the broker's pid."""
        return self.start(node)

    def _bytes(self, node: str, path: Path) -> int:
        out = self.remotes[node].run(["du", "-s", "-b", "--apparent-size", str(path)], check=False,
                                     host_mounts=True).stdout.split()
        return int(out[0]) if out and out[0].isdigit() else 0

    @property
    def skewable(self) -> bool:
        """Whether brokers run under libfaketime: a clock nemesis, or clocks that start off."""
        return bool(self.spec.clock_offsets) or any(k.startswith("clock") for k in self.spec.nemesis)

    def start_offset(self, node: str) -> int:
        """The seconds the node's wall clock starts off by (--clock-offset), where clock faults heal to."""
        return int(self.spec.clock_offsets.get(node, 0))

    def clock_file(self, node: str) -> Path:
        """The node's wall-clock offset, read by its broker through libfaketime (clock nemesis)."""
        return self.node_dir(node) / "faketime"

    def start(self, node: str) -> int:
        remote = self.remotes[node]
        if self.power_loss and remote.pid(DISK) is None:
            self.mount_disk(node)
        env = None
        if self.skewable:
            from ..control.clock import environment, set_offset

            if not self.clock_file(node).exists():
                set_offset(self.clock_file(node), self.start_offset(node))
            env = environment(self.clock_file(node))
        pid = remote.spawn(DAEMON, self.command(node), self.log_path(node), env=env)
        log.info("started broker %d on %s (pid %d)", self.node_ids[node], node, pid)
        return pid

    def wait_ready(self, node: str, timeout: float = 30) -> None:
        host, port = self.remotes[node].address, BROKER_PORT

        def accepting() -> bool | str:
            if self.remotes[node].pid(DAEMON) is None:
                return EXITED
            with socket.create_connection((host, port), timeout=1):
                return True

        wait_serving(accepting, timeout, f"the broker on {node} did not accept connections on {host}:{port}",
                     "the broker", node, self.log_path(node))

    def setup(self) -> None:
        if self.zookeeper is not None:
            self.zookeeper.setup()
        for node in self.remotes:
            self.node_dir(node).mkdir(parents=True, exist_ok=True)
            self.start(node)
        for node in self.remotes:
            self.wait_ready(node)

    def kill(self, node: str) -> int | None:
        """SIGKILL the node's broker; return the pid it had (None: it was not running)."""
        pid = self.remotes[node].pid(DAEMON)
        self.remotes[node].kill(DAEMON)
        return pid

    def stop(self, node: str) -> int | None:
        return self.remotes[node].stop(DAEMON, 20)

    def pause(self, node: str) -> None:
        self.remotes[node].pause(DAEMON)

    def resume(self, node: str) -> None:
        self.remotes[node].resume(DAEMON)

    def running(self, node: str) -> bool:
        return self.remotes[node].pid(DAEMON) is not None

    def teardown(self, store_dir: Path) -> None:
        """Stop every broker cleanly, then ZooKeeper, and copy their logs into store/nodes/<node>/."""
        try:
            self._teardown_brokers(store_dir)
        finally:
            if self.zookeeper is not None:
                self.zookeeper.teardown(store_dir)

    def _teardown_brokers(self, store_dir: Path) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
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
            if self.power_loss:
                try:
                    remote.stop(DISK, 10)  # the broker flushed everything on its clean shutdown
                    self.unmount_disk(node)
                except Exception as exc:  # noqa: BLE001
                    log.warning("unmounting the disk of %s failed: %s", node, exc)
        for node, remote in self.remotes.items():
            dest = store_dir / "nodes" / node
            dest.mkdir(parents=True, exist_ok=True)
            if self.log_path(node).exists():
                remote.download(self.log_path(node), dest / "broker.log")
            if (self.node_dir(node) / "disk.log").exists():
                remote.download(self.node_dir(node) / "disk.log", dest / "disk.log")
