"""G0 and G1c, and their -process and -realtime variants: cycles in the dependency graph
between operations, found with networkx.

In: an engine's `Analysis`, whose `dependencies` are (src op, dst op, 'ww' |
'wr', key) edges and whose `hubs` are (op, invoke index, process, type)
(history_analysis/result.py, DEPENDENCIES, says how both engines derive
them).
Out: the same Analysis with counts and examples for
- G0: a strongly connected component of the write-write graph (writes of
  two operations ordered one way in one key's log and the other way in
  another's);
- G1c: a strongly connected component of the write-write + write-read graph
  that holds a write-read edge (circular information flow);
- G0-process, G1c-process: the same with each process's order added (an ok
  operation precedes the process's later ones), for components that exist
  only through that order;
- G0-realtime, G1c-realtime: the same with real-time order added (an ok
  operation whose completion comes before another's invocation precedes it).
As in Jepsen, an operation that did not complete ok orders nothing after it:
its effects may land at any later time. Real-time order between n operations
has up to n² pairs; it enters the graph as a chain of time points instead
(each ok operation's completion, in history order), so a path through the
chain stands for one real-time step.
One witness per component: its size (operations), and one cycle through it
as `ops` and `steps` (from, to, ww/wr/process/realtime, key); a variant's
cycle goes through an order step (and, for G1c, a write-read one), so it
may pass an operation twice. With `full_dir`, every witness goes to
`full_dir/<type>.jsonl`, as the engines write the other types.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

import networkx as nx

from ..history_analysis.result import Analysis, witness_json

ORDER_TYPES = ("G0-process", "G1c-process", "G0-realtime", "G1c-realtime")
CYCLE_TYPES = ("G0", "G1c", *ORDER_TYPES)
BASE_KINDS = ("ww", "wr")


def _graph(edges, kinds: set[str]) -> nx.DiGraph:
    g = nx.DiGraph()
    for src, dst, kind, key in edges:
        if kind not in kinds:
            continue
        if g.has_edge(src, dst):
            g[src][dst]["why"].append((kind, key))
        else:
            g.add_edge(src, dst, why=[(kind, key)])
    return g


def _step(g: nx.DiGraph, a: int, b: int, prefer: str | None = None) -> dict[str, Any]:
    # A dependency explains more than an order, so it is named unless the cycle needs the order.
    why = sorted(g[a][b]["why"], key=lambda w: (w[0] not in BASE_KINDS, w[0], w[1] or ""))
    kind, key = next(((k, key) for k, key in why if k == prefer), why[0])
    return {"from": a, "to": b, "type": kind, "key": key}


def _witness(g: nx.DiGraph, cycle: list[int], size: int, first_kind: str | None = None) -> dict[str, Any]:
    steps = [_step(g, a, b, first_kind if i == 0 else None)
             for i, (a, b) in enumerate(zip(cycle, cycle[1:] + cycle[:1]))]
    return {"size": size, "ops": list(cycle), "steps": steps}


def _components(g: nx.DiGraph) -> list[list[int]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) >= 2)


def g0(edges) -> list[dict[str, Any]]:
    g = _graph(edges, {"ww"})
    out = []
    for comp in _components(g):
        sub = g.subgraph(comp)
        start = comp[0]
        # The shortest way back to the component's first operation is a cycle through it.
        back = min((nx.shortest_path(sub, nxt, start) for nxt in sorted(sub.successors(start))), key=len)
        out.append(_witness(g, [start] + back[:-1], len(comp)))
    return out


def g1c(edges) -> list[dict[str, Any]]:
    g = _graph(edges, {"ww", "wr"})
    out = []
    for comp in _components(g):
        sub = g.subgraph(comp)
        reads = sorted((a, b) for a, b, why in sub.edges(data="why") if any(k == "wr" for k, _ in why))
        if not reads:
            continue
        a, b = reads[0]
        back = nx.shortest_path(sub, b, a)
        out.append(_witness(g, [a] + back[:-1], len(comp), first_kind="wr"))
    return out


def order_edges(hubs, order: str) -> list[tuple[int, int, str, None]]:
    """Process or real-time order between hubs, as edges; real-time ones pass through time points,
    which are negative numbers (-1, -2, ... in completion order)."""
    edges: list[tuple[int, int, str, None]] = []
    if order == "process":
        by_process: dict[str, list] = {}
        for op, invoke, process, type_ in sorted(hubs, key=lambda h: h[1]):
            by_process.setdefault(process, []).append((op, type_))
        for ops in by_process.values():
            last_ok = None
            for op, type_ in ops:
                if last_ok is not None:
                    edges.append((last_ok, op, "process", None))
                if type_ == "ok":
                    last_ok = op
        return edges
    completions = sorted(op for op, _, _, type_ in hubs if type_ == "ok")
    for i, op in enumerate(completions):
        edges.append((op, -(i + 1), "realtime", None))
        if i + 1 < len(completions):
            edges.append((-(i + 1), -(i + 2), "realtime", None))
    for op, invoke, _, _ in hubs:
        before = bisect.bisect_left(completions, invoke)  # completions earlier than the invocation
        if before:
            edges.append((-before, op, "realtime", None))
    return edges


def _walk(sub: nx.DiGraph, start: int, *through: tuple[int, int]) -> list[int]:
    """A closed walk from `start` that takes each edge of `through` in turn (the first leaves start)."""
    walk = [start]
    for i, (a, b) in enumerate(through):
        if i:
            walk += nx.shortest_path(sub, walk[-1], a)[1:]
        walk.append(b)
    if walk[-1] == start:
        return walk[:-1]
    back = nx.shortest_path(sub, walk[-1], start)
    return walk + back[1:-1]


def _order_witness(g: nx.DiGraph, walk: list[int], order: str, size: int) -> dict[str, Any]:
    """A walk through time points, told as steps between operations only."""
    real = [i for i, node in enumerate(walk) if node >= 0]
    steps = []
    for n, i in enumerate(real):
        j = real[(n + 1) % len(real)]
        a, b = walk[i], walk[j]
        if (j - i) % len(walk) == 1:  # a direct edge
            steps.append(_step(g, a, b, order if n == 0 else None))
        else:
            steps.append({"from": a, "to": b, "type": "realtime", "key": None})
    ops = list(dict.fromkeys(walk[i] for i in real))
    return {"size": size, "ops": ops, "steps": steps}


def on_cycles(edge_lists) -> set[int]:
    """The nodes of every strongly connected component of two or more nodes, over all the edges
    given: every cycle of any subset of them lies inside. In compiled code (scipy), since a
    history of millions of operations has millions of edges and, when it is valid, no cycle."""
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    count = sum(len(edges) for edges in edge_lists)
    if count == 0:
        return set()
    ends = np.fromiter((end for edges in edge_lists for edge in edges for end in edge[:2]), dtype=np.int64,
                       count=2 * count)
    nodes, index = np.unique(ends, return_inverse=True)
    graph = coo_matrix((np.ones(count, dtype=np.int8), (index[0::2], index[1::2])),
                       shape=(len(nodes), len(nodes))).tocsr()
    _, labels = connected_components(graph, directed=True, connection="strong")
    sizes = np.bincount(labels)
    return set(nodes[sizes[labels] > 1].tolist())


def ordered_cycles(edges, hubs, kind: str, order_edge_list=None) -> list[dict[str, Any]]:
    """G0-process, G1c-process, G0-realtime or G1c-realtime (`kind`); `order_edge_list` saves
    computing `order_edges(hubs, order)` again."""
    base_type, order = kind.split("-")
    kinds = {"ww"} if base_type == "G0" else {"ww", "wr"}
    base = _graph(edges, kinds)
    covered = {frozenset(c) for c in _components(base)
               if base_type == "G0" or any(k == "wr" for _, _, why in base.subgraph(c).edges(data="why")
                                           for k, _ in why)}
    if order_edge_list is None:
        order_edge_list = order_edges(hubs, order)
    g = _graph([*edges, *order_edge_list], kinds | {order})
    out = []
    for comp in _components(g):
        real = sorted(n for n in comp if n >= 0)
        if len(real) < 2 or frozenset(real) in covered:
            continue
        sub = g.subgraph(comp)
        inner = sorted(sub.edges(data="why"), key=lambda e: (e[0] < 0, e[0], e[1]))
        entry = next(((a, b) for a, b, why in inner if a >= 0 and any(k == order for k, _ in why)), None)
        reads = [(a, b) for a, b, why in inner if any(k == "wr" for k, _ in why)]
        if entry is None or (base_type == "G1c" and not reads):
            continue
        walk = _walk(sub, entry[0], entry, *reads[:1])
        out.append(_order_witness(g, walk, order, len(real)))
    return out


def add_cycles(analysis: Analysis, limit: int = 32, full_dir: str | Path | None = None) -> Analysis:
    """Count every cycle type, keep `limit` examples of each, and write their full lists."""
    orders = {order: order_edges(analysis.hubs, order) for order in ("process", "realtime")}
    # Only operations on some cycle of the union of all edges can be on a cycle of any type;
    # networkx, which keeps Python objects per edge, sees just those.
    keep = on_cycles([analysis.dependencies, *orders.values()])
    deps = [e for e in analysis.dependencies if e[0] in keep and e[1] in keep]
    orders = {o: [e for e in es if e[0] in keep and e[1] in keep] for o, es in orders.items()}
    found = {"G0": g0(deps), "G1c": g1c(deps)}
    for kind in ORDER_TYPES:
        found[kind] = ordered_cycles(deps, None, kind, orders[kind.split("-")[1]])
    for kind, witnesses in found.items():
        witnesses.sort(key=lambda w: (min(w["ops"]), witness_json(w)))
        if witnesses:
            analysis.counts[kind] = len(witnesses)
            if limit > 0:
                analysis.examples[kind] = json.loads(json.dumps(witnesses[:limit]))
        if full_dir is not None:
            directory = Path(full_dir)
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f".{kind}.jsonl.tmp"
            tmp.write_text("".join(witness_json(w) + "\n" for w in witnesses))
            tmp.replace(directory / f"{kind}.jsonl")
    return analysis
