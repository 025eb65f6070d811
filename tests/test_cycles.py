"""G0/G1c cycle search over dependency edges: witnesses are real cycles of the
graph, and there is one per strongly connected component, checked against a
naive reachability closure on small random graphs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.checker.cycles import add_cycles, g0, g1c
from faultline.checker.explain import explain
from faultline.history_analysis.result import Analysis

edges_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 7), st.sampled_from(["ww", "wr"]), st.sampled_from(["a/0", "b/0"])),
    max_size=20,
).map(lambda es: sorted({e for e in es if e[0] != e[1]}))


def components(edges, kinds) -> list[set[int]]:
    """Strongly connected components of two or more nodes, by a reachability closure."""
    nodes = {n for s, d, k, _ in edges if k in kinds for n in (s, d)}
    reach = {n: {d for s, d, k, _ in edges if s == n and k in kinds} for n in nodes}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            more = set().union(*(reach[m] for m in reach[n])) - reach[n] if reach[n] else set()
            if more:
                reach[n] |= more
                changed = True
    comps = []
    for n in sorted(nodes):
        comp = {n} | {m for m in reach[n] if n in reach[m]}
        if len(comp) >= 2 and comp not in comps:
            comps.append(comp)
    return comps


def assert_is_cycle(w, edges):
    have = {(s, d, k, key) for s, d, k, key in edges}
    ops = w["ops"]
    assert len(set(ops)) == len(ops) >= 2
    for i, step in enumerate(w["steps"]):
        assert (step["from"], step["to"]) == (ops[i], ops[(i + 1) % len(ops)])
        assert (step["from"], step["to"], step["type"], step["key"]) in have


@settings(max_examples=300)
@given(edges=edges_strategy)
def test_one_witness_per_component_and_each_a_real_cycle(edges):
    ww = [e for e in edges if e[2] == "ww"]
    found_g0 = g0(edges)
    assert len(found_g0) == len(components(edges, {"ww"}))
    for w in found_g0:
        assert_is_cycle(w, ww)
    found_g1c = g1c(edges)
    with_reads = [c for c in components(edges, {"ww", "wr"})
                  if any(k == "wr" and s in c and d in c for s, d, k, _ in edges)]
    assert len(found_g1c) == len(with_reads)
    for w in found_g1c:
        assert_is_cycle(w, edges)
        assert w["steps"][0]["type"] == "wr"


@given(edges=edges_strategy)
def test_dependencies_that_all_run_forward_have_no_cycle(edges):
    forward = [(min(s, d), max(s, d), k, key) for s, d, k, key in edges]
    assert g0(forward) == [] and g1c(forward) == []


def test_counts_examples_full_files_and_explanations(tmp_path):
    edges = [(1, 2, "ww", "a/0"), (2, 1, "ww", "b/0"), (3, 4, "wr", "a/0"), (4, 3, "ww", "b/0"), (5, 6, "ww", "a/0")]
    analysis = add_cycles(Analysis(dependencies=edges), limit=1, full_dir=tmp_path)
    assert analysis.counts == {"G0": 1, "G1c": 1}
    assert analysis.examples["G0"][0]["ops"] == [1, 2]
    assert analysis.examples["G1c"][0]["ops"] == [3, 4]
    assert (tmp_path / "G0.jsonl").read_text().count("\n") == 1
    text = explain("G1c", analysis.examples["G1c"][0])
    assert "op 3 wrote a value of a/0 that was read by op 4" in text and "op 4 wrote b/0 before op 3" in text
