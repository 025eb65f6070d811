"""The cycle search over dependency edges: witnesses are real cycles (or closed walks, where
the type needs several kinds of step) of the graph, and there is one per strongly connected
component each type reports, checked against a naive reachability closure on small random
graphs; and, on whole histories, G1c (write-read dependencies alone) against G1c-ww (one that
needs an inferred write-write dependency, which Kafka allows)."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.checker.check import check
from faultline.checker.cycles import CYCLE_TYPES, ORDER_TYPES, SEARCH, add_cycles, on_cycles, order_edges, search
from faultline.checker.explain import explain
from faultline.history_analysis.result import HUB_COLUMNS, Analysis, Columns
from faultline.models.guarantees import model_for_settings, model_named
from faultline.models.history import write_history
from faultline.models.spec import DEFAULT_CONSUMER, DEFAULT_PRODUCER

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


def with_reads(comps, edges):
    return [c for c in comps if any(k == "wr" and s in c and d in c for s, d, k, _ in edges)]


def assert_is_cycle(w, edges):
    have = {(s, d, k, key) for s, d, k, key in edges}
    ops = w["ops"]
    assert len(set(ops)) == len(ops) >= 2
    for i, step in enumerate(w["steps"]):
        assert (step["from"], step["to"]) == (ops[i], ops[(i + 1) % len(ops)])
        assert (step["from"], step["to"], step["type"], step["key"]) in have


def assert_is_closed_walk(w, edges):
    have = {(s, d, k, key) for s, d, k, key in edges}
    steps = w["steps"]
    for i, step in enumerate(steps):
        assert step["to"] == steps[(i + 1) % len(steps)]["from"]
        assert (step["from"], step["to"], step["type"], step["key"]) in have
    assert w["ops"] == list(dict.fromkeys(step["from"] for step in steps))


@settings(max_examples=300)
@given(edges=edges_strategy)
def test_one_witness_per_component_and_each_a_real_cycle(edges):
    found = search(edges)
    ww = [e for e in edges if e[2] == "ww"]
    assert len(found["G0"]) == len(components(edges, {"ww"}))
    for w in found["G0"]:
        assert_is_cycle(w, ww)
    # G1c: cycles of write-read edges alone
    reads_only = components(edges, {"wr"})
    assert_one_per_component(found["G1c"], reads_only)
    for w in found["G1c"]:
        assert_is_cycle(w, [e for e in edges if e[2] == "wr"])
        assert {st_["type"] for st_ in w["steps"]} == {"wr"}
    # G1c-ww: the rest of what write-read and write-write edges close, with a read in it
    needs_ww = [c for c in with_reads(components(edges, {"ww", "wr"}), edges) if c not in reads_only]
    assert_one_per_component(found["G1c-ww"], needs_ww)
    for w in found["G1c-ww"]:
        assert_is_closed_walk(w, edges)
        assert {"ww", "wr"} <= {st_["type"] for st_ in w["steps"]}, "through a read and a write order"


def assert_one_per_component(witnesses, comps):
    """Each witness lies in its own component of `comps`, and gives its size."""
    assert len(witnesses) == len(comps), (witnesses, comps)
    homes = []
    for w in witnesses:
        [home] = [c for c in comps if set(w["ops"]) <= c]
        assert w["size"] == len(home)
        homes.append(sorted(home))
    assert len({tuple(h) for h in homes}) == len(comps)


@given(edges=edges_strategy)
def test_dependencies_that_all_run_forward_have_no_cycle(edges):
    forward = [(min(s, d), max(s, d), k, key) for s, d, k, key in edges]
    assert all(witnesses == [] for witnesses in search(forward).values())


def test_counts_examples_full_files_and_explanations(tmp_path):
    edges = [(1, 2, "ww", "a/0"), (2, 1, "ww", "b/0"), (3, 4, "wr", "a/0"), (4, 3, "ww", "b/0"), (5, 6, "ww", "a/0"),
             (7, 8, "wr", "a/0"), (8, 7, "wr", "b/0")]
    analysis = add_cycles(Analysis(dependencies=edges), limit=1, full_dir=tmp_path)
    # 3 and 4 close a cycle only through 4's write order before 3: G1c-ww; 7 and 8 read each other: G1c
    assert analysis.counts == {"G0": 1, "G1c-ww": 1, "G1c": 1}
    assert analysis.examples["G0"][0]["ops"] == [1, 2]
    assert analysis.examples["G1c-ww"][0] == {"size": 2, "ops": [3, 4], "steps": [
        {"from": 3, "to": 4, "type": "wr", "key": "a/0"}, {"from": 4, "to": 3, "type": "ww", "key": "b/0"}]}
    assert analysis.examples["G1c"][0]["ops"] == [7, 8]
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == sorted(f"{t}.jsonl" for t in CYCLE_TYPES)
    assert (tmp_path / "G0.jsonl").read_text().count("\n") == 1
    text = explain("G1c-ww", analysis.examples["G1c-ww"][0])
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


def expected_components(edges, hubs, kind) -> list[set[int]]:
    """What `kind` reports, by its definition: the components of its dependency kinds plus its
    order (pairs, not time points), holding a write-read edge if its kinds have them and an
    order pair if it has an order, that are not components of the types it leaves out."""
    deps, order, leaves_out = SEARCH[kind]
    pairs = ordered(hubs, order) if order else set()
    combined = [e for e in edges if e[2] in deps] + [(a, b, order, None) for a, b in pairs]
    covered = [c for other in leaves_out for c in expected_components(edges, hubs, other)]
    out = []
    for c in components(combined, set(deps) | {order}):
        if c in covered or ("wr" in deps and not with_reads([c], edges)):
            continue
        if order and not any(a in c and b in c for a, b in pairs):
            continue
        out.append(c)
    return out


@settings(max_examples=300, deadline=None)
@given(history=ordered_histories(), kind=st.sampled_from(ORDER_TYPES))
def test_order_variants_find_each_component_only_the_order_closes_and_each_witness_holds(history, kind):
    edges, hubs = history
    deps, order, _ = SEARCH[kind]
    pairs = ordered(hubs, order)
    expected = expected_components(edges, hubs, kind)
    found = search(edges, hubs)[kind]
    assert all(len(set(w["ops"])) == len(w["ops"]) for w in found), "ops list each operation once"
    assert_one_per_component(found, expected)
    have = {(s, d, k, key) for s, d, k, key in edges if k in deps}
    for w in found:
        steps = w["steps"]
        kinds = {st_["type"] for st_ in steps}
        assert order in kinds and ("wr" not in deps or "wr" in kinds)
        assert deps != {"ww", "wr"} or "ww" in kinds, "a G1c-ww variant goes through a write order"
        for i, st_ in enumerate(steps):
            assert st_["to"] == steps[(i + 1) % len(steps)]["from"]
            if st_["type"] == order:
                assert (st_["from"], st_["to"]) in pairs, st_
            else:
                assert (st_["from"], st_["to"], st_["type"], st_["key"]) in have, st_
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
    for kind, witnesses in search(edges, hubs).items():
        order = sorted(witnesses, key=lambda w: (min(w["ops"]), json.dumps(w, separators=(",", ":"))))
        assert fast.get(kind, []) == order, kind


def walked_order_edges(hubs, order):
    """Order edges by a walk over the hubs: per process (in order of first invocation), each hub
    from the process's last ok one before it; or the chain of ok completions' time points, and
    into each hub from the last time point before its invocation."""
    edges = []
    if order == "process":
        by_process = {}
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
        before = sum(1 for c in completions if c < invoke)
        if before:
            edges.append((-before, op, "realtime", None))
    return edges


@settings(max_examples=300, deadline=None)
@given(history=ordered_histories(), order=st.sampled_from(["process", "realtime"]))
def test_order_edges_from_columns_are_the_walks_edges_in_the_walks_order(history, order):
    # networkx's answers (which cycle a witness shows) follow the order edges were added in.
    _, hubs = history
    assert order_edges(hubs, order) == walked_order_edges(hubs, order)
    assert order_edges(Columns.from_rows(HUB_COLUMNS, hubs, texts=("process", "type")), order) == \
        walked_order_edges(hubs, order)


_hub_rows = st.lists(st.tuples(st.integers(-(2 ** 62), 2 ** 62), st.integers(0, 50),
                               st.sampled_from(["0", "10", "9", "nemesis"]), st.sampled_from(["ok", "info", "fail"])),
                     max_size=40)


@settings(max_examples=300, deadline=None)
@given(rows=_hub_rows, data=st.data())
def test_columns_hold_rows_as_a_list_of_tuples_would(rows, data):
    table = Columns.from_rows(HUB_COLUMNS, rows, texts=("process", "type"))
    assert table == rows and len(table) == len(rows) and list(table) == rows
    assert table.sorted() == sorted(rows)
    if rows:
        i = data.draw(st.integers(-len(rows), len(rows) - 1))
        assert table[i] == rows[i]
        assert table[i:i + 3] == rows[i:i + 3]
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows))), dtype=bool)
    assert table.take(mask) == [r for r, m in zip(rows, mask) if m]


# Columns.sorted sorts neighbouring columns as one number when their spans allow: every span, up
# to the whole of 64 bits, and every neighbour, in rows that differ in one column or several.
_wide_rows = st.lists(st.tuples(st.integers(-(2 ** 63), 2 ** 63 - 1), st.integers(-3, 3),
                                st.sampled_from([0, 2 ** 40, -(2 ** 40)]), st.sampled_from(["a", "b", "c"])),
                      max_size=30)


@settings(max_examples=300, deadline=None)
@given(rows=_wide_rows)
def test_columns_sort_rows_of_any_span_as_tuples_sort(rows):
    table = Columns.from_rows(("a", "b", "c", "d"), rows, texts=("d",))
    assert table.sorted() == sorted(rows)


# Node ids as operations (non-negative) and time points (negative) are, densely or sparsely spread:
# on_cycles numbers dense ones through a table and sparse ones by sorting.
_node_ids = st.one_of(st.integers(-20, 40), st.integers(-(2 ** 62), 2 ** 62))


@settings(max_examples=200, deadline=None)
@given(edge_lists=st.lists(st.lists(st.tuples(_node_ids, _node_ids), max_size=30), max_size=3))
def test_on_cycles_names_exactly_the_nodes_of_strongly_connected_components_of_two_or_more(edge_lists):
    g = nx.DiGraph()
    g.add_edges_from(edge for edges in edge_lists for edge in edges)
    expected = {n for comp in nx.strongly_connected_components(g) if len(comp) > 1 for n in comp}
    assert on_cycles([[(a, b, "ww", None) for a, b in edges] for edges in edge_lists]) == expected


# --- on whole histories: G1c against G1c-ww --------------------------------------------

def _line(index, process, type_, f, **fields):
    return {"index": index, "time": (index + 1) * 10, "process": process, "type": type_, "f": f, **fields}


def _send(key, value, offset=None):
    return {"f": "send", "key": key, "value": value, **({"offset": offset} if offset is not None else {})}


def _poll(*records):
    return {"f": "poll", "records": [{"key": k, "offset": o, "value": v} for k, o, v in records]}


def _final_reads(start, ends, records):
    """Process 9's final reads: assign every key from the beginning, then one poll of `records`."""
    keys = sorted(ends)
    return [_line(start, 9, "invoke", "assign", keys=keys, seek_to_beginning=True, final=True),
            _line(start + 1, 9, "ok", "assign", keys=keys, seek_to_beginning=True, final=True, end_offsets=ends),
            _line(start + 2, 9, "invoke", "poll", mops=[{"f": "poll"}], final=True),
            _line(start + 3, 9, "ok", "poll", mops=[_poll(*records)], final=True)]


def interleaved_send_and_poll() -> list[dict]:
    """Op A sends 1 to x, then polls y; meanwhile op B sends 2 to y and 3 to x. A's send lands
    first in x (ww A -> B), and A's poll reads B's write to y (wr B -> A): a cycle only through
    the write order, and a legal interleaving, since nothing isolates A's poll from B's writes."""
    return [
        _line(0, 0, "invoke", "txn", mops=[_send("x/0", 1), {"f": "poll"}]),
        _line(1, 1, "invoke", "send", mops=[_send("y/0", 2), _send("x/0", 3)]),
        _line(2, 1, "ok", "send", mops=[_send("y/0", 2, 0), _send("x/0", 3, 1)]),
        _line(3, 0, "ok", "txn", mops=[_send("x/0", 1, 0), _poll(("y/0", 0, 2))]),
        *_final_reads(4, {"x/0": 2, "y/0": 1}, [("x/0", 0, 1), ("x/0", 1, 3), ("y/0", 0, 2)]),
    ]


def each_reads_the_other() -> list[dict]:
    """Op A sends 1 to x and polls y; op B sends 2 to y and polls x; each read the other's write:
    write-read dependencies alone close the cycle."""
    return [
        _line(0, 0, "invoke", "txn", mops=[_send("x/0", 1), {"f": "poll"}]),
        _line(1, 1, "invoke", "txn", mops=[_send("y/0", 2), {"f": "poll"}]),
        _line(2, 0, "ok", "txn", mops=[_send("x/0", 1, 0), _poll(("y/0", 0, 2))]),
        _line(3, 1, "ok", "txn", mops=[_send("y/0", 2, 0), _poll(("x/0", 0, 1))]),
        *_final_reads(4, {"x/0": 1, "y/0": 1}, [("x/0", 0, 1), ("y/0", 0, 2)]),
    ]


def checked(tmp_path, lines, model):
    path = tmp_path / "history.jsonl"
    write_history(path, lines)
    return check(path, model, engine="python")


def test_a_send_and_poll_interleaved_with_another_send_is_only_g1c_ww_and_allowed(tmp_path):
    results = checked(tmp_path, interleaved_send_and_poll(), model_named("exactly-once"))
    assert results["anomaly_types"] == ["G1c-ww"], results
    assert results["anomalies"]["G1c-ww"][0]["steps"] == [
        {"from": 2, "to": 3, "type": "wr", "key": "y/0"}, {"from": 3, "to": 2, "type": "ww", "key": "x/0"}]
    assert results["bad_anomaly_types"] == [] and results["valid"] is True, results
    # Only a run that claims write isolation (which Kafka never does) forbids it.
    strict = checked(tmp_path, interleaved_send_and_poll(), model_named("exactly-once+write-isolation"))
    assert strict["bad_anomaly_types"] == ["G1c-ww"] and strict["valid"] is False


def test_a_pure_write_read_cycle_is_g1c_and_forbidden(tmp_path):
    results = checked(tmp_path, each_reads_the_other(), model_named("exactly-once"))
    assert results["anomaly_types"] == ["G1c"], results
    assert [st_["type"] for st_ in results["anomalies"]["G1c"][0]["steps"]] == ["wr", "wr"]
    assert results["bad_anomaly_types"] == ["G1c"] and results["valid"] is False
    # From settings: transactions read with read_committed forbid it too ...
    transactional = model_for_settings({**DEFAULT_PRODUCER, "transactional.id": "t"}, "assign",
                                       {"min.insync.replicas": "2"}, [], {"isolation.level": "read_committed"})
    assert checked(tmp_path, each_reads_the_other(), transactional)["valid"] is False
    # ... but without transactions each operation's sends and polls are separate requests, and
    # both sends landing before both polls is a legal interleaving.
    plain = model_for_settings(DEFAULT_PRODUCER, "assign", {}, [], DEFAULT_CONSUMER)
    assert checked(tmp_path, each_reads_the_other(), plain)["valid"] is True
