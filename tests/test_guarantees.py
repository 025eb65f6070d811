"""The anomaly registry and the guarantee models: one list of types that every other list derives
from, models derived from a run's settings as promises, and a verdict that fails closed on a type
nobody registered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faultline.checker import cycles, explain
from faultline.checker.verdict import verdict
from faultline.history_analysis import result
from faultline.models import anomaly_types as registry
from faultline.models.anomaly_types import PROMISES, REGISTRY, AnomalyType
from faultline.models.guarantees import BASE_NAMES, for_history, model_for_settings, model_named
from faultline.models.spec import DEFAULT_CONSUMER, DEFAULT_PRODUCER

# Types that break no promise: reported, never bad.
NEVER_BAD = frozenset(t.name for t in registry.REGISTRY if not t.breaks)
ALL = frozenset(registry.names())
# Always forbidden while nothing lets committed records go and consumers assign.
READS = {"unexpected", "G1a", "inconsistent-offsets", "uncommitted-read", "int-poll-skip",
         "int-nonmonotonic-poll", "poll-skip", "nonmonotonic-poll"}
LOSS = {"lost-write", "unseen", "reused-offset", "nonmonotonic-send"}
# What a rebalance explains under subscribe: a move between polls. One during an operation is in its
# rebalance_log, and the engines leave the keys it names out of the int- types.
REBALANCED = {"poll-skip", "nonmonotonic-poll"}
EXACTLY_ONCE = READS | LOSS | {"duplicate", "int-nonmonotonic-send"}
# What the transactions promise adds for a named model: the reads of an atomic operation, and the
# cycles of write-read dependencies (with or without order), which follow values, not offsets.
NAMED_TXN = {"precommitted-read", "G1c", "G1c-process", "G1c-realtime"}
LOST_CONSUMPTION, DUPLICATE_CONSUMPTION = {"lost-consumption"}, {"duplicate-consumption"}


# --- the registry --------------------------------------------------------------------

def test_every_type_has_a_description_a_finder_and_promises_or_a_reason():
    assert len(ALL) == len(REGISTRY)
    for t in REGISTRY:
        assert t.description and t.found_by in (registry.ENGINE, registry.CYCLES), t
        assert t.breaks <= set(PROMISES)
        assert bool(t.breaks) != bool(t.never_bad), f"{t.name}: promises it breaks, or why it is never bad"


def test_every_registered_type_has_an_explainer_and_every_explainer_a_type():
    assert set(explain.EXPLAINERS) == ALL


def test_the_engines_and_the_cycle_search_take_their_types_from_the_registry():
    assert result.TYPES == registry.names(registry.ENGINE)
    assert cycles.CYCLE_TYPES == registry.names(registry.CYCLES)
    assert set(cycles.SEARCH) == set(cycles.CYCLE_TYPES)
    assert set(result.TYPES) | set(cycles.CYCLE_TYPES) == ALL
    assert "reused-offset" in result.TYPES
    assert {"G1c", "G1c-ww", "G1c-ww-process", "G1c-ww-realtime"} <= set(cycles.CYCLE_TYPES)


@pytest.mark.parametrize("fields, message", [
    ({"found_by": "spark"}, "neither"),
    ({"breaks": frozenset({"no-such-promise"})}, "unknown promise"),
    ({"breaks": frozenset()}, "why it is never bad"),
    ({"never_bad": "reported for information"}, "why it is never bad"),
    ({"description": ""}, "no description"),
])
def test_a_malformed_registry_entry_is_refused(fields, message):
    entry = {"name": "x", "description": "d", "found_by": registry.ENGINE, "breaks": frozenset({"no-loss"}),
             **fields}
    with pytest.raises(ValueError, match=message):
        AnomalyType(**entry)
    assert AnomalyType("y", "d", registry.ENGINE, frozenset(), "reported for information").never_bad


def test_the_reused_offset_explanation_names_both_values_and_operations():
    text = explain.explain("reused-offset", {"key": "t/0", "offset": 3, "value": 7, "send_op": 12,
                                             "other_value": 9, "other_op": 40, "ops": [12, 40]})
    assert text == ("value 7 was acknowledged at offset 3 of t/0 (op 12), but offset 3 holds value 9 (op 40): "
                    "the acknowledged write was lost and its offset reused")


def test_a_duplicate_explanation_says_which_sessions_sent_the_value():
    w = {"key": "t/0", "value": 87, "offsets": [31, 34], "ops": [222, 212]}
    one = [{"op": 194, "process": 3, "type": "ok"}]
    two = [{"op": 194, "process": 3, "type": "info"}, {"op": 212, "process": 7, "type": "ok"}]
    assert explain.explain("duplicate", {**w, "sends": one}) == (
        "value 87 of t/0 was read at offsets 31, 34 (op 222, op 212): one send (op 194, process 3), several "
        "positions in the log: the producer wrote it twice in one session")
    assert explain.explain("resent-duplicate", {**w, "sends": two}) == (
        "value 87 of t/0 was read at offsets 31, 34 (op 222, op 212): sent 2 times, by processes 3, 7 (op 194, "
        "212): the application sent it again from another producer session")
    assert explain.explain("duplicate", {**w, "offsets": [31, 34, 40], "ops": [222, 212, 230], "sends": two}).endswith(
        "from another producer session; more offsets than sessions, so one of them wrote it twice")


# --- a type nobody registered --------------------------------------------------------

models = st.sampled_from([*BASE_NAMES.values(), "exactly-once+write-isolation"]).map(model_named)
unregistered = st.text(min_size=1, max_size=20).filter(lambda name: name not in ALL)


@given(model=models, name=unregistered)
def test_a_type_missing_from_the_registry_is_bad_under_every_model(model, name):
    assert model.forbids(name)
    assert name not in model.allowed
    assert "not in the anomaly registry" in model.why(name)


@given(model=models, name=unregistered)
def test_the_verdict_fails_closed_on_a_type_missing_from_the_registry(model, name):
    analysis = result.Analysis(counts={name: 1, "G0": 1}, stats={"ops": 2, "ok": 2})
    results = verdict(analysis, model)
    assert name in results["bad_anomaly_types"] and results["valid"] is False
    assert "G0" in results["anomaly_types"] and ("G0" in results["bad_anomaly_types"]) == model.forbids("G0")


# --- named models ------------------------------------------------------------------

@pytest.mark.parametrize("name, forbidden", [
    ("exactly-once", EXACTLY_ONCE | NAMED_TXN | LOST_CONSUMPTION | DUPLICATE_CONSUMPTION),
    ("at-least-once", READS | LOSS | NAMED_TXN | LOST_CONSUMPTION),
    ("at-most-once", READS | {"duplicate"} | NAMED_TXN | DUPLICATE_CONSUMPTION),
    ("best-effort", READS | NAMED_TXN),
    ("exactly-once+write-isolation", ALL - NEVER_BAD),
])
def test_named_models(name, forbidden):
    model = model_named(name)
    assert model.name == name and model.forbidden == forbidden
    assert model.allowed == ALL - forbidden


@pytest.mark.parametrize("commit, forbidden, allowed", [
    (None, LOST_CONSUMPTION | DUPLICATE_CONSUMPTION, set()),
    ("after", LOST_CONSUMPTION, DUPLICATE_CONSUMPTION),
    ("before", DUPLICATE_CONSUMPTION, LOST_CONSUMPTION),
    ("auto", set(), LOST_CONSUMPTION | DUPLICATE_CONSUMPTION),
])
def test_when_a_group_commits_decides_which_consumption_anomalies_its_model_allows(commit, forbidden, allowed):
    model = model_for_settings(IDEMPOTENT, "subscribe", ISR2, [], DEFAULT_CONSUMER, commit=commit)
    assert forbidden <= model.forbidden and allowed <= model.allowed
    assert model.name == "exactly-once", "how a group commits says nothing of the log's delivery"
    if commit == "auto":
        assert "enable.auto.commit=true" in model.why("lost-consumption")


def test_the_history_shows_subscribers_and_atomic_operations_under_any_model():
    """Rule 10 of the Jepsen semantics: how consumers read comes from the history, and so does
    whether any operation could be non-atomic (one that both sends and polls)."""
    subscribed = {"by_f": {"subscribe": {"invoked": 2, "ok": 1}, "poll": {"invoked": 5, "ok": 5}}, "mixed": 0}
    for model in (model_named("exactly-once"), model_for_settings(IDEMPOTENT, "assign", ISR2, [], DEFAULT_CONSUMER)):
        adjusted = for_history(model, subscribed)
        assert adjusted.name == model.name
        assert REBALANCED <= adjusted.allowed and REBALANCED <= model.forbidden
        assert {"int-poll-skip", "int-nonmonotonic-poll"} <= adjusted.forbidden
        assert "the history's processes subscribe" in adjusted.why("poll-skip")
    plain = model_for_settings(IDEMPOTENT, "assign", ISR2, [], DEFAULT_CONSUMER)
    assert {"G1c-realtime", "G1c-process", "G1c"} <= plain.allowed
    atomic = for_history(plain, {"by_f": {"send": {"invoked": 1, "ok": 1}}, "mixed": 0})
    assert {"G1c-realtime", "G1c-process", "G1c", "precommitted-read"} <= atomic.forbidden
    assert "both sends and polls" in atomic.why("G1c-realtime")
    assert for_history(plain, {"by_f": {"txn": {"invoked": 1, "ok": 1}}, "mixed": 1}) is plain
    assert {"G0", "G0-realtime", "G1c-ww-realtime"} <= atomic.allowed, "Kafka promises no write isolation"


def test_named_models_keep_how_consumers_read_and_refuse_unknown_names():
    assert REBALANCED <= model_named("exactly-once", "subscribe").allowed
    with pytest.raises(ValueError, match="unknown model 'exact'"):
        model_named("exact")
    with pytest.raises(ValueError, match="unknown promise"):
        model_named("exactly-once+serializable")


# --- models from settings ----------------------------------------------------------

IDEMPOTENT = dict(DEFAULT_PRODUCER)  # acks=all, enable.idempotence=true
RETRYING = {**DEFAULT_PRODUCER, "enable.idempotence": "false"}
ACKS1 = {**RETRYING, "acks": "1"}
ISR2 = {"min.insync.replicas": "2"}
BASE = READS | {"duplicate"}  # at-most-once from settings: no loss promised, no duplicates


@pytest.mark.parametrize("producer, mode, broker, nemesis, name, forbidden", [
    # No faults: nothing fails the only in-sync replica, so min.insync.replicas=1 loses nothing.
    (IDEMPOTENT, "assign", {}, [], "exactly-once", EXACTLY_ONCE),
    (IDEMPOTENT, "assign", ISR2, ["kill-leader", "partition"], "exactly-once", EXACTLY_ONCE),
    # A clock fault fails no replica.
    (IDEMPOTENT, "assign", {}, ["clock"], "exactly-once", EXACTLY_ONCE),
    (IDEMPOTENT, "assign", {}, ["kill"],
     "at-most-once (min.insync.replicas=1 with faults kill: acknowledged writes may be lost)", BASE),
    (RETRYING, "assign", {"min.insync.replicas": "1"}, ["kill-leader"],
     "best-effort (min.insync.replicas=1 with faults kill-leader: acknowledged writes may be lost)", READS),
    (RETRYING, "assign", ISR2, ["kill"], "at-least-once", READS | LOSS),
    (RETRYING, "subscribe", ISR2, ["kill"], "at-least-once", (READS | LOSS) - REBALANCED),
    ({**RETRYING, "retries": "0"}, "assign", ISR2, ["kill"], "exactly-once", EXACTLY_ONCE),
    (ACKS1, "assign", {}, ["kill"], "best-effort", READS),
    ({**ACKS1, "retries": "0"}, "assign", {}, ["kill"], "at-most-once", BASE),
    ({**ACKS1, "acks": "0"}, "assign", ISR2, [], "best-effort", READS),
    # Settings that let committed records go: only the reads of values nobody sent or that failed stay bad.
    (IDEMPOTENT, "assign", {**ISR2, "unclean.leader.election.enable": "true"}, ["kill"],
     "at-most-once (unclean.leader.election.enable=true: acknowledged writes and committed records may be lost)",
     {"unexpected", "G1a", "duplicate"}),
    (IDEMPOTENT, "assign", {**ISR2, "faultline.truncation": "high-watermark"}, [],
     "at-most-once (faultline.truncation=high-watermark: acknowledged writes and committed records may be lost)",
     {"unexpected", "G1a", "duplicate"}),
    (IDEMPOTENT, "assign", ISR2, ["power-loss"],
     "at-most-once (power-loss with log.flush.interval.messages unset: acknowledged writes and committed "
     "records may be lost)", {"unexpected", "G1a", "duplicate"}),
    (IDEMPOTENT, "assign", {**ISR2, "log.flush.interval.messages": "1"}, ["power-loss-all"], "exactly-once",
     EXACTLY_ONCE),
    (ACKS1, "assign", {"unclean.leader.election.enable": "true"}, [],
     "best-effort (unclean.leader.election.enable=true: acknowledged writes and committed records may be lost)",
     {"unexpected", "G1a"}),
])
def test_model_from_settings(producer, mode, broker, nemesis, name, forbidden):
    model = model_for_settings(producer, mode, broker, nemesis, DEFAULT_CONSUMER)
    assert model.name == name
    # A run whose consumers commit nothing that processing depends on claims both consumption promises.
    assert model.forbidden == forbidden | LOST_CONSUMPTION | DUPLICATE_CONSUMPTION


def test_transactions_decide_aborted_reads_and_atomic_operations():
    txn = {**DEFAULT_PRODUCER, "transactional.id": "t"}
    committed = model_for_settings(txn, "assign", ISR2, [], {"isolation.level": "read_committed"})
    assert {"G1a", "precommitted-read", "G1c", "G1c-process", "G1c-realtime"} <= committed.forbidden
    uncommitted = model_for_settings(txn, "assign", ISR2, [], {"isolation.level": "read_uncommitted"})
    assert {"G1a", "precommitted-read", "G1c"} <= uncommitted.allowed
    assert "aborted transactions" in uncommitted.why("G1a")


settings_strategy = st.fixed_dictionaries({
    "producer": st.fixed_dictionaries({}, optional={
        "acks": st.sampled_from(["all", "-1", "1", "0"]),
        "enable.idempotence": st.sampled_from(["true", "false"]),
        "retries": st.sampled_from(["0", "3", "2147483647"]),
        "transactional.id": st.sampled_from(["", "t"]),
    }),
    "mode": st.sampled_from(["assign", "subscribe"]),
    "broker": st.fixed_dictionaries({}, optional={
        "min.insync.replicas": st.sampled_from(["1", "2", "3"]),
        "unclean.leader.election.enable": st.sampled_from(["true", "false"]),
        "faultline.truncation": st.sampled_from(["leader-epoch", "leader-epoch-once", "high-watermark"]),
        "log.flush.interval.messages": st.sampled_from(["1", "1000"]),
    }),
    "nemesis": st.lists(st.sampled_from(["kill", "kill-leader", "pause", "partition", "clock", "power-loss",
                                         "power-loss-all"]), max_size=3, unique=True),
    "consumer": st.fixed_dictionaries({}, optional={
        "isolation.level": st.sampled_from(["read_committed", "read_uncommitted"])}),
})


def derive(s):
    return model_for_settings(s["producer"], s["mode"], s["broker"], s["nemesis"], s["consumer"])


@given(s=settings_strategy)
def test_every_derived_model_judges_every_type_and_says_why(s):
    model = derive(s)
    assert model.forbidden | model.allowed == ALL and not model.forbidden & model.allowed
    assert {"unexpected"} <= model.forbidden, "a value nobody sent is never allowed"
    assert "no-loss" not in model.promises or "durable-commits" in model.promises
    assert "write-isolation" not in model.promises, "Kafka never promises write isolation"
    base = model.name.split(" (")[0]
    assert base == BASE_NAMES[("no-loss" in model.promises, "no-duplicates" in model.promises)]
    text = model.explain()
    for t in REGISTRY:
        assert f" {t.name}: " in text
        assert model.why(t.name)
    for c in model.claims:
        assert c.reasons and all(c.reasons)


@given(s=settings_strategy, fault=st.sampled_from(["kill", "power-loss", "partition"]),
       setting=st.sampled_from([("unclean.leader.election.enable", "true"), ("min.insync.replicas", "1"),
                                ("faultline.truncation", "high-watermark"),
                                ("faultline.truncation", "leader-epoch-once"),
                                ("log.flush.interval.messages", "1000")]))
def test_a_fault_or_a_weaker_setting_never_forbids_more(s, fault, setting):
    weaker = {**s, "nemesis": sorted(set(s["nemesis"]) | {fault}), "broker": {**s["broker"], setting[0]: setting[1]}}
    assert derive(weaker).forbidden <= derive(s).forbidden


def test_the_documented_table_is_the_registry_and_names_jepsens_function_for_each_type():
    from pathlib import Path

    from faultline.models import registry_table

    assert set(registry.JEPSEN) == ALL
    doc = (Path(__file__).parent.parent / "docs" / "anomalies.md").read_text()
    start, end = doc.index(registry_table.BEGIN), doc.index(registry_table.END) + len(registry_table.END)
    assert doc[start:end] == registry_table.markdown(), (
        "docs/anomalies.md's table differs from the registry: regenerate it with "
        "`python -m faultline.models.registry_table`")
