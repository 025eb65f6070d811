"""The Docker backend: every node is a container, on one Docker network of the run's own.

In: a run id, node names, a working directory and the folders of this machine the nodes must
read (`DockerCluster.create`); the daemon `$DOCKER_HOST` names (else the default socket).
Out: a `DockerCluster` whose `remotes` map each node name to a `DockerRemote`:

- network `faultline-<tag>`, a bridge with a /24 chosen as the namespace backend chooses one
  (free on the host, in the registry and among the daemon's networks), the harness at `.1`;
- container `faultline-<tag>-<node>` per node, from the node image (`docker_image`), with a
  fixed address (`.2`, `.3`, ... in node order), its home `workdir/<node>` bind-mounted at the
  same path (the db layer writes configuration there, and the logs land there), the read-only
  folders asked for (Apache Kafka's jar cache), NET_ADMIN for partitions (iptables inside the
  container), SYS_ADMIN and /dev/fuse for the power-loss file system, and `--init` to reap
  what killed daemons leave;
- the label `org.faultline.run=<tag>` on the network and every container, which `faultline
  cleanup` looks for, and the run's registry entry (with the daemon's address) and
  `workdir/cluster.json`, as the namespace backend keeps them.

`destroy()` removes the containers (their processes and mounts go with them) and the network.
A daemon that cannot be reached raises `DockerUnavailable`, saying how to start or name one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from .cluster import RegisteredCluster, taken_subnets, validate_nodes
from .docker_remote import DockerRemote
from .names import DEFAULT_DOCKER_HOST, LABEL_NODE, LABEL_RUN, choose_subnet, container_name, network_name, tag_for
from .registry import registry_lock, registry_path
from .remote import RemoteError

log = logging.getLogger("faultline.control")


class DockerUnavailable(RemoteError):
    """No Docker daemon answers where the harness looks for one."""


def docker_host() -> str:
    """The daemon address the harness uses: $DOCKER_HOST, else the default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def connect(host: str | None = None):
    """A docker SDK client for the daemon at `host` (default `docker_host()`), checked with a ping."""
    try:
        import docker
    except ImportError:
        raise DockerUnavailable("the docker Python package is not installed; run scripts/setup") from None
    host = host or docker_host()
    try:
        client = docker.DockerClient(base_url=host, timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(
            f"no Docker daemon answers at {host} ({exc}). faultline starts no daemon itself: start one "
            f"(`systemctl start docker`, or `dockerd` by hand), or point DOCKER_HOST at the socket of the "
            f"one you run; scripts/setup --docker installs Docker's packages") from None
    return client


class DockerCluster(RegisteredCluster):
    """Containers on one Docker network, one per node. Use `create`, then `destroy`."""

    backend = "docker"

    def __init__(self, run_id: str, tag: str, node_names: list[str], workdir: Path,
                 subnet: ipaddress.IPv4Network, client, image: str, host: str, read_only: list[Path]):
        super().__init__(run_id, tag, node_names, workdir, subnet)
        self.client = client
        self.image = image
        self.docker_host = host
        self.read_only = read_only
        self.network = network_name(tag)
        hosts = list(subnet.hosts())
        self.gateway = str(hosts[0])
        self.containers = {node: container_name(tag, node) for node in self.nodes}
        self.remotes: dict[str, DockerRemote] = {
            node: DockerRemote(client, self.containers[node], node, str(hosts[i + 1]), workdir / node,
                               on_change=self.save_state)
            for i, node in enumerate(self.nodes)}

    @classmethod
    def create(cls, run_id: str, node_names: list[str], workdir: Path | str, read_only: Iterable[Path] = (),
               client=None, image: str | None = None, say: Callable[[str], None] = print) -> "DockerCluster":
        """Build the network and one container per node; on any failure, remove what was built."""
        from .docker_image import ensure_image

        node_names = list(node_names)
        validate_nodes(node_names)
        tag = tag_for(run_id)
        workdir = Path(workdir).resolve()
        for node in node_names:
            (workdir / node).mkdir(parents=True, exist_ok=True)
        host = docker_host()
        client = client or connect(host)
        image = image or ensure_image(client, say)
        read_only = [Path(p).resolve() for p in read_only if Path(p).exists()]

        with registry_lock():
            _refuse_existing(client, tag)
            subnet = choose_subnet(tag, taken_subnets(_docker_subnets(client)))
            cluster = cls(run_id, tag, node_names, workdir, subnet, client, image, host, read_only)
            # Registered before anything exists, so no object of ours is ever without an entry.
            cluster.save_state()
            try:
                cluster._create_network()
            except BaseException:
                cluster._destroy_after_failure()
                raise
        try:
            # Each container is a full copy of the image on the vfs storage driver: start them together.
            with ThreadPoolExecutor(min(4, len(node_names))) as pool:
                list(pool.map(cluster._create_container, node_names))
            cluster.status = "up"
            cluster.save_state()
        except BaseException:
            cluster._destroy_after_failure()
            raise
        log.info("cluster %s up: %s on Docker network %s (%s)", tag, ", ".join(
            f"{n}={r.address}" for n, r in cluster.remotes.items()), cluster.network, cluster.subnet)
        return cluster

    def _labels(self, node: str | None = None) -> dict[str, str]:
        labels = {LABEL_RUN: self.tag}
        if node is not None:
            labels[LABEL_NODE] = node
        return labels

    def _create_network(self) -> None:
        from docker.types import IPAMConfig, IPAMPool

        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(self.subnet), gateway=self.gateway)])
        self.client.api.create_network(self.network, driver="bridge", ipam=ipam, labels=self._labels(),
                                       check_duplicate=True)

    def _create_container(self, node: str) -> None:
        api, remote = self.client.api, self.remotes[node]
        binds = {str(remote.home): {"bind": str(remote.home), "mode": "rw"}}
        binds.update({str(path): {"bind": str(path), "mode": "ro"} for path in self.read_only})
        security = ["apparmor=unconfined"] if _apparmor_enabled() else None
        host_config = api.create_host_config(
            binds=binds, cap_add=["NET_ADMIN", "SYS_ADMIN"], devices=["/dev/fuse:/dev/fuse:rwm"], init=True,
            network_mode=self.network, security_opt=security)
        networking = api.create_networking_config(
            {self.network: api.create_endpoint_config(ipv4_address=remote.address)})
        container = api.create_container(self.image, command=["sleep", "infinity"], name=self.containers[node],
                                         hostname=node, labels=self._labels(node), host_config=host_config,
                                         networking_config=networking, detach=True)
        api.start(container["Id"])

    def _backend_state(self) -> dict:
        return {"docker": {"host": self.docker_host, "network": self.network, "image": self.image},
                "nodes": {node: {"container": self.containers[node], "address": remote.address,
                                 "home": str(remote.home),
                                 "daemons": remote.daemons() if self.status == "up" else {}}
                          for node, remote in self.remotes.items()}}

    def _remove(self) -> list[str]:
        """Remove every container (with its processes and mounts), then the network."""
        for remote in self.remotes.values():
            remote._forget_all()
        return remove_objects(self.client, list(self.containers.values()), [self.network])


def remove_objects(client, containers: list[str], networks: list[str]) -> list[str]:
    """Force-remove containers, then networks, by name or id; a missing one is not an error.
    Returns what could not be removed, one sentence each."""
    import docker.errors

    errors: list[str] = []

    def remove_container(name: str) -> None:
        try:
            client.api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            errors.append(f"container {name}: {exc}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(remove_container, containers))
    for name in networks:
        try:
            client.api.remove_network(name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            errors.append(f"network {name}: {exc}")
    return errors


def _docker_subnets(client) -> list[ipaddress.IPv4Network]:
    subnets = []
    for network in client.api.networks():
        for pool in (network.get("IPAM") or {}).get("Config") or []:
            with contextlib.suppress(KeyError, ValueError, TypeError):
                subnets.append(ipaddress.ip_network(pool["Subnet"]))
    return [s for s in subnets if s.version == 4]


def _refuse_existing(client, tag: str) -> None:
    if registry_path(tag).exists():
        raise RemoteError(f"run tag {tag} is already registered in {registry_path(tag)}; pick another run id, "
                          f"or run `faultline cleanup` if it was left by a crashed run")
    found = [c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={tag}"})]
    found += [n["Name"] for n in client.api.networks(filters={"label": f"{LABEL_RUN}={tag}"})]
    if found:
        raise RemoteError(f"Docker objects of run tag {tag} already exist ({', '.join(found)}); "
                          f"run `faultline cleanup` to remove leftovers")


def _apparmor_enabled() -> bool:
    # Docker's default AppArmor profile forbids mount(2), which the power-loss file system needs.
    try:
        return Path("/sys/module/apparmor/parameters/enabled").read_text().strip() == "Y"
    except OSError:
        return False
