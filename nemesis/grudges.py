"""Network partitions described as graphs.

In: node names and a seeded `random.Random`. Out: a *grudge*, for each node the
set of nodes it cuts itself off from, derived from a connectivity graph
(networkx): who may still talk to whom. The grudge is the complement of that
graph, so it is symmetric: if a drops b, b drops a.

Shapes, as Jepsen names them:
- `isolate(node)`: one node alone, the rest together;
- `halves`: a random split into two sides (the larger side has the majority);
- `bridge`: two sides that cannot talk, and one node that talks to both;
- `majorities_ring`: nodes on a ring, each sees a majority made of itself and
  its nearest neighbours, and no two nodes see the same majority (5+ nodes).
"""

from __future__ import annotations

import random

import networkx as nx


def grudge_of(connected: nx.Graph) -> dict[str, set[str]]:
    """Each node's grudge: every node it has no edge to in `connected`."""
    cut = nx.complement(connected)
    return {node: set(cut.neighbors(node)) for node in connected.nodes}


def _components(nodes: list[str], *groups: list[str]) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(nodes)
    for group in groups:
        g.add_edges_from((a, b) for i, a in enumerate(group) for b in group[i + 1:])
    return g


def isolate(nodes: list[str], node: str) -> dict[str, set[str]]:
    rest = [n for n in nodes if n != node]
    return grudge_of(_components(nodes, [node], rest))


def halves(nodes: list[str], rng: random.Random) -> dict[str, set[str]]:
    shuffled = rng.sample(nodes, len(nodes))
    cut = len(nodes) // 2
    return grudge_of(_components(nodes, shuffled[:cut], shuffled[cut:]))


def bridge(nodes: list[str], rng: random.Random) -> dict[str, set[str]]:
    if len(nodes) < 3:
        raise ValueError(f"a bridge needs 3 or more nodes, not {len(nodes)}")
    shuffled = rng.sample(nodes, len(nodes))
    middle, rest = shuffled[0], shuffled[1:]
    cut = len(rest) // 2
    return grudge_of(_components(nodes, [middle, *rest[:cut]], [middle, *rest[cut:]]))


def majorities_ring(nodes: list[str], rng: random.Random) -> dict[str, set[str]]:
    n = len(nodes)
    if n < 5:
        raise ValueError(f"a majorities ring needs 5 or more nodes (with {n}, the majorities overlap "
                         f"into a full partition); use halves or bridge")
    ring = rng.sample(nodes, n)
    reach = (n // 2 + 1) // 2  # neighbours each side: itself plus 2*reach nodes is a majority
    g = nx.Graph()
    g.add_nodes_from(nodes)
    for i, node in enumerate(ring):
        for k in range(1, reach + 1):
            g.add_edge(node, ring[(i + k) % n])
    return grudge_of(g)
