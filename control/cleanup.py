"""Find and remove what crashed harnesses left behind on this machine.

In: nothing but the machine's state: network namespaces named
`faultline-<tag>-<node>`, veths `fl<tag>n<i>` and bridges `flb<tag>` in the
root namespace, the namespace backend's rules in the host's FORWARD chain
(comment `faultline-<tag>`, see `forward`), registry entries
`<registry>/<tag>.json` (see `registry`), mounts of the power-loss file system
(`lazyfs`) outside the work folders of runs still in progress, and the Docker
backend's containers and networks (label `org.faultline.run=<tag>`) on every
daemon a registry entry names and on the default one ($DOCKER_HOST, else
/var/run/docker.sock) when it answers.
Out: `Leftovers`, listing those objects (and the processes inside each
namespace), which `cleanup()` has also removed unless `dry_run`; its
`describe()` is what `faultline cleanup` prints.

Only our own objects are touched: a name must match our pattern exactly and
a link must also be of the kind we create (veth or bridge); a Docker object
must carry our label; a FORWARD rule must carry our comment. Runs whose
harness still runs (same pid and start time as in its registry entry) are
left alone unless `include_live`, so cleaning up never breaks a test in
progress.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from . import forward, lazyfs
from .iproute import delete_link, delete_namespace, link_kind, list_links, list_namespaces
from .names import BRIDGE_RE, DEFAULT_DOCKER_HOST, LABEL_RUN, NAMESPACE_RE, TAG_RE, VETH_RE
from .processes import kill_namespace_processes, namespace_pids, process_cmdline
from .registry import harness_alive, read_registry, registry_path


@dataclass
class LeftoverProcess:
    pid: int
    cmdline: str


@dataclass
class LeftoverNamespace:
    name: str
    tag: str
    node: str
    processes: list[LeftoverProcess] = field(default_factory=list)


@dataclass
class LeftoverLink:
    name: str
    kind: str
    tag: str


@dataclass
class LeftoverDocker:
    """A container or network of the Docker backend, on the daemon at `host`."""

    kind: str  # "container" or "network"
    name: str
    tag: str
    host: str


@dataclass
class Leftovers:
    namespaces: list[LeftoverNamespace] = field(default_factory=list)
    links: list[LeftoverLink] = field(default_factory=list)
    registry: list[Path] = field(default_factory=list)
    #: mount points of the power-loss file system
    mounts: list[str] = field(default_factory=list)
    #: the Docker backend's containers and networks
    docker: list[LeftoverDocker] = field(default_factory=list)
    #: the namespace backend's FORWARD rules, as `iptables -S` prints them, by tag
    forward_rules: dict[str, list[str]] = field(default_factory=dict)
    #: tags of runs whose harness is still running, left alone
    live_runs: list[str] = field(default_factory=list)
    #: what could not be removed, one sentence each
    errors: list[str] = field(default_factory=list)
    #: True once `cleanup` (not a dry run) has acted on this list
    removed: bool = False

    @property
    def processes(self) -> list[LeftoverProcess]:
        return [p for ns in self.namespaces for p in ns.processes]

    @property
    def tags(self) -> list[str]:
        found = {ns.tag for ns in self.namespaces} | {link.tag for link in self.links}
        found |= {path.stem for path in self.registry} | {d.tag for d in self.docker} | set(self.forward_rules)
        return sorted(found)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.registry or self.mounts or self.docker
                    or self.forward_rules)

    def describe(self) -> str:
        verb = "removed" if self.removed else "found"
        lines = []
        for ns in self.namespaces:
            lines.append(f"{verb} namespace {ns.name} (run {ns.tag}, node {ns.node}) "
                         f"with {len(ns.processes)} process(es)")
            lines += [f"    {verb} process {p.pid}: {p.cmdline}" for p in ns.processes]
        lines += [f"{verb} {link.kind} {link.name} (run {link.tag})" for link in self.links]
        lines += [f"{verb} mount {mount} (power-loss file system)" for mount in self.mounts]
        lines += [f"{verb} Docker {d.kind} {d.name} (run {d.tag}, daemon {d.host})" for d in self.docker]
        lines += [f"{verb} FORWARD rule `{rule}` (run {tag})" for tag, rules in sorted(self.forward_rules.items())
                  for rule in rules]
        lines += [f"{verb} registry entry {path}" for path in self.registry]
        lines += [f"left alone run {tag}: its harness is still running" for tag in self.live_runs]
        lines += [f"error: {error}" for error in self.errors]
        if not self:
            lines.insert(0, "nothing left over by faultline runs")
        return "\n".join(lines)

    def to_json(self) -> dict:
        data = asdict(self)
        data["registry"] = [str(p) for p in self.registry]
        return data

    def __str__(self) -> str:
        return self.describe()


def find_leftovers(include_live: bool = False, tags: Iterable[str] | None = None) -> Leftovers:
    """List our namespaces (with their processes), links and registry entries; change nothing.

    `tags` restricts the search to those runs.
    """
    wanted = set(tags) if tags is not None else None
    # Objects first, registry after: a harness registers before creating
    # anything, so every object of a live run seen here has an entry by the
    # time the registry is read.
    namespaces = []
    for name in sorted(list_namespaces()):
        match = NAMESPACE_RE.match(name)
        if match:
            namespaces.append((name, match[1], match[2]))
    links = []
    for link in list_links():
        name, kind = link.get("ifname", ""), link_kind(link)
        match = (BRIDGE_RE.match(name) if kind == "bridge" else VETH_RE.match(name) if kind == "veth" else None)
        if match:
            links.append(LeftoverLink(name, kind, match[1]))
    registry = read_registry()

    live = set() if include_live else {tag for tag, entry in registry.items() if harness_alive(entry)}
    if wanted is not None:
        live &= wanted

    def ours(tag: str) -> bool:
        return tag not in live and (wanted is None or tag in wanted)

    found = Leftovers(live_runs=sorted(live))
    for name, tag, node in namespaces:
        if ours(tag):
            processes = [LeftoverProcess(pid, process_cmdline(pid)) for pid in namespace_pids(name)]
            found.namespaces.append(LeftoverNamespace(name, tag, node, processes))
    found.links = [link for link in links if ours(link.tag)]
    found.registry = [registry_path(tag) for tag in registry if ours(tag)]
    # A mount belongs to the run whose work folder holds it; one outside every registered run's
    # folder is an orphan whatever `tags` says.
    folders = {tag: str(entry.get("workdir", "")) for tag, entry in registry.items() if entry.get("workdir")}
    for mount in lazyfs.mounts():
        owner = next((tag for tag, folder in folders.items() if mount in lazyfs.mounts_under(folder)), None)
        if owner is None or ours(owner):
            found.mounts.append(mount)
    found.forward_rules = {tag: rules for tag, rules in forward.rules().items() if ours(tag)}
    found.docker, found.errors[:0] = _docker_leftovers(registry, ours)
    return found


def _docker_hosts(registry: dict[str, dict]) -> tuple[list[str], set[str]]:
    """Every daemon to look at: those registry entries name (they must answer), then the default
    one (looked at only when it answers: a machine without Docker has nothing of ours there)."""
    named = sorted({str((entry.get("docker") or {}).get("host")) for entry in registry.values()
                    if (entry.get("docker") or {}).get("host")})
    default = os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    hosts = named + ([default] if default not in named else [])
    return hosts, set(named)


def _docker_leftovers(registry: dict[str, dict], ours) -> tuple[list[LeftoverDocker], list[str]]:
    hosts, required = _docker_hosts(registry)
    if not required and not _default_daemon_may_exist(hosts[-1]):
        return [], []
    from .docker_cluster import DockerUnavailable, connect

    found: list[LeftoverDocker] = []
    errors: list[str] = []
    for host in hosts:
        try:
            client = connect(host)
        except DockerUnavailable as exc:
            if host in required:
                errors.append(f"a run registered the Docker daemon at {host}, and: {exc}; then run "
                              f"`faultline cleanup` again")
            continue
        try:
            for c in client.api.containers(all=True, filters={"label": LABEL_RUN}):
                tag = (c.get("Labels") or {}).get(LABEL_RUN, "")
                if TAG_RE.match(tag) and ours(tag):
                    found.append(LeftoverDocker("container", c["Names"][0].lstrip("/"), tag, host))
            for n in client.api.networks(filters={"label": LABEL_RUN}):
                tag = (n.get("Labels") or {}).get(LABEL_RUN, "")
                if TAG_RE.match(tag) and ours(tag):
                    found.append(LeftoverDocker("network", n["Name"], tag, host))
        finally:
            client.close()
    return found, errors


def _default_daemon_may_exist(host: str) -> bool:
    # Importing the SDK and timing out on a socket that is not there is the common case on a
    # machine without Docker: look for the socket first.
    return not host.startswith("unix://") or Path(host[len("unix://"):]).exists()


def cleanup(dry_run: bool = False, include_live: bool = False, tags: Iterable[str] | None = None) -> Leftovers:
    """Remove what `find_leftovers` finds: processes, then namespaces, then links, then registry entries.

    Goes on past failures and lists them in `errors`; a registry entry is
    kept while anything of its run could not be removed, so a later
    cleanup tries again.
    """
    found = find_leftovers(include_live=include_live, tags=tags)
    if dry_run:
        return found
    failed_tags: set[str] = set()
    for ns in found.namespaces:
        try:
            for pid in kill_namespace_processes(ns.name):
                if pid not in {p.pid for p in ns.processes}:
                    # Started between the listing and the kill; still ours.
                    ns.processes.append(LeftoverProcess(pid, ""))
            delete_namespace(ns.name)
        except Exception as exc:  # noqa: BLE001 - reported, and the rest still cleaned
            found.errors.append(f"namespace {ns.name}: {exc}")
            failed_tags.add(ns.tag)
    for link in found.links:
        try:
            delete_link(link.name)
        except Exception as exc:  # noqa: BLE001
            found.errors.append(f"{link.kind} {link.name}: {exc}")
            failed_tags.add(link.tag)
    for mount in found.mounts:
        try:
            lazyfs.unmount(mount)
        except OSError as exc:
            found.errors.append(f"mount {mount}: {exc}")
    for tag in found.forward_rules:
        try:
            forward.remove(tag)
        except Exception as exc:  # noqa: BLE001
            found.errors.append(f"FORWARD rules of run {tag}: {exc}")
            failed_tags.add(tag)
    for host in sorted({d.host for d in found.docker}):
        mine = [d for d in found.docker if d.host == host]
        errors = _remove_docker(host, mine)
        found.errors += errors
        if errors:
            failed_tags |= {d.tag for d in mine}
    for path in found.registry:
        if path.stem in failed_tags:
            continue
        try:
            _mark_workdir_state(path)
            path.unlink(missing_ok=True)
        except OSError as exc:
            found.errors.append(f"registry entry {path}: {exc}")
    found.removed = True
    return found


def _remove_docker(host: str, objects: list[LeftoverDocker]) -> list[str]:
    from .docker_cluster import DockerUnavailable, connect, remove_objects

    try:
        client = connect(host)
    except DockerUnavailable as exc:
        return [str(exc)]
    try:
        return remove_objects(client, [d.name for d in objects if d.kind == "container"],
                              [d.name for d in objects if d.kind == "network"])
    finally:
        client.close()


def _mark_workdir_state(entry_path: Path) -> None:
    # The run's own cluster.json would otherwise still claim "up".
    try:
        entry = json.loads(entry_path.read_text())
        state_path = Path(entry["workdir"]) / "cluster.json"
        state = json.loads(state_path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return
    if state.get("tag") == entry.get("tag"):
        state["status"] = "cleaned up"
        try:
            state_path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        except OSError:
            pass
