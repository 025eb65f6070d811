"""The local backend: every node is a Linux network namespace on this machine.

In: a run id, node names and a working directory (`LocalCluster.create`).
Out: a `LocalCluster` whose `remotes` map each node name to a `Remote` that
runs commands inside that node's namespace (`ip netns exec`), with the node's
own IPv4 address, its directory `workdir/<node>/`, and a record of the
cluster on disk (`workdir/cluster.json` and `<registry>/<tag>.json`) so a
later process can remove it; `destroy()` removes it all.

Topology: one namespace per node, each with `lo` and an `eth0` that is one
end of a veth pair whose other end is a port of a bridge in the root
namespace. The bridge holds the subnet's `.1`, so the harness reaches every
node directly and the nodes reach each other across the bridge. There is no
default route inside a node: its traffic can only go to the subnet. One
rule at the top of the host's FORWARD chain accepts what the bridge passes
between its own ports, so the nodes reach each other on a host where Docker
set that chain's policy to DROP (see `forward`).

Every name and the subnet derive from the run's tag (see `names`).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from pathlib import Path

from . import forward, lazyfs
from .cluster import STATE_FILE, RegisteredCluster, taken_subnets, validate_nodes
from .iproute import delete_link, delete_namespace, ip, list_links, list_namespaces
from .names import IFNAMSIZ, NAMESPACE_PREFIX, NODE_IFACE, bridge_name, choose_subnet, namespace_name, tag_for, veth_name
from .namespace_remote import NamespaceRemote
from .processes import kill_namespace_processes
from .registry import registry_lock, registry_path
from .remote import RemoteError

log = logging.getLogger("faultline.control")

__all__ = ["STATE_FILE", "LocalCluster"]


def _disable_ipv6(ifname: str) -> None:
    # Our links need only IPv4; without this the host would autoconfigure
    # link-local IPv6 on them and send router and neighbour solicitations.
    path = Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6")
    with contextlib.suppress(OSError):
        path.write_text("1")


class LocalCluster(RegisteredCluster):
    """Network namespaces on this machine, one per node, on one bridge. Use `create`, then `destroy`."""

    backend = "local"

    def __init__(self, run_id: str, tag: str, node_names: list[str], workdir: Path,
                 subnet: ipaddress.IPv4Network):
        super().__init__(run_id, tag, node_names, workdir, subnet)
        self.bridge = bridge_name(tag)
        hosts = list(subnet.hosts())
        self.bridge_address = str(hosts[0])
        self.namespaces = {node: namespace_name(tag, node) for node in self.nodes}
        self.veths = {node: veth_name(tag, i + 1) for i, node in enumerate(self.nodes)}
        assert all(len(name) <= IFNAMSIZ for name in [self.bridge, *self.veths.values()])
        self.remotes: dict[str, NamespaceRemote] = {
            node: NamespaceRemote(node, str(hosts[i + 1]), self.namespaces[node], workdir / node,
                                  on_change=self.save_state)
            for i, node in enumerate(self.nodes)}

    @classmethod
    def create(cls, run_id: str, node_names: list[str], workdir: Path | str) -> "LocalCluster":
        """Build the namespaces, veths and bridge for `node_names`; on any failure, remove what was built."""
        node_names = list(node_names)
        validate_nodes(node_names)
        if os.geteuid() != 0:
            raise PermissionError("the local backend creates network namespaces and links, which needs root")
        tag = tag_for(run_id)
        workdir = Path(workdir).resolve()
        for node in node_names:
            (workdir / node).mkdir(parents=True, exist_ok=True)

        with registry_lock():
            _refuse_existing(tag, len(node_names))
            cluster = cls(run_id, tag, node_names, workdir, choose_subnet(tag, taken_subnets()))
            # Registered before anything exists, so no object of ours is ever without an entry.
            cluster.save_state()
            try:
                cluster._create_bridge()
            except BaseException:
                cluster._destroy_after_failure()
                raise
        try:
            for node in node_names:
                cluster._create_node(node)
            cluster.status = "up"
            cluster.save_state()
        except BaseException:
            cluster._destroy_after_failure()
            raise
        log.info("cluster %s up: %s on %s (%s)", tag, ", ".join(
            f"{n}={r.address}" for n, r in cluster.remotes.items()), cluster.bridge, cluster.subnet)
        return cluster

    def _create_bridge(self) -> None:
        ip("link", "add", "name", self.bridge, "type", "bridge")
        # Before the bridge carries anything: on a host where Docker runs, its FORWARD policy would drop it.
        forward.allow_bridge(self.tag, self.bridge)
        _disable_ipv6(self.bridge)
        ip("addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", "dev", self.bridge, "up")

    def _create_node(self, node: str) -> None:
        ns, veth, remote = self.namespaces[node], self.veths[node], self.remotes[node]
        ip("netns", "add", ns)
        # The peer is born inside the namespace, so no unprefixed interface ever exists in the root namespace.
        ip("link", "add", "name", veth, "type", "veth", "peer", "name", NODE_IFACE, "netns", ns)
        _disable_ipv6(veth)
        ip("link", "set", "dev", veth, "master", self.bridge)
        ip("link", "set", "dev", veth, "up")
        ip("-n", ns, "link", "set", "dev", "lo", "up")
        ip("-n", ns, "addr", "add", f"{remote.address}/{self.subnet.prefixlen}", "dev", NODE_IFACE)
        ip("-n", ns, "link", "set", "dev", NODE_IFACE, "up")

    def _backend_state(self) -> dict:
        return {"bridge": {"name": self.bridge, "address": self.bridge_address},
                "nodes": {node: {"namespace": self.namespaces[node], "veth": self.veths[node],
                                 "address": remote.address, "home": str(remote.home), "daemons": remote.daemons()}
                          for node, remote in self.remotes.items()}}

    def _remove(self) -> list[str]:
        """Kill every process in every node's namespace, then delete namespaces, veths, the bridge and
        the FORWARD rule."""
        errors: list[str] = []
        for node, ns in self.namespaces.items():
            try:
                killed = kill_namespace_processes(ns)
                if killed:
                    log.debug("%s: killed %s", ns, killed)
            except Exception as exc:  # noqa: BLE001 - collected and raised by destroy
                errors.append(f"killing the processes in {ns}: {exc}")
            self.remotes[node]._forget_all()
        for mount in lazyfs.mounts_under(self.workdir):
            try:
                lazyfs.unmount(mount)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"unmounting {mount}: {exc}")
        for ns in self.namespaces.values():
            try:
                delete_namespace(ns)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"deleting namespace {ns}: {exc}")
        for link in [*self.veths.values(), self.bridge]:
            try:
                delete_link(link)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"deleting link {link}: {exc}")
        try:
            forward.remove(self.tag)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"removing the FORWARD rule of {self.bridge}: {exc}")
        return errors


def _refuse_existing(tag: str, node_count: int) -> None:
    # destroy() deletes by name, so every name must be free before we take it.
    if registry_path(tag).exists():
        raise RemoteError(f"run tag {tag} is already registered in {registry_path(tag)}; pick another run id, "
                          f"or run `faultline cleanup` if it was left by a crashed run")
    ours = [ns for ns in list_namespaces() if ns.startswith(f"{NAMESPACE_PREFIX}{tag}-")]
    taken_links = {link.get("ifname") for link in list_links()}
    ours += [name for name in (bridge_name(tag), *(veth_name(tag, i + 1) for i in range(node_count)))
             if name in taken_links]
    if ours:
        raise RemoteError(f"objects of run tag {tag} already exist ({', '.join(ours)}); "
                          f"run `faultline cleanup` to remove leftovers")
