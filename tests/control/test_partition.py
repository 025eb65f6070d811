"""Partitions: grudges as graphs, and iptables really cutting traffic between namespaces."""

from __future__ import annotations

import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.control.net import Net
from faultline.control.wait import wait_until
from faultline.nemesis import grudges
from faultline.nemesis.core import RepairFailed
from faultline.nemesis.partition import PartitionNemesis
from .helpers import PY, SERVER

PORT = 7411

# Connects with a short timeout and says what happened, so a dropped SYN shows as "timeout".
PROBE = r"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print("ok", s.makefile().readline().strip())
except socket.timeout:
    print("timeout")
except OSError as e:
    print("error", e)
"""


def connectivity(grudge: dict[str, set[str]]) -> nx.Graph:
    g = nx.complete_graph(list(grudge))
    g.remove_edges_from((a, b) for a, peers in grudge.items() for b in peers)
    return g


@settings(max_examples=200, deadline=None)
@given(n=st.integers(3, 9), seed=st.integers(0, 2**31))
def test_grudge_shapes_are_symmetric_and_have_their_shape(n, seed):
    nodes = [f"n{i}" for i in range(n)]
    rng = random.Random(seed)
    shapes = {"halves": grudges.halves(nodes, rng), "bridge": grudges.bridge(nodes, rng),
              "isolate": grudges.isolate(nodes, nodes[seed % n])}
    if n >= 5:
        shapes["ring"] = grudges.majorities_ring(nodes, rng)
    for name, grudge in shapes.items():
        assert set(grudge) == set(nodes)
        assert all(node not in peers for node, peers in grudge.items()), name
        assert all(node in grudge[peer] for node, peers in grudge.items() for peer in peers), f"{name} is symmetric"
    parts = list(nx.connected_components(connectivity(shapes["halves"])))
    assert sorted(map(len, parts)) == sorted([n // 2, n - n // 2])
    assert [len(c) for c in nx.connected_components(connectivity(shapes["isolate"]))].count(1) >= 1
    bridge = connectivity(shapes["bridge"])
    middle = [v for v in bridge if bridge.degree(v) == n - 1]
    assert len(middle) == 1 and not nx.is_connected(bridge.subgraph(set(nodes) - set(middle)))
    if n >= 5:
        ring = connectivity(shapes["ring"])
        views = [frozenset(ring.neighbors(v)) | {v} for v in ring]
        assert all(len(v) > n // 2 for v in views), "every node sees a majority"
        assert len(set(views)) == n, "no two nodes see the same majority"


def probe(cluster, src: str, dst: str, timeout: float = 2.0) -> str:
    target = cluster.remotes[dst].address
    return cluster.remotes[src].run([PY, "-c", PROBE, target, str(PORT), str(timeout)], timeout=30).stdout.strip()


def test_a_partition_stops_traffic_both_ways_and_heal_restores_exactly_it(cluster):
    for node, remote in cluster.remotes.items():
        remote.spawn("server", [PY, "-c", SERVER, remote.address, str(PORT), node], "server.log")
    wait_until(lambda: all(probe(cluster, "n1", n).startswith("ok") for n in ("n2", "n3")), 20,
               "the test servers did not start")
    # A rule of someone else's in n1 must survive the heal.
    cluster.remotes["n1"].run(["iptables", "-w", "5", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "DROP"])
    net = Net(cluster.remotes)
    applied = net.drop(grudges.isolate(["n1", "n2", "n3"], "n1"))
    assert applied == {"n1": ["n2", "n3"], "n2": ["n1"], "n3": ["n1"]}
    assert probe(cluster, "n1", "n2") == "timeout"
    assert probe(cluster, "n2", "n1") == "timeout"
    assert probe(cluster, "n2", "n3").startswith("ok"), "the majority side still talks"
    assert len(net.rules("n1")) == 4 and len(net.rules("n2")) == 2
    assert net.heal() == {"n1": "healed", "n2": "healed", "n3": "healed"}
    assert all(net.rules(n) == [] for n in ("n1", "n2", "n3"))
    assert probe(cluster, "n1", "n2").startswith("ok") and probe(cluster, "n2", "n1").startswith("ok")
    rules = cluster.remotes["n1"].run(["iptables", "-S", "INPUT"]).stdout
    assert "--dport 9 -j DROP" in rules


class FakeDB:
    """Stands in for the broker db: only who leads and who controls, which the test fixes."""

    def leader(self, topic, partition):
        return "n2"

    def controller(self):
        return "n3"


def test_partition_nemesis_records_the_shape_and_grudge_it_applied(cluster):
    net = Net(cluster.remotes)
    nemesis = PartitionNemesis(net, FakeDB(), ["n1", "n2", "n3"], [], ["t/0"])
    seen = set()
    for seed in range(40):
        value = nemesis.invoke({"f": "start-partition", "seed": seed})
        seen.add(value["shape"])
        for node, peers in value["grudge"].items():
            assert len(net.rules(node)) == 2 * len(peers)
        if value["shape"] == "isolate-leader":
            assert value["node"] == "n2" and value["leader_of"] == "t/0"
        if value["shape"] == "isolate-controller":
            assert value["node"] == "n3"
        nemesis.invoke({"f": "stop-partition"})
        assert all(net.rules(n) == [] for n in ("n1", "n2", "n3"))
    assert seen == {"isolate-random", "isolate-leader", "isolate-controller", "halves", "bridge"}
    # The same seed gives the same fault.
    assert nemesis.invoke({"f": "start-partition", "seed": 7}) == nemesis.invoke({"f": "start-partition", "seed": 7})
    nemesis.heal()


class Unreachable:
    """The `Remote` of a node whose commands fail (its namespace is gone, say)."""

    address = "10.255.255.1"

    def run(self, cmd, check=True, timeout=None):
        raise RuntimeError(f"cannot run {cmd[0]} on n4: its namespace is gone")


def test_a_heal_that_fails_on_one_node_says_which_and_heals_the_others(cluster):
    remotes = {**cluster.remotes, "n4": Unreachable()}
    net = Net(remotes)
    net.drop(grudges.isolate(["n1", "n2", "n3"], "n1"))
    net._prepared.add("n4")  # it took part in an earlier grudge
    assert net.heal() == {"n1": "healed", "n2": "healed", "n3": "healed",
                          "n4": "n4: RuntimeError: cannot run iptables on n4: its namespace is gone"}
    assert all(net.rules(n) == [] for n in ("n1", "n2", "n3"))
    nemesis = PartitionNemesis(net, FakeDB(), ["n1", "n2", "n3", "n4"], [], ["t/0"])
    with pytest.raises(RepairFailed, match="n4: RuntimeError") as failed:
        nemesis.invoke({"f": "stop-partition"})
    assert failed.value.value["healed"] == ["n1", "n2", "n3"] and nemesis.active
