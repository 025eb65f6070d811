"""Namespaces, links and addresses of a LocalCluster, and that every node
reaches every other node and is reached from the harness."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess

from faultline.control import wait_until
from faultline.control.iproute import list_namespaces, networks_in_use
from faultline.control.names import BRIDGE_RE, NAMESPACE_RE, VETH_RE
from faultline.control.registry import registry_path

from .helpers import CLIENT, PY, SERVER

PORT = 7000


def test_layout_names_and_state(cluster):
    assert cluster.subnet.prefixlen == 24 and cluster.subnet.subnet_of(ipaddress.ip_network("10.0.0.0/8"))
    assert int(str(cluster.subnet).split(".")[1]) >= 200
    others = [n for n in networks_in_use() if not n.subnet_of(cluster.subnet)]
    assert not any(cluster.subnet.overlaps(n) for n in others), (cluster.subnet, others)

    addresses = [r.address for r in cluster.remotes.values()]
    assert len(set(addresses)) == len(addresses) == 3
    assert all(ipaddress.ip_address(a) in cluster.subnet for a in addresses)
    assert cluster.bridge_address == str(cluster.subnet.network_address + 1)

    namespaces = set(list_namespaces())
    for node, ns in cluster.namespaces.items():
        assert ns in namespaces and NAMESPACE_RE.match(ns).groups() == (cluster.tag, node)
    assert BRIDGE_RE.match(cluster.bridge)[1] == cluster.tag
    for veth in cluster.veths.values():
        assert VETH_RE.match(veth)[1] == cluster.tag and len(veth) <= 15
        detail = json.loads(subprocess.run(["ip", "-j", "-d", "link", "show", "dev", veth],
                                           capture_output=True, text=True, check=True).stdout)[0]
        assert detail["master"] == cluster.bridge and detail["linkinfo"]["info_kind"] == "veth"

    for node, remote in cluster.remotes.items():
        assert remote.home == cluster.workdir / node and remote.home.is_dir()

    for path in (cluster.state_path, registry_path(cluster.tag)):
        state = json.loads(path.read_text())
        assert state["tag"] == cluster.tag and state["subnet"] == str(cluster.subnet)
        assert state["status"] == "up" and state["bridge"]["name"] == cluster.bridge
        assert {n: v["address"] for n, v in state["nodes"].items()} == \
            {n: r.address for n, r in cluster.remotes.items()}


def test_node_sees_only_its_own_address_and_no_route_out(cluster):
    remote = cluster.remotes["n2"]
    addrs = remote.run(["ip", "-4", "-o", "addr", "show"]).stdout
    assert f"{remote.address}/24" in addrs and "127.0.0.1/8" in addrs
    assert cluster.bridge_address not in addrs and "192.0.2." not in addrs
    assert "default" not in remote.run(["ip", "route"]).stdout
    # No route means not a single packet to anything outside the subnet.
    outside = remote.run(["ip", "route", "get", "1.1.1.1"], check=False)
    assert outside.returncode != 0 and "unreachable" in outside.stderr.lower()


def test_every_node_reaches_every_node_and_the_harness_reaches_all(cluster):
    remotes = cluster.remotes
    for node, remote in remotes.items():
        remote.spawn("server", [PY, "-c", SERVER, remote.address, str(PORT), node], "server.log")

    def greeting(address: str) -> str:
        with socket.create_connection((address, PORT), timeout=2) as s:
            return s.makefile().readline().strip()

    for node, remote in remotes.items():
        reply = wait_until(lambda: greeting(remote.address), 20,
                           f"the harness could not reach {node} at {remote.address}:{PORT}")
        # The harness's traffic comes from the bridge's address in the root namespace.
        assert reply == f"{node} {cluster.bridge_address}"

    for client_node, client in remotes.items():
        for server_node, server in remotes.items():
            if client_node == server_node:
                continue
            out = client.run([PY, "-c", CLIENT, server.address, str(PORT)], timeout=30).stdout.strip()
            assert out == f"{server_node} {client.address}", (client_node, server_node, out)


def test_loopback_is_up_inside_a_node(cluster):
    remote = cluster.remotes["n1"]
    remote.spawn("server", [PY, "-c", SERVER, "127.0.0.1", str(PORT), "n1"], "lo.log")
    out = wait_until(lambda: remote.run([PY, "-c", CLIENT, "127.0.0.1", str(PORT)], timeout=10).stdout, 20,
                     "n1 could not reach its own loopback")
    assert out.strip() == "n1 127.0.0.1"
    # The same port on another node's loopback is a different loopback.
    other = cluster.remotes["n2"].run([PY, "-c", CLIENT, "127.0.0.1", str(PORT)], check=False, timeout=10)
    assert other.returncode != 0 and "ConnectionRefusedError" in other.stderr


def test_two_clusters_get_separate_subnets(make_cluster):
    a, b = make_cluster(["n1"]), make_cluster(["n1"])
    assert not a.subnet.overlaps(b.subnet)
    assert a.remotes["n1"].run(["ip", "-4", "-o", "addr"]).stdout != b.remotes["n1"].run(
        ["ip", "-4", "-o", "addr"]).stdout
