"""What every node backend's cluster shares: its record, and the bookkeeping of its teardown.

In: a run id, its tag, node names, a work directory and the run's subnet. Out:
`RegisteredCluster`, the base of `LocalCluster` (network namespaces) and `DockerCluster`
(containers): `state()` (the common fields and the backend's own), `save_state()` writing
`workdir/cluster.json` and the registry entry that `cleanup` reads, `destroy()` around the
backend's `_remove()` (the registry entry goes only once everything did), and the context
manager; `validate_nodes` and `taken_subnets`, which both backends' `create` use.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterable

from .iproute import networks_in_use
from .names import MAX_NODES, NODE_RE
from .registry import harness_identity, read_registry, registry_path, write_json_atomically
from .remote import RemoteError

log = logging.getLogger("faultline.control")

STATE_FILE = "cluster.json"


class RegisteredCluster(ABC):
    """A run's nodes on some backend, recorded in the registry from before anything exists until
    everything is gone. Subclasses set `backend` and `remotes`, and define `_backend_state` and
    `_remove`."""

    backend: str = ""

    def __init__(self, run_id: str, tag: str, node_names: list[str], workdir: Path,
                 subnet: ipaddress.IPv4Network):
        self.run_id = run_id
        self.tag = tag
        self.workdir = workdir
        self.subnet = subnet
        self.nodes = list(node_names)
        self.remotes: dict = {}
        self.status = "creating"
        self.created_at = time.time()
        self._harness = harness_identity()
        self._state_lock = threading.Lock()
        self._destroy_lock = threading.Lock()

    @property
    def state_path(self) -> Path:
        return self.workdir / STATE_FILE

    @property
    def registry_path(self) -> Path:
        return registry_path(self.tag)

    @abstractmethod
    def _backend_state(self) -> dict:
        """The backend's own fields of the record: its objects' names, per node too."""

    @abstractmethod
    def _remove(self) -> list[str]:
        """Remove every object of the run, going on past failures; what could not be removed."""

    def state(self) -> dict:
        return {"version": 1, "backend": self.backend, "run_id": self.run_id, "tag": self.tag,
                "status": self.status, "created_at": self.created_at, "harness": self._harness,
                "workdir": str(self.workdir), "subnet": str(self.subnet), **self._backend_state()}

    def save_state(self) -> None:
        """Write `workdir/cluster.json` and the registry entry (both atomically)."""
        with self._state_lock:
            state = self.state()
            write_json_atomically(self.state_path, state)
            if self.status != "destroyed":
                write_json_atomically(self.registry_path, state)

    def destroy(self) -> None:
        """Remove the run's objects. Idempotent. Goes on past a failing step, then raises one
        `RemoteError` listing every failure (the registry entry then stays, for `cleanup`)."""
        with self._destroy_lock:
            if self.status != "destroyed":
                self.status = "destroying"
                with contextlib.suppress(OSError):
                    self.save_state()
            errors = self._remove()
            if errors:
                raise RemoteError(f"destroying cluster {self.tag} left things behind "
                                  f"(`faultline cleanup` retries): " + "; ".join(errors))
            self.status = "destroyed"
            with contextlib.suppress(OSError):
                self.save_state()
            with contextlib.suppress(FileNotFoundError):
                self.registry_path.unlink()

    def _destroy_after_failure(self) -> None:
        # The error that stopped create matters more than a failing cleanup of its remains.
        try:
            self.destroy()
        except Exception as exc:  # noqa: BLE001
            log.error("could not remove the remains of cluster %s: %s", self.tag, exc)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.tag} {self.subnet} {self.status} nodes={self.nodes}>"


def validate_nodes(node_names: list[str]) -> None:
    if not node_names:
        raise ValueError("a cluster needs at least one node")
    if len(node_names) > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes fit in one /24 with room to spare; got {len(node_names)}")
    if len(set(node_names)) != len(node_names):
        raise ValueError(f"node names must be unique: {node_names}")
    for node in node_names:
        if not NODE_RE.match(node):
            raise ValueError(f"node name {node!r} must be 1-32 of [A-Za-z0-9_.-], starting with a letter or digit")


def taken_subnets(extra: Iterable[ipaddress.IPv4Network] = ()) -> list[ipaddress.IPv4Network]:
    """Networks a new run must not take: the host's, every registered run's, and `extra`.
    Call it holding the registry lock."""
    taken = networks_in_use() + list(extra)
    for entry in read_registry().values():
        with contextlib.suppress(KeyError, ValueError, TypeError):
            taken.append(ipaddress.ip_network(entry["subnet"]))
    return taken
