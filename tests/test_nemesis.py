"""Which brokers the process nemeses hit, and that a seed fixes the choice.

The db here records calls instead of signalling processes: what is tested is
the choice of targets and what the nemesis reports; the signals themselves
are exercised on real brokers by the end-to-end tests."""

from __future__ import annotations

import pytest

from faultline.nemesis import catalog
from faultline.nemesis.core import RepairFailed


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

    def power_off(self, node):
        self.calls.append(("power-off", node))
        self.down.add(node)
        return {"pids": {"broker": 100, "disk": 101}, "unsynced_bytes": 7}

    def power_on(self, node):
        self.calls.append(("power-on", node))
        self.down.discard(node)
        return 200

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
    assert value["target"] == (kind.partition("-")[2] or "random"), "the kind of target it chose"
    assert [c for c in db.calls if c[0] == "kill"] == [("kill", n) for n in value["nodes"]]
    again = nemeses["start"].invoke({"f": "start"})
    assert sorted(again["nodes"]) == sorted(value["nodes"]) and not db.down
    assert again["outcomes"] == {n: "healed" for n in value["nodes"]}


@pytest.mark.parametrize("kind,count", [("power-loss", 1), ("power-loss-majority", 3), ("power-loss-all", 5)])
def test_power_loss_cuts_the_chosen_nodes_and_power_on_brings_each_back(kind, count):
    db = RecordingDB()
    nemeses, pairs = catalog.build([kind], db, NODES, KEYS)
    assert pairs == [("power-off", "power-on")]
    value = nemeses["power-off"].invoke({"f": "power-off", "seed": 2})
    assert len(value["nodes"]) == count and db.down == set(value["nodes"])
    assert value["unsynced_bytes"] == {n: 7 for n in value["nodes"]}
    assert value["pids"] == {n: {"broker": 100, "disk": 101} for n in value["nodes"]}
    second = nemeses["power-off"].invoke({"f": "power-off", "seed": 3})
    if count == len(NODES):
        assert second == {"nodes": [], "target": "all", "note": "every node is already off"}
    else:
        assert second["nodes"] and not set(second["nodes"]) & set(value["nodes"]), "only nodes still on"
    back = nemeses["power-on"].invoke({"f": "power-on"})
    assert sorted(back["nodes"]) == sorted(db.calls[i][1] for i, c in enumerate(db.calls) if c[0] == "power-off")
    assert not db.down and back["pids"] == {n: 200 for n in back["nodes"]}


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
    assert nemeses["pause"].heal() == {"nodes": value["nodes"], "signal": "SIGCONT",
                                       "outcomes": {value["nodes"][0]: "healed"}}
    assert db.calls == [("pause", value["nodes"][0]), ("resume", value["nodes"][0])]


def test_unknown_or_clashing_kinds_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: kill, kill-leader"):
        catalog.build(["explode"], RecordingDB(), NODES, KEYS)
    with pytest.raises(ValueError, match="at most one kind each of kill-"):
        catalog.build(["kill", "kill-all"], RecordingDB(), NODES, KEYS)


def test_clock_bumps_write_each_chosen_node_offset_and_heal_resets_them_to_where_they_started(tmp_path):
    db = RecordingDB()
    db.clock_file = lambda node: tmp_path / f"{node}.faketime"
    db.start_offset = lambda node: -30 if node == "n2" else 0  # as --clock-offset n2=-30 gives
    nemeses, pairs = catalog.build(["clock"], db, NODES, KEYS)
    assert pairs == [("bump-clock", "reset-clock"), ("strobe-clock", None)]
    value = nemeses["bump-clock"].invoke({"f": "bump-clock", "seed": 8})
    offsets = value["offsets_s"]
    assert offsets and all(1 <= abs(s - db.start_offset(n)) <= 60 for n, s in offsets.items())
    for node, seconds in offsets.items():
        assert (tmp_path / f"{node}.faketime").read_text() == f"{seconds:+d}\n"
    healed = nemeses["reset-clock"].invoke({"f": "reset-clock"})
    assert healed == {"offsets_s": {node: db.start_offset(node) for node in sorted(offsets)},
                      "outcomes": {node: "healed" for node in NODES}}
    assert all((tmp_path / f"{n}.faketime").read_text() == f"{db.start_offset(n):+d}\n" for n in NODES)


def test_a_clock_strobe_flips_each_chosen_clock_every_period_and_leaves_it_where_it_started(tmp_path):
    db = RecordingDB()
    db.clock_file = lambda node: tmp_path / f"{node}.faketime"
    db.start_offset = lambda node: 5
    seen = []

    def sleep(seconds):  # what each clock reads during each period
        seen.append({n: int(f.read_text()) for n in NODES if (f := tmp_path / f"{n}.faketime").exists()})

    nemeses, _ = catalog.build(["clock"], db, NODES, KEYS)
    nemesis = nemeses["strobe-clock"]
    nemesis.sleep, nemesis.duration = sleep, 4
    value = nemesis.invoke({"f": "strobe-clock", "seed": 3})
    chosen, skews = value["nodes"], value["skews_s"]
    assert value["flips"] == 4 and set(skews) == set(chosen)
    assert seen == [{n: 5 + (skews[n] if i % 2 == 0 else 0) for n in chosen} for i in range(4)]
    assert all((tmp_path / f"{n}.faketime").read_text() == "+5\n" for n in chosen)
    assert value["offsets_s"] == {n: 5 for n in chosen}


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
    assert [op["f"] for op, _ in Schedule(1, pairs, 1.0).ops(3)] == ["rolling-restart"] * 3


class FailingDB(RecordingDB):
    """Starting, resuming or powering on a node in `broken` raises, as a broker that exits at once."""

    def __init__(self, broken):
        super().__init__()
        self.broken = set(broken)

    def _check(self, what, node):
        if node in self.broken:
            raise RuntimeError(f"the broker on {node} exited; its log ends: {what} failed")

    def start(self, node):
        self._check("start", node)
        super().start(node)

    def resume(self, node):
        self._check("resume", node)
        super().resume(node)

    def power_on(self, node):
        self._check("power-on", node)
        return super().power_on(node)


@pytest.mark.parametrize("kind,fault,repair", [("kill-all", "kill", "start"),
                                               ("power-loss-all", "power-off", "power-on")])
def test_a_repair_that_fails_on_one_node_repairs_the_others_and_says_which_failed(kind, fault, repair):
    db = FailingDB({"n2"})
    nemeses, _ = catalog.build([kind], db, NODES, KEYS)
    nemeses[fault].invoke({"f": fault, "seed": 1})
    with pytest.raises(RepairFailed, match="n2: RuntimeError: the broker on n2 exited") as failed:
        nemeses[repair].invoke({"f": repair})
    outcomes = failed.value.value["outcomes"]
    assert outcomes["n2"].startswith("n2: RuntimeError") and outcomes.pop("n2")
    assert outcomes == {n: "healed" for n in NODES if n != "n2"}, "every other node was still repaired"
    assert sorted(failed.value.value["nodes"]) == sorted(outcomes)
    assert db.down == {"n2"}
    db.broken.clear()
    again = nemeses[fault].heal()
    assert again["nodes"] == ["n2"] and again["outcomes"] == {"n2": "healed"}, "the failed node is tried again"
    assert not db.down


def test_a_pause_target_and_a_resume_that_fails_are_recorded():
    db = FailingDB({"n3"})
    nemeses, _ = catalog.build(["pause-leader"], db, NODES, KEYS)
    value = nemeses["pause"].invoke({"f": "pause", "seed": 3})
    assert value["target"] == "leader" and value["nodes"] == ["n3"] and value["leader_of"] == "t/2"
    with pytest.raises(RepairFailed) as failed:
        nemeses["resume"].invoke({"f": "resume"})
    assert failed.value.value["outcomes"] == {"n3": "n3: RuntimeError: the broker on n3 exited; its log ends: "
                                                     "resume failed"}


def test_kill_consumer_sigkills_one_live_member_by_its_pid_file_and_says_which(tmp_path):
    import subprocess

    from faultline.nemesis.clients import KillClientNemesis

    nemesis = KillClientNemesis("consumer", tmp_path)
    assert nemesis.invoke({"f": "kill-consumer", "seed": 1}) == {"processes": [],
                                                                 "note": "no consumer group member was running"}
    member = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "consumer-7.pid").write_text(str(member.pid))
        (tmp_path / "consumer-9.pid").write_text("999999999")  # ended long ago
        done = nemesis.invoke({"f": "kill-consumer", "seed": 1})
        assert done == {"processes": [7], "pids": {"7": member.pid}, "signal": "SIGKILL"}
        assert member.wait(10) == -9
    finally:
        member.kill()
    assert "next operation" in nemesis.invoke({"f": "consumers-rejoin"})["note"]


def test_kill_consumer_kills_a_member_that_holds_keys_whatever_the_seed(tmp_path):
    # A member the group gave no partitions has nothing to lose or repeat: killing it shows nothing.
    import subprocess

    from faultline.nemesis.clients import KillClientNemesis

    members = {p: subprocess.Popen(["sleep", "60"]) for p in (1, 2, 3)}
    try:
        for p, member in members.items():
            (tmp_path / f"consumer-{p}.pid").write_text(str(member.pid))
        (tmp_path / "consumer-1.keys").write_text("[]")
        (tmp_path / "consumer-2.keys").write_text('["t/0", "t/1"]')
        (tmp_path / "consumer-4.keys").write_text('["t/2"]')  # no live member of that number
        nemesis = KillClientNemesis("consumer", tmp_path)
        done = nemesis.invoke({"f": "kill-consumer", "seed": 0})
        assert done == {"processes": [2], "pids": {"2": members[2].pid}, "signal": "SIGKILL", "keys": ["t/0", "t/1"]}
        assert members[2].wait(10) == -9
        # None holds keys now: any live member, by the seed.
        done = nemesis.invoke({"f": "kill-consumer", "seed": 0})
        assert done["processes"] in ([1], [3]) and "keys" not in done
        assert members[done["processes"][0]].wait(10) == -9
    finally:
        for member in members.values():
            member.kill()


def test_kill_producer_sigkills_one_live_producer_session_by_its_pid_file(tmp_path):
    import subprocess

    from faultline.nemesis.catalog import build

    by_f, pairs = build(["kill-producer"], None, ["n1"], ["t/0"], clients_dir=tmp_path)
    assert pairs == [("kill-producer", "producers-restart")]
    nemesis = by_f["kill-producer"]
    producer = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "producer-3.pid").write_text(str(producer.pid))
        (tmp_path / "consumer-4.pid").write_text(str(producer.pid))  # another role's: not a producer
        assert nemesis.invoke({"f": "kill-producer", "seed": 5}) == {
            "processes": [3], "pids": {"3": producer.pid}, "signal": "SIGKILL"}
        assert producer.wait(10) == -9
        assert nemesis.invoke({"f": "kill-producer", "seed": 5}) == {"processes": [],
                                                                     "note": "no producer was running"}
    finally:
        producer.kill()
    assert "new producer session" in by_f["producers-restart"].invoke({"f": "producers-restart"})["note"]


class ReplicaDB(RecordingDB):
    """Three replicas per partition with an ISR: a killed broker leaves every ISR but the last
    member's; a leaderless partition takes the first replica that starts (unclean election)."""

    def __init__(self):
        super().__init__()
        self.isr = {p: {"n1", "n2", "n3"} for p in range(3)}
        self.leaders = {0: "n1", 1: "n2", 2: "n3"}
        self.log_ends: dict[str, int] = {}  # what each replica's disk holds, by node

    def log_end_offset(self, node, topic, partition):
        return self.log_ends.get(node)

    def kill(self, node):
        super().kill(node)
        for p, isr in self.isr.items():
            if len(isr) > 1:
                isr.discard(node)
            if self.leaders[p] == node:
                live = sorted(n for n in isr if n not in self.down)
                self.leaders[p] = live[0] if live else None
        return 1000 + int(node[1:])

    def start(self, node):
        super().start(node)
        for p in self.isr:
            if self.leaders[p] is None:
                self.leaders[p], self.isr[p] = node, {node}

    def leader(self, topic, partition):
        return self.leaders[partition]

    def in_sync_replicas(self, topic, partition):
        return sorted(self.isr[partition])


@pytest.mark.parametrize("kind, fault, elect, stale", [("stale-election", "kill-follower", "elect-stale", 1),
                                                       ("lone-leader", "kill-followers", "elect-follower", 2)])
def test_the_election_nemeses_leave_followers_behind_then_start_one_first(kind, fault, elect, stale):
    db = ReplicaDB()
    nemeses, pairs = catalog.build([kind], db, ["n1", "n2", "n3"], KEYS)
    assert pairs == [(fault, elect)]
    value = nemeses[fault].invoke({"f": fault, "seed": 4})
    key, leader = value["key"], value["leader"]
    followers = sorted({"n1", "n2", "n3"} - {leader})
    assert len(value["nodes"]) == stale and set(value["nodes"]) <= set(followers)
    assert value["isr"] == sorted({"n1", "n2", "n3"} - set(value["nodes"]))
    if kind == "lone-leader":
        assert value["isr"] == [leader], "every follower left the ISR: the leader is alone"
    again = nemeses[fault].invoke({"f": fault, "seed": 5})
    assert again["nodes"] == [] and "already stale" in again["note"]
    # Of two stale followers, the one whose disk holds more of the log starts first, whatever the
    # seeded order: the other one's records are all in it.
    first = value["nodes"][-1]
    db.log_ends = {n: 200 + (n == first) * 3 for n in value["nodes"]}
    elected = nemeses[elect].invoke({"f": elect})
    assert (elected["key"], elected["started_first"], elected["stale_elected"], elected["leader_then"]) == (
        key, first, True, first)
    assert elected.get("log_ends") == (db.log_ends if kind == "lone-leader" else None)
    assert sorted(elected["nodes"]) == value["isr"] and sorted(elected["restarted"]) == ["n1", "n2", "n3"]
    # The replicas still in sync die after the stale ones; the stale one that starts first leads.
    kills = [n for c, n in db.calls if c == "kill"]
    assert kills == value["nodes"] + sorted(elected["nodes"])
    assert [n for c, n in db.calls if c == "start"][0] == first and not db.down
