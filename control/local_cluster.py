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
default route inside a node: its traffic can only go to the subnet.

Names: everything created carries a fixed prefix and the run's tag (1-8 of
[a-z0-9]), so cleanup finds exactly our objects and nothing else:
namespace `faultline-<tag>-<node>`, bridge `flb<tag>`, host-side veth
`fl<tag>n<index>` (Linux allows interface names of at most 15 characters).
Subnet: a /24 in 10.200.0.0-10.255.255.0 derived from the tag, skipping
any network already routed or addressed on the host or held by another run.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from . import lazyfs
from .remote import (DEFAULT_RUN_TIMEOUT, DEFAULT_STOP_TIMEOUT, AlreadyRunning, CommandFailed, CommandTimeout,
                     NotRunning, Remote, RemoteError)
from .wait import wait_until

log = logging.getLogger("faultline.control")

NAMESPACE_PREFIX = "faultline-"
BRIDGE_PREFIX = "flb"
VETH_PREFIX = "fl"
NODE_IFACE = "eth0"
MAX_NODES = 200
IFNAMSIZ = 15

TAG_RE = re.compile(r"^[a-z0-9]{1,8}$")
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
NAMESPACE_RE = re.compile(r"^faultline-([a-z0-9]{1,8})-([A-Za-z0-9][A-Za-z0-9_.-]{0,31})$")
BRIDGE_RE = re.compile(r"^flb([a-z0-9]{1,8})$")
VETH_RE = re.compile(r"^fl([a-z0-9]{1,8})n(\d{1,3})$")

# 10.200.0.0/24 .. 10.255.255.0/24: far from the 10.0-10.199 ranges that
# VPNs, Docker pools and Kubernetes clusters tend to take.
SUBNET_FIRST_OCTET2 = 200
SUBNET_COUNT = (256 - SUBNET_FIRST_OCTET2) * 256

STATE_FILE = "cluster.json"
REGISTRY_ENV = "FAULTLINE_REGISTRY_DIR"
DEFAULT_REGISTRY = Path("/run/faultline")


# --- names -----------------------------------------------------------------

def tag_for(run_id: str) -> str:
    """The run's tag: the run id itself when it is already a valid tag, else a hash of it."""
    if TAG_RE.match(run_id):
        return run_id
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


def namespace_name(tag: str, node: str) -> str:
    return f"{NAMESPACE_PREFIX}{tag}-{node}"


def bridge_name(tag: str) -> str:
    return f"{BRIDGE_PREFIX}{tag}"


def veth_name(tag: str, index: int) -> str:
    return f"{VETH_PREFIX}{tag}n{index}"


def registry_dir() -> Path:
    """Where each live or crashed run leaves `<tag>.json`; /run is emptied by a reboot, as are namespaces."""
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY)


def registry_path(tag: str) -> Path:
    return registry_dir() / f"{tag}.json"


# --- small wrappers around `ip` and /proc -----------------------------------

def ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run `ip ARGS` in the root namespace; raise `CommandFailed` (node "host") with its stderr."""
    cmd = ["ip", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise RemoteError("`ip` (iproute2) is not installed; the local backend needs it") from None
    if check and proc.returncode != 0:
        raise CommandFailed("host", proc.returncode, cmd, proc.stdout, proc.stderr)
    return proc


def _ip_json(*args: str) -> list[dict]:
    out = ip("-j", *args).stdout.strip()
    # `ip -j netns list` prints nothing at all when there are no namespaces.
    return json.loads(out) if out else []


def list_namespaces() -> list[str]:
    return [entry["name"] for entry in _ip_json("netns", "list")]


def list_links() -> list[dict]:
    """Every link in the root namespace, as `ip -j -d link` describes it (ifname, linkinfo.info_kind, ...)."""
    return _ip_json("-d", "link", "show")


def link_kind(link: dict) -> str | None:
    return (link.get("linkinfo") or {}).get("info_kind")


def link_exists(name: str) -> bool:
    return ip("link", "show", "dev", name, check=False).returncode == 0


def namespace_pids(namespace: str) -> list[int]:
    """Every process whose network namespace is `namespace`, whoever started it ([] if it does not exist)."""
    proc = ip("netns", "pids", namespace, check=False)
    if proc.returncode != 0:
        return []
    return [int(p) for p in proc.stdout.split()]


def process_start_time(pid: int) -> int | None:
    """Clock ticks after boot when `pid` started; with the pid it identifies a process despite pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after the last ")" do not.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` (R, S, D, T, Z, ...) or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _cmdline_raw(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None


def process_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def harness_identity() -> dict:
    return {"pid": os.getpid(), "start_time": process_start_time(os.getpid())}


def harness_alive(entry: dict) -> bool:
    """Whether the process that created a registry entry still runs (same pid and same start time)."""
    harness = entry.get("harness") or {}
    pid, start = harness.get("pid"), harness.get("start_time")
    if not isinstance(pid, int):
        return False
    return start is not None and process_start_time(pid) == start


def kill_namespace_processes(namespace: str, timeout: float = 10) -> list[int]:
    """SIGKILL every process in `namespace` until none is left; return the pids killed.

    Repeats because a process may fork between the listing and the kill.
    SIGKILL needs no SIGCONT first: it ends stopped (paused) processes too.
    """
    killed: list[int] = []

    def none_left() -> bool:
        pids = namespace_pids(namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        return not pids

    wait_until(none_left, timeout,
               f"processes in namespace {namespace} survived SIGKILL (stuck in uninterruptible sleep?)",
               interval=0.02)
    return killed


def delete_namespace(namespace: str) -> bool:
    """`ip netns del`; True if it existed. Kill its processes first, or the namespace outlives its name."""
    if namespace not in list_namespaces():
        return False
    proc = ip("netns", "del", namespace, check=False)
    if proc.returncode != 0 and namespace in list_namespaces():
        raise CommandFailed("host", proc.returncode, ["ip", "netns", "del", namespace], proc.stdout, proc.stderr)
    return True


def delete_link(name: str) -> bool:
    """`ip link del`; True if it existed (a veth vanishes by itself when its peer's namespace goes)."""
    if not link_exists(name):
        return False
    proc = ip("link", "del", "dev", name, check=False)
    if proc.returncode != 0 and link_exists(name):
        raise CommandFailed("host", proc.returncode, ["ip", "link", "del", "dev", name], proc.stdout, proc.stderr)
    return True


def write_json_atomically(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_registry() -> dict[str, dict]:
    """tag -> registry entry, for every readable `<tag>.json` in the registry (unreadable ones map to {})."""
    entries: dict[str, dict] = {}
    directory = registry_dir()
    if not directory.is_dir():
        return entries
    for path in sorted(directory.glob("*.json")):
        if not TAG_RE.match(path.stem):
            continue
        try:
            entries[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            entries[path.stem] = {}
    return entries


@contextlib.contextmanager
def registry_lock():
    """Serialises subnet choice among harnesses on this machine, so two runs never take the same /24."""
    directory = registry_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host routes or has an address in, default routes excepted."""
    networks = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst")
        if not dst or dst == "default":
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dst, strict=False)
            if net.prefixlen > 0:
                networks.append(net)
    for iface in _ip_json("-4", "addr", "show"):
        for addr in iface.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                networks.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return networks


def choose_subnet(tag: str, taken: Sequence[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first free /24 at or after the one the tag hashes to."""
    start = int(hashlib.sha256(tag.encode()).hexdigest(), 16) % SUBNET_COUNT
    for step in range(SUBNET_COUNT):
        index = (start + step) % SUBNET_COUNT
        candidate = ipaddress.ip_network(
            f"10.{SUBNET_FIRST_OCTET2 + index // 256}.{index % 256}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise RemoteError(f"no free /24 left in 10.{SUBNET_FIRST_OCTET2}.0.0-10.255.255.0 for run {tag}")


def _disable_ipv6(ifname: str) -> None:
    # Our links need only IPv4; without this the host would autoconfigure
    # link-local IPv6 on them and send router and neighbour solicitations.
    path = Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6")
    with contextlib.suppress(OSError):
        path.write_text("1")


def _warn_if_bridge_traffic_filtered(bridge: str) -> None:
    # With br_netfilter on, frames between two ports of our bridge traverse the
    # host's iptables FORWARD chain; Docker hosts set its policy to DROP, which
    # would cut node-to-node traffic. We only warn: the host firewall is not ours.
    try:
        if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() != "1":
            return
        policy = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return
    if "-P FORWARD DROP" in policy:
        log.warning("bridge-nf-call-iptables is 1 and the host's FORWARD policy is DROP: traffic between nodes "
                    "on %s may be dropped (allow it, or `sysctl net.bridge.bridge-nf-call-iptables=0`)", bridge)


# --- one node ----------------------------------------------------------------

@dataclass
class _Daemon:
    proc: subprocess.Popen
    cmd: list[str]
    log_path: Path
    started_at: float = field(default_factory=time.time)


class NamespaceRemote(Remote):
    """A node that is a network namespace on this machine; files are shared, so upload/download are copies."""

    def __init__(self, name: str, address: str, namespace: str, home: Path,
                 on_change: Callable[[], None] | None = None):
        self.name = name
        self.address = address
        self.namespace = namespace
        self.home = home
        self._on_change = on_change or (lambda: None)
        self._daemons: dict[str, _Daemon] = {}
        self._lock = threading.RLock()

    # -- commands

    def _wrap(self, cmd: Sequence[str], host_mounts: bool = False) -> list[str]:
        if isinstance(cmd, (str, bytes)):
            raise TypeError(f"cmd must be a list of arguments, not a string: {cmd!r}")
        if not cmd:
            raise ValueError("cmd must not be empty")
        if host_mounts:
            # `ip netns exec` gives each command a mount namespace of its own, so a mount made
            # there would be invisible to the node's other processes: enter the harness's.
            cmd = ["nsenter", f"--mount=/proc/{os.getpid()}/ns/mnt", "--", *cmd]
        return ["ip", "netns", "exec", self.namespace, *map(str, cmd)]

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        merged = dict(os.environ)
        if env:
            merged.update({str(k): str(v) for k, v in env.items()})
        return merged

    def _path(self, path: Path | str) -> Path:
        path = Path(path)
        return path if path.is_absolute() else self.home / path

    def run(self, cmd: Sequence[str], timeout: float = DEFAULT_RUN_TIMEOUT, check: bool = True,
            input: str | None = None, env: dict[str, str] | None = None,
            host_mounts: bool = False) -> subprocess.CompletedProcess:
        wrapped = self._wrap(cmd, host_mounts)
        # Its own session, so a timeout can kill everything the command started.
        proc = subprocess.Popen(wrapped, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                env=self._env(env), cwd=self.home, start_new_session=True)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise CommandTimeout(self.name, list(map(str, cmd)), timeout, out, err) from None
        result = subprocess.CompletedProcess(list(map(str, cmd)), proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise CommandFailed(self.name, proc.returncode, result.args, out, err)
        return result

    # -- daemons

    def spawn(self, name: str, cmd: Sequence[str], log_path: Path | str,
              env: dict[str, str] | None = None, host_mounts: bool = False) -> int:
        wrapped = self._wrap(cmd, host_mounts)
        merged_env = self._env(env)
        program = str(cmd[0])
        # `ip netns exec` would report a missing program only in the log; say so here instead.
        if shutil.which(program, path=merged_env.get("PATH")) is None:
            raise FileNotFoundError(f"on {self.name}: cannot start daemon {name!r}: no program {program!r}")
        log_path = self._path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self.pid(name) is not None:
                raise AlreadyRunning(f"on {self.name}: daemon {name!r} is already running "
                                     f"(pid {self._daemons[name].proc.pid})")
            with open(log_path, "ab") as log_file:
                # `ip netns exec` execs the command itself, so this pid is the
                # daemon's, and start_new_session makes it the leader of its
                # own session and process group (pgid == pid).
                proc = subprocess.Popen(wrapped, stdin=subprocess.DEVNULL, stdout=log_file,
                                        stderr=subprocess.STDOUT, env=merged_env, cwd=self.home,
                                        start_new_session=True)
            self._daemons[name] = _Daemon(proc, list(map(str, cmd)), log_path)
            # Until `ip` has entered the namespace and exec'd the command, a
            # signal (a pause, say) would catch `ip` outside the namespace
            # instead of the daemon. Popen returns while the kernel is still
            # inside execve of `ip` (cmdline empty), then `ip` runs (cmdline
            # is `ip netns exec ...`), then the daemon's own cmdline appears.
            wrapper = "\0".join(wrapped) + "\0"
            wait_until(lambda: proc.poll() is not None or _cmdline_raw(proc.pid) not in ("", wrapper), 10,
                       f"on {self.name}: `ip netns exec {self.namespace}` did not exec daemon {name!r}")
        log.debug("%s: spawned %s (pid %d): %s", self.name, name, proc.pid, cmd)
        self._on_change()
        return proc.pid

    def pid(self, name: str) -> int | None:
        with self._lock:
            daemon = self._daemons.get(name)
        if daemon is None or daemon.proc.poll() is not None:
            return None
        return daemon.proc.pid

    def daemons(self) -> dict[str, dict]:
        """name -> {pid, running, cmd, log} for every daemon this remote remembers."""
        with self._lock:
            items = list(self._daemons.items())
        return {name: {"pid": d.proc.pid, "running": d.proc.poll() is None, "cmd": d.cmd, "log": str(d.log_path)}
                for name, d in items}

    def _signal_group(self, daemon: _Daemon, sig: int) -> bool:
        try:
            os.killpg(daemon.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _reap(self, daemon: _Daemon, what: str, timeout: float = 10) -> None:
        try:
            daemon.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"on {self.name}: {what} (pid {daemon.proc.pid}) did not exit after SIGKILL "
                              f"within {timeout:g}s; it may be stuck in uninterruptible sleep") from None

    def _get(self, name: str) -> _Daemon | None:
        with self._lock:
            return self._daemons.get(name)

    def _drop(self, name: str, daemon: _Daemon) -> None:
        with self._lock:
            # A respawn may already have replaced it.
            if self._daemons.get(name) is daemon:
                del self._daemons[name]
        self._on_change()

    # kill and stop wait without holding the lock, so pid() of other daemons
    # (a readiness probe, say) is never blocked behind a slow shutdown.

    def kill(self, name: str) -> None:
        daemon = self._get(name)
        if daemon is None:
            return
        # Always signal the group: the leader may have exited and left children behind.
        self._signal_group(daemon, signal.SIGKILL)
        self._reap(daemon, f"daemon {name!r}")
        log.debug("%s: killed %s (pid %d)", self.name, name, daemon.proc.pid)
        self._drop(name, daemon)

    def stop(self, name: str, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        daemon = self._get(name)
        if daemon is None:
            return None
        if daemon.proc.poll() is None:
            self._signal_group(daemon, signal.SIGTERM)
            # A paused daemon would hold SIGTERM pending forever.
            self._signal_group(daemon, signal.SIGCONT)
            try:
                daemon.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s: daemon %s (pid %d) ignored SIGTERM for %gs; sending SIGKILL",
                            self.name, name, daemon.proc.pid, timeout)
                self._signal_group(daemon, signal.SIGKILL)
                self._reap(daemon, f"daemon {name!r}")
        # Whatever the leader left running in its group goes too.
        self._signal_group(daemon, signal.SIGKILL)
        self._drop(name, daemon)
        return daemon.proc.returncode

    def pause(self, name: str) -> None:
        daemon = self._get(name)
        if daemon is None or daemon.proc.poll() is not None:
            raise NotRunning(f"on {self.name}: cannot pause daemon {name!r}: it is not running")
        self._signal_group(daemon, signal.SIGSTOP)
        pid = daemon.proc.pid
        # SIGSTOP takes effect asynchronously; once this returns the daemon is known to be stopped.
        wait_until(lambda: process_state(pid) in ("T", "t", "Z", None), 10,
                   f"on {self.name}: daemon {name!r} (pid {pid}) did not stop after SIGSTOP", interval=0.005)

    def resume(self, name: str) -> bool:
        daemon = self._get(name)
        if daemon is None:
            return False
        # Even when the leader has exited, stopped members of its group would otherwise stay stopped.
        delivered = self._signal_group(daemon, signal.SIGCONT)
        if daemon.proc.poll() is not None:
            return False
        pid = daemon.proc.pid
        wait_until(lambda: process_state(pid) not in ("T", "t"), 10,
                   f"on {self.name}: daemon {name!r} (pid {pid}) stayed stopped after SIGCONT", interval=0.005)
        return delivered

    def _forget_all(self, timeout: float = 10) -> None:
        """Reap every daemon after the namespace's processes were killed, so none stays a zombie."""
        with self._lock:
            daemons, self._daemons = list(self._daemons.values()), {}
        for daemon in daemons:
            self._signal_group(daemon, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(timeout)

    # -- files

    def upload(self, local: Path | str, remote_path: Path | str) -> None:
        _copy(Path(local), self._path(remote_path), f"upload to {self.name}")

    def download(self, remote_path: Path | str, local: Path | str) -> None:
        _copy(self._path(remote_path), Path(local), f"download from {self.name}")

    def close(self) -> None:
        pass


def _copy(src: Path, dst: Path, what: str) -> None:
    if not src.exists():
        raise FileNotFoundError(errno.ENOENT, f"{what}: no such file or directory", str(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


# --- the cluster -------------------------------------------------------------

class LocalCluster:
    """Network namespaces on this machine, one per node, on one bridge. Use `create`, then `destroy`."""

    def __init__(self, run_id: str, tag: str, node_names: list[str], workdir: Path,
                 subnet: ipaddress.IPv4Network):
        self.run_id = run_id
        self.tag = tag
        self.workdir = workdir
        self.subnet = subnet
        self.bridge = bridge_name(tag)
        hosts = list(subnet.hosts())
        self.bridge_address = str(hosts[0])
        self.nodes = list(node_names)
        self.namespaces = {node: namespace_name(tag, node) for node in self.nodes}
        self.veths = {node: veth_name(tag, i + 1) for i, node in enumerate(self.nodes)}
        assert all(len(name) <= IFNAMSIZ for name in [self.bridge, *self.veths.values()])
        self.remotes: dict[str, NamespaceRemote] = {
            node: NamespaceRemote(node, str(hosts[i + 1]), self.namespaces[node], workdir / node,
                                  on_change=self.save_state)
            for i, node in enumerate(self.nodes)}
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

    @classmethod
    def create(cls, run_id: str, node_names: list[str], workdir: Path | str) -> "LocalCluster":
        """Build the namespaces, veths and bridge for `node_names`; on any failure, remove what was built."""
        node_names = list(node_names)
        _validate_nodes(node_names)
        if os.geteuid() != 0:
            raise PermissionError("the local backend creates network namespaces and links, which needs root")
        tag = tag_for(run_id)
        workdir = Path(workdir).resolve()
        for node in node_names:
            (workdir / node).mkdir(parents=True, exist_ok=True)

        with registry_lock():
            _refuse_existing(tag, len(node_names))
            registry = read_registry()
            taken = networks_in_use()
            for entry in registry.values():
                with contextlib.suppress(KeyError, ValueError, TypeError):
                    taken.append(ipaddress.ip_network(entry["subnet"]))
            cluster = cls(run_id, tag, node_names, workdir, choose_subnet(tag, taken))
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
        _warn_if_bridge_traffic_filtered(cluster.bridge)
        log.info("cluster %s up: %s on %s (%s)", tag, ", ".join(
            f"{n}={r.address}" for n, r in cluster.remotes.items()), cluster.bridge, cluster.subnet)
        return cluster

    def _create_bridge(self) -> None:
        ip("link", "add", "name", self.bridge, "type", "bridge")
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

    def state(self) -> dict:
        return {
            "version": 1,
            "run_id": self.run_id,
            "tag": self.tag,
            "status": self.status,
            "created_at": self.created_at,
            "harness": self._harness,
            "workdir": str(self.workdir),
            "subnet": str(self.subnet),
            "bridge": {"name": self.bridge, "address": self.bridge_address},
            "nodes": {
                node: {"namespace": self.namespaces[node], "veth": self.veths[node],
                       "address": remote.address, "home": str(remote.home), "daemons": remote.daemons()}
                for node, remote in self.remotes.items()},
        }

    def save_state(self) -> None:
        """Write `workdir/cluster.json` and the registry entry (both atomically)."""
        with self._state_lock:
            state = self.state()
            write_json_atomically(self.state_path, state)
            if self.status != "destroyed":
                write_json_atomically(self.registry_path, state)

    def destroy(self) -> None:
        """Kill every process in every node's namespace, then delete namespaces, veths and the bridge.

        Idempotent. Goes on past a failing step, then raises one `RemoteError`
        listing every failure (the registry entry then stays, for `cleanup`).
        """
        with self._destroy_lock:
            errors: list[str] = []
            if self.status != "destroyed":
                self.status = "destroying"
                with contextlib.suppress(OSError):
                    self.save_state()
            for node, ns in self.namespaces.items():
                try:
                    killed = kill_namespace_processes(ns)
                    if killed:
                        log.debug("%s: killed %s", ns, killed)
                except Exception as exc:  # noqa: BLE001 - collected and raised below
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

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<LocalCluster {self.tag} {self.subnet} {self.status} nodes={self.nodes}>"


def _validate_nodes(node_names: list[str]) -> None:
    if not node_names:
        raise ValueError("a cluster needs at least one node")
    if len(node_names) > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes fit in one /24 with room to spare; got {len(node_names)}")
    if len(set(node_names)) != len(node_names):
        raise ValueError(f"node names must be unique: {node_names}")
    for node in node_names:
        if not NODE_RE.match(node):
            raise ValueError(f"node name {node!r} must be 1-32 of [A-Za-z0-9_.-], starting with a letter or digit")


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
