"""G0, G1c and G1c-ww, and their -process and -realtime variants: cycles in the dependency
graph between operations, found with networkx.

In: an engine's `Analysis`, whose `dependencies` are (src op, dst op, 'ww' |
'wr', key) edges and whose `hubs` are (op, invoke index, process, type)
(history_analysis/result.py, DEPENDENCIES, says how both engines derive
them).
Out: the same Analysis with counts and examples for each type of
models/anomaly_types.py that the cycle search finds (SEARCH says how):
- G0: a strongly connected component of the write-write graph (writes of
  two operations ordered one way in one key's log and the other way in
  another's);
- G1c: a strongly connected component of the write-read graph alone
  (circular information flow with no inferred write order in it);
- G1c-ww: a strongly connected component of the write-write + write-read
  graph that holds a write-read edge and is not a G1c component: a cycle of
  information flow that needs a write-write edge. As in Jepsen's Kafka
  checker, which draws no write-write edges unless asked, this is kept apart
  from G1c: Kafka has no write isolation, so a poll of one operation may
  legally see a write that landed after that operation's own send;
- each -process variant: the same with each process's order added (an ok
  operation precedes the process's later ones), for components that exist
  only through that order (and, for G1c-ww-process, that need a write-write
  edge: not a component of G1c, G1c-ww or G1c-process);
- each -realtime variant: the same with real-time order added (an ok
  operation whose completion comes before another's invocation precedes it).
As in Jepsen, an operation that did not complete ok orders nothing after it:
its effects may land at any later time. Real-time order between n operations
has up to n² pairs; it enters the graph as a chain of time points instead
(each ok operation's completion, in history order), so a path through the
chain stands for one real-time step.
One witness per component: its size (operations), and one cycle through it
as `ops` and `steps` (from, to, ww/wr/process/realtime, key); the cycle goes
through every kind of step its type needs (a write-read step for the G1c
types, a write-write step that no other edge doubles for the G1c-ww types,
an order step for the variants), so it may pass an operation twice (`ops`
lists each once). With `full_dir`, every witness goes to
`full_dir/<type>.jsonl`, as the engines write the other types.
"""

from __future__ import annotations

import json
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from ..history_analysis.result import DEPENDENCY_COLUMNS, HUB_COLUMNS, Analysis, Columns, witness_json
from ..models.anomaly_types import CYCLES, names

BASE_KINDS = ("ww", "wr")
# How each cycle type is searched: its dependency kinds, the order added (None: none), and the types
# whose components it leaves out (it reports only components that need what those lack). Listed so
# that every type comes after those it leaves out.
SEARCH: dict[str, tuple[frozenset[str], str | None, tuple[str, ...]]] = {
    "G0": (frozenset({"ww"}), None, ()),
    "G1c": (frozenset({"wr"}), None, ()),
    "G1c-ww": (frozenset({"ww", "wr"}), None, ("G1c",)),
    **{kind: spec for order in ("process", "realtime") for kind, spec in (
        (f"G0-{order}", (frozenset({"ww"}), order, ("G0",))),
        (f"G1c-{order}", (frozenset({"wr"}), order, ("G1c",))),
        (f"G1c-ww-{order}", (frozenset({"ww", "wr"}), order, ("G1c", "G1c-ww", f"G1c-{order}"))),
    )},
}
CYCLE_TYPES = names(CYCLES)
ORDER_TYPES = tuple(kind for kind in CYCLE_TYPES if SEARCH[kind][1] is not None)
if set(SEARCH) != set(CYCLE_TYPES):
    raise ValueError(f"the cycle search and the anomaly registry disagree: {sorted(set(SEARCH) ^ set(CYCLE_TYPES))}")


def _graph(edges, kinds: set[str] | frozenset[str]) -> nx.DiGraph:
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


def _order_ends(hubs: Columns, order: str) -> tuple[np.ndarray, np.ndarray]:
    """Process or real-time order between hubs, as the (src, dst) arrays of its edges; real-time
    ones pass through time points, which are negative numbers (-1, -2, ... in completion order).
    Edges come in the order a walk over the hubs would give them (by process, each by invocation;
    then the chain of time points, then into each hub), since networkx's answers follow the order
    edges were added in."""
    op, invoke = hubs.ints("op"), hubs.ints("invoke")
    types, labels = hubs.codes("type")
    ok = types == labels.index("ok") if "ok" in labels else np.zeros(len(op), dtype=bool)
    n = len(op)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if order == "process":
        process, names = hubs.codes("process")
        by_invoke = np.argsort(invoke, kind="stable")
        place = np.empty(n, dtype=np.int64)
        place[by_invoke] = np.arange(n)
        # Processes in the order they first appear by invocation, each process's hubs by invocation.
        first = np.full(len(names), n, dtype=np.int64)
        np.minimum.at(first, process, place)
        index = np.lexsort((place, first[process]))
        ops, oks, group = op[index], ok[index], process[index]
        position = np.arange(n)
        last_ok = np.maximum.accumulate(np.where(oks, position, -1))
        before = np.concatenate(([-1], last_ok[:-1]))
        group_start = np.maximum.accumulate(np.where(np.r_[True, group[1:] != group[:-1]], position, 0))
        follows = before >= group_start
        return ops[before[follows]], ops[follows]
    completions = np.sort(op[ok])
    count = len(completions)
    points = -np.arange(1, count + 1, dtype=np.int64)
    chain_src = np.empty(max(2 * count - 1, 0), dtype=np.int64)
    chain_dst = np.empty_like(chain_src)
    chain_src[0::2], chain_dst[0::2] = completions, points  # each completion to its time point
    chain_src[1::2], chain_dst[1::2] = points[:-1], points[1:]  # each time point to the next
    earlier = np.searchsorted(completions, invoke, side="left")  # completions before the invocation
    entered = earlier > 0
    return np.concatenate((chain_src, -earlier[entered])), np.concatenate((chain_dst, op[entered]))


def _hubs(hubs) -> Columns:
    return Columns.from_rows(HUB_COLUMNS, hubs, texts=("process", "type"))


def order_edges(hubs, order: str) -> list[tuple[int, int, str, None]]:
    """Process or real-time order between hubs (rows or Columns of HUB_COLUMNS), as edges (see
    _order_ends)."""
    src, dst = _order_ends(_hubs(hubs), order)
    return list(zip(src.tolist(), dst.tolist(), repeat(order), repeat(None)))


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


def _ends(edges) -> tuple[np.ndarray, np.ndarray]:
    """The (src, dst) arrays of edges given as rows (src, dst, ...), Columns, or the arrays."""
    if isinstance(edges, Columns):
        return edges.ints("src"), edges.ints("dst")
    if isinstance(edges, tuple) and len(edges) == 2 and isinstance(edges[0], np.ndarray):
        return edges
    # Ends read column by column with C-level iterators (a generator over every edge's ends took
    # half of this function on 7M edges).
    return (np.fromiter(map(itemgetter(0), edges), dtype=np.int64, count=len(edges)),
            np.fromiter(map(itemgetter(1), edges), dtype=np.int64, count=len(edges)))


def on_cycles(edge_lists) -> set[int]:
    """The nodes of every strongly connected component of two or more nodes, over all the edges
    given (each list: rows, Columns or (src, dst) arrays): every cycle of any subset of them lies
    inside. In compiled code (scipy), since a history of millions of operations has millions of
    edges and, when it is valid, no cycle."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ends = [_ends(edges) for edges in edge_lists]
    count = sum(len(src) for src, _ in ends)
    if count == 0:
        return set()
    src = np.concatenate([s for s, _ in ends])
    dst = np.concatenate([d for _, d in ends])
    lo = int(min(src.min(), dst.min()))
    span = int(max(src.max(), dst.max())) - lo + 1  # in Python's integers: it may pass 64 bits
    if span <= 4 * count:
        # Operations and time points are dense small integers: numbered through a table rather
        # than a sort.
        present = np.zeros(span, dtype=bool)
        present[src - lo] = True
        present[dst - lo] = True
        nodes = np.flatnonzero(present) + lo
        number = np.cumsum(present) - 1
        a, b = number[src - lo], number[dst - lo]
    else:
        nodes, index = np.unique(np.concatenate([src, dst]), return_inverse=True)
        a, b = index[:count], index[count:]
    graph = coo_matrix((np.ones(count, dtype=np.int8), (a, b)), shape=(len(nodes), len(nodes))).tocsr()
    _, labels = connected_components(graph, directed=True, connection="strong")
    sizes = np.bincount(labels)
    return set(nodes[sizes[labels] > 1].tolist())


def _search(edges, deps: frozenset[str], order: str | None, order_edge_list,
            covered: set[frozenset[int]]) -> tuple[list[dict[str, Any]], set[frozenset[int]]]:
    """The witnesses of one cycle type (SEARCH), and the operations of each component it reports."""
    g = _graph([*edges, *order_edge_list], deps | ({order} if order else set()))
    out, reported = [], set()
    for comp in _components(g):
        real = sorted(n for n in comp if n >= 0)
        if len(real) < 2 or frozenset(real) in covered:
            continue
        sub = g.subgraph(comp)
        if deps == {"ww"} and order is None:
            start = comp[0]
            # The shortest way back to the component's first operation is a cycle through it.
            back = min((nx.shortest_path(sub, nxt, start) for nxt in sorted(sub.successors(start))), key=len)
            out.append(_witness(g, [start] + back[:-1], len(comp)))
            reported.add(frozenset(real))
            continue
        inner = sorted(((a, b, {k for k, _ in why}) for a, b, why in sub.edges(data="why")),
                       key=lambda e: (e[0] < 0, e[0], e[1]))
        entry = next(((a, b) for a, b, ks in inner if a >= 0 and order in ks), None)
        read = next(((a, b) for a, b, ks in inner if "wr" in ks), None)
        # A write-write edge that no other edge doubles for: one the component needs.
        write = next(((a, b) for a, b, ks in inner if ks == {"ww"}), None)
        if (order and entry is None) or ("wr" in deps and read is None):
            continue
        through = [e for e in (entry, read, write if deps == {"ww", "wr"} else None) if e is not None]
        walk = _walk(sub, through[0][0], *through)
        out.append(_order_witness(g, walk, order or "wr", len(real)))
        reported.add(frozenset(real))
    return out, reported


def search(edges, hubs=None, orders: dict[str, list] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every cycle type's witnesses over the dependency `edges`; the order edges come from `orders`
    (by order: process, realtime) or else from `hubs`."""
    found: dict[str, list[dict[str, Any]]] = {}
    reported: dict[str, set[frozenset[int]]] = {}
    for kind, (deps, order, leaves_out) in SEARCH.items():
        order_edge_list = []
        if order is not None:
            order_edge_list = orders[order] if orders is not None else order_edges(hubs or [], order)
        covered = set().union(*(reported[other] for other in leaves_out))
        found[kind], reported[kind] = _search(edges, deps, order, order_edge_list, covered)
    return {kind: found[kind] for kind in CYCLE_TYPES}


def add_cycles(analysis: Analysis, limit: int = 32, full_dir: str | Path | None = None) -> Analysis:
    """Count every cycle type, keep `limit` examples of each, and write their full lists."""
    dependencies = Columns.from_rows(DEPENDENCY_COLUMNS, analysis.dependencies, texts=("kind", "key"))
    hubs = _hubs(analysis.hubs)
    ends = {order: _order_ends(hubs, order) for order in ("process", "realtime")}
    # Only operations on some cycle of the union of all edges can be on a cycle of any type;
    # networkx, which keeps Python objects per edge, sees just those (of a valid history: none).
    keep = np.fromiter(on_cycles([dependencies, *ends.values()]), dtype=np.int64)

    def kept(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        return np.isin(src, keep) & np.isin(dst, keep)

    deps = list(dependencies.take(kept(*_ends(dependencies)))) if len(keep) else []
    orders = {}
    for order, (src, dst) in ends.items():
        inside = kept(src, dst) if len(keep) else np.zeros(len(src), dtype=bool)
        orders[order] = list(zip(src[inside].tolist(), dst[inside].tolist(), repeat(order), repeat(None)))
    found = search(deps, orders=orders)
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
