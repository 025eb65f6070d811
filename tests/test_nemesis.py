"""Which brokers the process nemeses hit, and that a seed fixes the choice.

The db here records calls instead of signalling processes: what is tested is
the choice of targets and what the nemesis reports; the signals themselves
are exercised on real brokers by the end-to-end tests."""

from __future__ import annotations

import pytest

from faultline.nemesis import catalog


class RecordingDB:
    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.down: set[str] = set()

    def kill(self, node):
        self.calls.append(("kill", node))
        self.down.add(node)

    def start(self, node):
        self.calls.append(("start", node))
        self.down.discard(node)

    def running(self, node):
        return node not in self.down

    def wait_ready(self, node):
        pass

    def stop(self, node):
        self.calls.append(("stop", node))
        self.down.add(node)
        return 0

    def pause(self, node):
        self.calls.append(("pause", node))

    def resume(self, node):
        self.calls.append(("resume", node))

    def leader(self, topic, partition):
        return {0: "n1", 1: "n2", 2: "n3"}[partition]

    def controller(self):
        return "n2"


NODES = ["n1", "n2", "n3", "n4", "n5"]
KEYS = ["t/0", "t/1", "t/2"]


@pytest.mark.parametrize("kind,check", [
    ("kill", lambda v: len(v["nodes"]) == 1),
    ("kill-leader", lambda v: v["nodes"] == [{"t/0": "n1", "t/1": "n2", "t/2": "n3"}[v["leader_of"]]]),
    ("kill-controller", lambda v: v["nodes"] == ["n2"]),
    ("kill-majority", lambda v: len(v["nodes"]) == 3 and len(set(v["nodes"])) == 3),
    ("kill-all", lambda v: v["nodes"] == NODES),
])
def test_kill_targets_and_restart(kind, check):
    db = RecordingDB()
    nemeses, pairs = catalog.build([kind], db, NODES, KEYS)
    assert pairs == [("kill", "start")]
    value = nemeses["kill"].invoke({"f": "kill", "seed": 5})
    assert check(value) and value["signal"] == "SIGKILL"
    assert [c for c in db.calls if c[0] == "kill"] == [("kill", n) for n in value["nodes"]]
    again = nemeses["start"].invoke({"f": "start"})
    assert sorted(again["nodes"]) == sorted(value["nodes"]) and not db.down


def test_the_same_seed_picks_the_same_targets():
    picks = []
    for _ in range(2):
        nemeses, _ = catalog.build(["kill-majority", "pause"], RecordingDB(), NODES, KEYS)
        picks.append([nemeses["kill"].invoke({"f": "kill", "seed": s})["nodes"] for s in (1, 2, 3)]
                     + [nemeses["pause"].invoke({"f": "pause", "seed": 9})["nodes"]])
        nemeses["kill"].heal()
    assert picks[0] == picks[1]


def test_pause_is_undone_by_heal():
    db = RecordingDB()
    nemeses, _ = catalog.build(["pause-leader"], db, NODES, KEYS)
    value = nemeses["pause"].invoke({"f": "pause", "seed": 3})
    assert value["signal"] == "SIGSTOP" and value["nodes"]
    assert nemeses["pause"].heal() == {"nodes": value["nodes"], "signal": "SIGCONT"}
    assert db.calls == [("pause", value["nodes"][0]), ("resume", value["nodes"][0])]


def test_unknown_or_clashing_kinds_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: kill, kill-leader"):
        catalog.build(["explode"], RecordingDB(), NODES, KEYS)
    with pytest.raises(ValueError, match="choose one kill-"):
        catalog.build(["kill", "kill-all"], RecordingDB(), NODES, KEYS)


def test_clock_bumps_write_each_chosen_node_offset_and_heal_resets_them_all(tmp_path):
    db = RecordingDB()
    db.clock_file = lambda node: tmp_path / f"{node}.faketime"
    nemeses, pairs = catalog.build(["clock"], db, NODES, KEYS)
    assert pairs == [("bump-clock", "reset-clock")]
    value = nemeses["bump-clock"].invoke({"f": "bump-clock", "seed": 8})
    offsets = value["offsets_s"]
    assert offsets and all(1 <= abs(s) <= 60 for s in offsets.values())
    for node, seconds in offsets.items():
        assert (tmp_path / f"{node}.faketime").read_text() == f"{seconds:+d}\n"
    healed = nemeses["reset-clock"].invoke({"f": "reset-clock"})
    assert healed == {"offsets_s": {node: 0 for node in sorted(offsets)}}
    assert all((tmp_path / f"{n}.faketime").read_text() == "+0\n" for n in NODES)


def test_a_rolling_restart_stops_and_starts_each_broker_in_turn_and_needs_no_repair():
    from faultline.nemesis.core import Schedule

    db = RecordingDB()
    nemeses, pairs = catalog.build(["rolling-restart"], db, NODES, KEYS)
    assert pairs == [("rolling-restart", None)]
    value = nemeses["rolling-restart"].invoke({"f": "rolling-restart", "seed": 4})
    assert sorted(value["nodes"]) == NODES and value["signal"] == "SIGTERM"
    expected = [call for node in value["nodes"] for call in (("stop", node), ("start", node))]
    assert db.calls == expected, "one broker at a time, each back before the next stops"
    assert value == catalog.build(["rolling-restart"], RecordingDB(), NODES, KEYS)[0]["rolling-restart"].invoke(
        {"f": "rolling-restart", "seed": 4}), "the seed fixes the order"
    schedule = Schedule(1, pairs, 1.0)
    assert [schedule.next_op()["f"] for _ in range(3)] == ["rolling-restart"] * 3
