"""The `ip` (iproute2) commands the local backend runs in the root namespace.

In: namespace and link names. Out: what `ip` lists (namespaces, links and
their kinds, the networks the host routes or has addresses in), and
deletions that say whether the object existed. A failing command raises
`CommandFailed` for node "host"; a missing `ip` raises `RemoteError`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess

from .remote import CommandFailed, RemoteError


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
