"""A Docker daemon of the tests' own, and the host firewall state a Docker host has.

In: nothing (root, and Debian's docker.io). Out: `PrivateDockerd`: dockerd on a private socket,
data root and exec root (`start`, `stop` by its pid), and `HostState`, a snapshot of what a
dockerd changes on the host (the FORWARD policy, its DOCKER* chains in the filter and nat
tables, the docker0 bridge, the ip_forward and bridge-netfilter sysctls) that `restore` puts
back: the tests leave the host as they found it.

The data root persists in ~/.cache/faultline/dockerd, or $FAULTLINE_TEST_DOCKERD_ROOT (images
are a cache, as Kafka's jars are),
so the node image is built once per source change, not once per session. overlay2 is used
where the file system allows it (a container starts in a third of a second; on vfs, each is a
full copy of the image, several seconds), else vfs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from faultline.control.wait import wait_until

# Two test sessions at once (two checkouts, say) need a data root each: a dockerd locks its own.
CACHE = Path(os.environ.get("FAULTLINE_TEST_DOCKERD_ROOT") or Path.home() / ".cache" / "faultline" / "dockerd")
SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables")


def iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "10", *args], capture_output=True, text=True, check=check)


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _docker_chains(table: str) -> list[str]:
    lines = iptables("-t", table, "-S").stdout.splitlines()
    return [line.split()[1] for line in lines if line.startswith("-N DOCKER")]


def _dockers_rules(table: str) -> list[str]:
    """The rules of `table` that are dockerd's: in or jumping to its chains, or about its bridges."""
    return [line for line in iptables("-t", table, "-S").stdout.splitlines()
            if line.startswith("-A ") and re.search(r"DOCKER|docker0|\bbr-[0-9a-f]{12}\b", line)]


@dataclass
class HostState:
    """What a dockerd changes on the host, as it was before."""

    forward_policy: str
    chains: dict[str, list[str]] = field(default_factory=dict)
    rules: dict[str, list[str]] = field(default_factory=dict)
    sysctls: dict[str, str | None] = field(default_factory=dict)
    docker0: bool = False

    @classmethod
    def capture(cls) -> "HostState":
        policy = re.search(r"^-P FORWARD (\w+)", iptables("-S", "FORWARD").stdout, re.M)
        return cls(policy[1] if policy else "ACCEPT", {t: _docker_chains(t) for t in ("filter", "nat")},
                   {t: _dockers_rules(t) for t in ("filter", "nat")},
                   {name: _sysctl(name) for name in SYSCTLS},
                   subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0)

    def restore(self) -> None:
        iptables("-P", "FORWARD", self.forward_policy)
        for table, before in self.chains.items():
            added = [c for c in _docker_chains(table) if c not in before]
            # dockerd's rules that were not there before go first, then the chains it added.
            for line in _dockers_rules(table):
                if line not in self.rules.get(table, []):
                    iptables("-t", table, "-D", *shlex.split(line)[1:], check=False)
            for chain in added:
                iptables("-t", table, "-F", chain, check=False)
            for chain in added:
                iptables("-t", table, "-X", chain, check=False)
        for name, value in self.sysctls.items():
            if value is not None and _sysctl(name) not in (None, value):
                Path("/proc/sys", name).write_text(value)
        if not self.docker0:
            subprocess.run(["ip", "link", "del", "docker0"], capture_output=True)


class PrivateDockerd:
    """dockerd on a socket and roots of its own; `host` is the DOCKER_HOST that reaches it."""

    def __init__(self):
        self.run_dir = Path(tempfile.mkdtemp(prefix="fl-dockerd-", dir="/run"))
        self.socket = self.run_dir / "docker.sock"
        self.pidfile = self.run_dir / "dockerd.pid"
        self.log = self.run_dir / "dockerd.log"
        self.host = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None
        self.driver = ""

    def _start(self, driver: str) -> bool:
        data = CACHE / driver
        data.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "--storage-driver", driver, "--data-root", str(data),
                 "--exec-root", str(self.run_dir / "exec"), "-H", self.host, "--pidfile", str(self.pidfile),
                 # No default bridge: the backend makes networks of its own.
                 "--bridge", "none"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: self.proc.poll() is not None or self._answers(), 60,
                       f"dockerd did not answer on {self.socket}; see {self.log}")
        except TimeoutError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            return False
        self.driver = driver
        return True

    def _answers(self) -> bool:
        return subprocess.run(["docker", "-H", self.host, "version", "--format", "{{.Server.Version}}"],
                              capture_output=True, timeout=10).returncode == 0

    def start(self) -> "PrivateDockerd":
        if shutil.which("dockerd") is None:
            raise RuntimeError("dockerd is not installed: run scripts/setup --docker")
        for driver in ("overlay2", "vfs"):
            if self._start(driver):
                return self
        raise RuntimeError(f"dockerd would not start with overlay2 or vfs; its log ends:\n"
                           f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """SIGTERM dockerd by its pid (it stops its containerd), SIGKILL after 30 s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # Its containerd, should it have outlived dockerd.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and subprocess.run(
                ["pgrep", "-f", f"containerd.*{self.run_dir}"], capture_output=True).returncode == 0:
            time.sleep(0.2)
        subprocess.run(["pkill", "-KILL", "-f", f"containerd.*{self.run_dir}"], capture_output=True)
        subprocess.run(["umount", "-R", str(self.run_dir / "exec")], capture_output=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
