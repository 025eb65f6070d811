"""G0 and G1c: cycles in the dependency graph between operations, found with networkx.

In: an engine's `Analysis`, whose `dependencies` are (src op, dst op, 'ww' |
'wr', key) edges (history_analysis/result.py, DEPENDENCIES, says how both
engines derive them).
Out: the same Analysis with counts and examples for
- G0: a strongly connected component of the write-write graph (writes of
  two operations ordered one way in one key's log and the other way in
  another's);
- G1c: a strongly connected component of the write-write + write-read graph
  that holds a write-read edge (circular information flow);
one witness per component: its size, and one cycle through it as `ops` and
`steps` (from, to, ww/wr, key). With `full_dir`, every witness goes to
`full_dir/G0.jsonl` and `G1c.jsonl`, as the engines write the other types.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx

from ..history_analysis.result import Analysis, witness_json

CYCLE_TYPES = ("G0", "G1c")


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
    why = sorted(g[a][b]["why"])
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


def add_cycles(analysis: Analysis, limit: int = 32, full_dir: str | Path | None = None) -> Analysis:
    """Count G0 and G1c, keep `limit` examples of each, and write their full lists."""
    found = {"G0": g0(analysis.dependencies), "G1c": g1c(analysis.dependencies)}
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
