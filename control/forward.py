"""The namespace backend's one rule in the host's firewall, so its nodes reach each other where Docker runs.

With bridge netfilter on (`net.bridge.bridge-nf-call-iptables=1`, which dockerd turns on), the
frames a bridge passes between two of its ports traverse the host's iptables FORWARD chain, and
dockerd sets that chain's policy to DROP: the nodes of a run, ports of its bridge, could then
not reach each other (nor ZooKeeper). So each run inserts one rule of its own at the top of
FORWARD that accepts what its bridge forwards between its own ports (`-i flb<tag> -o flb<tag>`),
marked with the comment `faultline-<tag>`. Teardown removes it; `faultline cleanup` removes
any whose run is gone. Nothing else in the host's firewall is read or changed.

In: a run's tag and its bridge. Out: the rule added (`allow_bridge`), removed (`remove`), and
every such rule on the host by tag (`rules`).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

from .remote import CommandFailed

CHAIN = "FORWARD"
COMMENT_RE = re.compile(r"--comment \"?faultline-([a-z0-9]{1,8})\"?(\s|$)")


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["iptables", "-w", "10", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise CommandFailed("host", proc.returncode, cmd, proc.stdout, proc.stderr)
    return proc


def available() -> bool:
    return shutil.which("iptables") is not None


def allow_bridge(tag: str, bridge: str) -> bool:
    """Accept what `bridge` forwards between its own ports; False when the host has no iptables
    (then nothing filters bridged frames either)."""
    if not available():
        return False
    _iptables("-I", CHAIN, "1", "-i", bridge, "-o", bridge, "-m", "comment", "--comment", f"faultline-{tag}",
              "-j", "ACCEPT")
    return True


def rules() -> dict[str, list[str]]:
    """tag -> our rules in FORWARD, as `iptables -S` prints them."""
    if not available():
        return {}
    proc = _iptables("-S", CHAIN, check=False)
    found: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        match = COMMENT_RE.search(line)
        if line.startswith(f"-A {CHAIN} ") and match:
            found.setdefault(match[1], []).append(line)
    return found


def remove(tag: str) -> int:
    """Delete every rule of run `tag` from FORWARD; how many there were."""
    lines = rules().get(tag, [])
    for line in lines:
        spec = shlex.split(line)[2:]  # without "-A FORWARD"
        _iptables("-D", CHAIN, *spec)
    return len(lines)
