"""What the local backend's objects are called, and which /24 a run takes.

In: a run id, node names and indexes, and the networks already taken.
Out: the run's tag, the names of its namespaces, bridge and host-side
veths, the patterns that recognise those names, and the run's subnet.

Everything created carries a fixed prefix and the run's tag (1-8 of
[a-z0-9]), so cleanup finds exactly our objects and nothing else:
namespace `faultline-<tag>-<node>`, bridge `flb<tag>`, host-side veth
`fl<tag>n<index>` (Linux allows interface names of at most 15 characters).
Subnet: a /24 in 10.200.0.0-10.255.255.0 derived from the tag, skipping
any network already routed or addressed on the host or held by another run.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Sequence

from .remote import RemoteError

NAMESPACE_PREFIX = "faultline-"
BRIDGE_PREFIX = "flb"
VETH_PREFIX = "fl"
NODE_IFACE = "eth0"
MAX_NODES = 200
IFNAMSIZ = 15

# The Docker backend: container `faultline-<tag>-<node>` on network `faultline-<tag>`, both
# labelled with the run's tag (the label is what cleanup trusts; the names are for people).
LABEL_RUN = "org.faultline.run"
LABEL_NODE = "org.faultline.node"
#: the daemon the Docker backend and cleanup use when $DOCKER_HOST is not set
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"

TAG_RE = re.compile(r"^[a-z0-9]{1,8}$")
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
NAMESPACE_RE = re.compile(r"^faultline-([a-z0-9]{1,8})-([A-Za-z0-9][A-Za-z0-9_.-]{0,31})$")
BRIDGE_RE = re.compile(r"^flb([a-z0-9]{1,8})$")
VETH_RE = re.compile(r"^fl([a-z0-9]{1,8})n(\d{1,3})$")

# 10.200.0.0/24 .. 10.255.255.0/24: far from the 10.0-10.199 ranges that
# VPNs, Docker pools and Kubernetes clusters tend to take.
SUBNET_FIRST_OCTET2 = 200
SUBNET_COUNT = (256 - SUBNET_FIRST_OCTET2) * 256


def tag_for(run_id: str) -> str:
    """The run's tag: the run id itself when it is already a valid tag, else a hash of it."""
    if TAG_RE.match(run_id):
        return run_id
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


def namespace_name(tag: str, node: str) -> str:
    return f"{NAMESPACE_PREFIX}{tag}-{node}"


def container_name(tag: str, node: str) -> str:
    return f"{NAMESPACE_PREFIX}{tag}-{node}"


def network_name(tag: str) -> str:
    return f"{NAMESPACE_PREFIX}{tag}"


def bridge_name(tag: str) -> str:
    return f"{BRIDGE_PREFIX}{tag}"


def veth_name(tag: str, index: int) -> str:
    return f"{VETH_PREFIX}{tag}n{index}"


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
