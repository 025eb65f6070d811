"""G0/G1c cycle search over dependency edges: witnesses are real cycles of the
graph, and there is one per strongly connected component, checked against a
naive reachability closure on small random graphs."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.checker.cycles import ORDER_TYPES, add_cycles, g0, g1c, ordered_cycles
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


# --- process and real-time order ------------------------------------------------------

@st.composite
def ordered_histories(draw):
    """Dependencies among 6 operations, each with an invocation and a completion index, a
    process and a type."""
    # Every line of a history has its own index: 12 distinct ones, an invocation and a completion each.
    lines = draw(st.lists(st.integers(0, 99), min_size=12, max_size=12, unique=True))
    spans = [sorted(lines[i:i + 2]) for i in range(0, 12, 2)]
    completions = [c for _, c in spans]
    hubs = [(c, invoke, draw(st.sampled_from(["0", "1", "2"])), draw(st.sampled_from(["ok", "ok", "info"])))
            for invoke, c in spans]
    raw = draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from(["ww", "wr"]),
                                  st.sampled_from(["a/0", "b/0"])), max_size=10))
    edges = sorted({(completions[s], completions[d], k, key) for s, d, k, key in raw if s != d})
    return edges, sorted(hubs)


def ordered(hubs, order):
    """Every pair (a, b) that the order puts a before b, by its definition."""
    pairs = set()
    for a, inv_a, proc_a, type_a in hubs:
        for b, inv_b, proc_b, _ in hubs:
            if a == b or type_a != "ok":
                continue
            if order == "process" and proc_a == proc_b and inv_a < inv_b:
                pairs.add((a, b))
            if order == "realtime" and a < inv_b:
                pairs.add((a, b))
    return pairs


@settings(max_examples=300, deadline=None)
@given(history=ordered_histories(), kind=st.sampled_from(ORDER_TYPES))
def test_order_variants_find_each_component_only_the_order_closes_and_each_witness_holds(history, kind):
    edges, hubs = history
    base_type, order = kind.split("-")
    kinds = {"ww"} if base_type == "G0" else {"ww", "wr"}
    pairs = ordered(hubs, order)

    def with_reads(comps, all_edges):
        return [c for c in comps if base_type == "G0"
                or any(k == "wr" and s in c and d in c for s, d, k, _ in all_edges)]

    covered = with_reads(components(edges, kinds), edges)
    combined = edges + [(a, b, order, None) for a, b in pairs]
    expected = [c for c in with_reads(components(combined, kinds | {order}), edges) if c not in covered]
    found = ordered_cycles(edges, hubs, kind)
    assert sorted(sorted(w["ops"]) for w in found) == sorted(
        sorted(set(w["ops"])) for w in found), "ops list each operation once"
    assert len(found) == len(expected), (found, expected)
    have = {(s, d, k, key) for s, d, k, key in edges if k in kinds}
    for w in found:
        steps = w["steps"]
        assert any(st_["type"] == order for st_ in steps)
        assert base_type == "G0" or any(st_["type"] == "wr" for st_ in steps)
        for i, st_ in enumerate(steps):
            assert st_["to"] == steps[(i + 1) % len(steps)]["from"]
            if st_["type"] == order:
                assert (st_["from"], st_["to"]) in pairs, st_
            else:
                assert (st_["from"], st_["to"], st_["type"], st_["key"]) in have, st_
        assert set(w["ops"]) <= set().union(*expected)
        assert "completed ok before" in explain(kind, w)


def test_a_write_placed_before_one_acknowledged_earlier_closes_a_real_time_cycle():
    # Op 3 (ok, completed at index 3) wrote x and y; op 9, invoked at index 5, after that
    # completion, wrote both keys at lower offsets: ww 9 -> 3 in each log.
    edges = [(9, 3, "ww", "x/0"), (9, 3, "ww", "y/0")]
    hubs = [(3, 2, "1", "ok"), (9, 5, "2", "ok")]
    analysis = add_cycles(Analysis(dependencies=edges, hubs=hubs))
    assert analysis.counts == {"G0-realtime": 1}
    assert analysis.examples["G0-realtime"][0] == {
        "size": 2, "ops": [3, 9], "steps": [{"from": 3, "to": 9, "type": "realtime", "key": None},
                                           {"from": 9, "to": 3, "type": "ww", "key": "x/0"}]}
    # Had op 3 ended info, its writes could have landed after op 9's: no cycle.
    assert add_cycles(Analysis(dependencies=edges, hubs=[(3, 2, "1", "info"), (9, 5, "2", "ok")])).counts == {}
    # The same process: process order closes it too.
    same = add_cycles(Analysis(dependencies=edges, hubs=[(3, 2, "1", "ok"), (9, 5, "1", "ok")]))
    assert same.counts == {"G0-process": 1, "G0-realtime": 1}


@settings(max_examples=200, deadline=None)
@given(history=ordered_histories())
def test_searching_only_operations_on_some_cycle_finds_what_a_search_of_everything_finds(history):
    edges, hubs = history
    fast = add_cycles(Analysis(dependencies=edges, hubs=hubs), limit=1000).examples
    everything = {"G0": g0(edges), "G1c": g1c(edges), **{k: ordered_cycles(edges, hubs, k) for k in ORDER_TYPES}}
    for kind, witnesses in everything.items():
        order = sorted(witnesses, key=lambda w: (min(w["ops"]), json.dumps(w, separators=(",", ":"))))
        assert fast.get(kind, []) == order, kind
