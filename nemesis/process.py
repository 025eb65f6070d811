"""Process faults: SIGKILL a node's broker and start it again.

In: the db (start/kill/wait_ready/running by node name, and `leader(topic,
partition)` for the node leading a partition), the node names and the
test's keys ("topic/partition"). Out: `kill` kills a broker and reports which
node, the kind of target (`target`) and why it was chosen, the signal and the
pid it killed; `start` restarts every broker this nemesis killed, each even
after another failed, and reports which, with their new pids and each node's
outcome (nemesis.core: a node that failed raises RepairFailed at the end).
The target is a random live node (`kill`), the current leader of a random
key (`kill-leader`), the controller (`kill-controller`), a random majority
(`kill-majority`) or every broker at once (`kill-all`). `pause`/`pause-leader` SIGSTOP a broker and SIGCONT it.
"""

from __future__ import annotations

import random
from typing import Any

from ..control.wait import wait_until
from ..db.core import Unsupported
from .core import HEALED, Op, RepairFailed, finish, healed, leader_of_random_key, pick_nodes, repair_each


class KillNemesis:
    fs = ("kill", "start")

    def __init__(self, db, nodes: list[str], keys: list[str] | None = None, target: str = "random"):
        self.db = db
        self.nodes = list(nodes)
        self.keys = list(keys or [])
        self.target = target
        self.killed: list[str] = []

    def invoke(self, op: Op) -> Any:
        if op["f"] == "kill":
            rng = random.Random(op.get("seed", 0))
            live = [n for n in self.nodes if n not in self.killed]
            kind = {"target": self.target}  # which kind of target: random, leader, controller, majority, all
            if not live:
                return {"nodes": [], **kind, "note": "every node is already down"}
            why: dict[str, Any] = {}
            if self.target == "leader":
                key, target = leader_of_random_key(self.db, self.keys, rng)
                if target is None or target not in live:
                    return {"nodes": [], **kind, "key": key, "note": f"{key} has no live leader to kill"}
                targets, why = [target], {"leader_of": key}
            elif self.target == "controller":
                target = self.db.controller()
                if target is None or target not in live:
                    return {"nodes": [], **kind, "note": "no live controller to kill"}
                targets, why = [target], {"controller": True}
            else:
                targets = pick_nodes(rng, live, len(self.nodes), self.target)
            pids = {}
            for target in targets:
                pids[target] = self.db.kill(target)
                self.killed.append(target)
            return {"nodes": targets, **kind, "signal": "SIGKILL", **why, "pids": pids}
        if op["f"] == "start":
            return self.heal()
        raise ValueError(f"KillNemesis cannot perform {op['f']!r}")

    def heal(self) -> Any:
        pids = {}

        def restart(node: str) -> None:
            if not self.db.running(node):
                pids[node] = self.db.start(node)
            self.db.wait_ready(node)

        outcomes, _ = repair_each(self.killed, restart)
        self.killed = [n for n in self.killed if outcomes[n] != HEALED]
        return finish({"nodes": healed(outcomes), "pids": pids, "outcomes": outcomes})


class PauseNemesis:
    """SIGSTOP a broker (a random one, or the leader of a random key), SIGCONT it later."""

    fs = ("pause", "resume")

    def __init__(self, db, nodes: list[str], keys: list[str] | None = None, target: str = "random"):
        self.db = db
        self.nodes = list(nodes)
        self.keys = list(keys or [])
        self.target = target
        self.paused: list[str] = []

    def invoke(self, op: Op) -> Any:
        if op["f"] == "resume":
            return self.heal()
        if op["f"] != "pause":
            raise ValueError(f"PauseNemesis cannot perform {op['f']!r}")
        rng = random.Random(op.get("seed", 0))
        running = [n for n in self.nodes if n not in self.paused]
        if not running:
            return {"nodes": [], "target": self.target, "note": "every node is already paused"}
        why = {"target": self.target}
        target = rng.choice(running)
        if self.target == "leader" and self.keys:
            key, target = leader_of_random_key(self.db, self.keys, rng)
            why["leader_of"] = key
            if target is None or target not in running:
                return {"nodes": [], **why, "note": f"{key} has no running leader to pause"}
        self.db.pause(target)
        self.paused.append(target)
        return {"nodes": [target], "signal": "SIGSTOP", **why}

    def heal(self) -> Any:
        outcomes, _ = repair_each(self.paused, self.db.resume)
        self.paused = [n for n in self.paused if outcomes[n] != HEALED]
        return finish({"nodes": healed(outcomes), "signal": "SIGCONT", "outcomes": outcomes})


class ClockNemesis:
    """Step the wall clocks of random brokers by up to `max_skew` seconds either way, or strobe them
    (flip between a skew and their usual offset every `period` seconds for `duration` seconds, then
    leave them at the usual offset); reset them.

    The db gives each node's offset file (`clock_file(node)`), which its broker reads through
    libfaketime, and the offset the node started at (`start_offset(node)`, 0 unless the test set
    one), which is where a reset returns it. Offsets in the values are the ones written."""

    fs = ("bump-clock", "reset-clock", "strobe-clock")
    pairs = (("bump-clock", "reset-clock"), ("strobe-clock", None))

    def __init__(self, db, nodes: list[str], max_skew: int = 60, period: float = 1.0, duration: float = 5.0,
                 sleep=None):
        import time

        self.db = db
        self.nodes = list(nodes)
        self.max_skew = max_skew
        # libfaketime rereads the offset file at most once a second (FAKETIME_CACHE_DURATION=1).
        self.period = max(1.0, period)
        self.duration = duration
        self.sleep = sleep or time.sleep
        self.skewed: set[str] = set()

    def _set(self, node: str, seconds: int) -> None:
        from ..control.clock import set_offset

        set_offset(self.db.clock_file(node), seconds)

    def invoke(self, op: Op) -> Any:
        if op["f"] == "reset-clock":
            return self.heal()
        if op["f"] not in ("bump-clock", "strobe-clock"):
            raise ValueError(f"ClockNemesis cannot perform {op['f']!r}")
        rng = random.Random(op.get("seed", 0))
        chosen = sorted(rng.sample(self.nodes, rng.randint(1, len(self.nodes))))
        skews = {node: rng.choice([-1, 1]) * rng.randint(1, self.max_skew) for node in chosen}
        if op["f"] == "bump-clock":
            offsets = {node: self.db.start_offset(node) + skew for node, skew in skews.items()}
            for node, seconds in offsets.items():
                self._set(node, seconds)
                self.skewed.add(node)
            return {"offsets_s": offsets}
        flips = max(1, int(self.duration / self.period))
        for flip in range(flips):
            for node, skew in skews.items():
                self._set(node, self.db.start_offset(node) + (skew if flip % 2 == 0 else 0))
            self.sleep(self.period)
        for node in chosen:
            self._set(node, self.db.start_offset(node))
        return {"nodes": chosen, "skews_s": skews, "period_s": self.period, "flips": flips,
                "offsets_s": {node: self.db.start_offset(node) for node in chosen}}

    def heal(self) -> Any:
        outcomes, _ = repair_each(self.nodes, lambda node: self._set(node, self.db.start_offset(node)))
        reset = sorted(n for n in self.skewed if outcomes[n] == HEALED)
        self.skewed = {n for n in self.skewed if outcomes[n] != HEALED}
        return finish({"offsets_s": {node: self.db.start_offset(node) for node in reset}, "outcomes": outcomes})


class PowerLossNemesis:
    """Cut the power of brokers (a random one, a random majority, or all at once): their processes
    die and what they wrote without fsync is lost (the db's `power_off`); `power-on` mounts their
    disks again and restarts them."""

    fs = ("power-off", "power-on")

    def __init__(self, db, nodes: list[str], target: str = "random"):
        self.db = db
        self.nodes = list(nodes)
        self.target = target
        self.off: list[str] = []

    def invoke(self, op: Op) -> Any:
        if op["f"] == "power-on":
            return self.heal()
        if op["f"] != "power-off":
            raise ValueError(f"PowerLossNemesis cannot perform {op['f']!r}")
        rng = random.Random(op.get("seed", 0))
        on = [n for n in self.nodes if n not in self.off]
        if not on:
            return {"nodes": [], "target": self.target, "note": "every node is already off"}
        targets = pick_nodes(rng, on, len(self.nodes), self.target)
        done = {}
        for node in targets:
            done[node] = self.db.power_off(node)
            self.off.append(node)
        return {"nodes": targets, "target": self.target, "signal": "SIGKILL", "unsynced_lost": True,
                "pids": {n: d["pids"] for n, d in done.items()},
                "unsynced_bytes": {n: d["unsynced_bytes"] for n, d in done.items()}}

    def heal(self) -> Any:
        # Every disk and broker first, then wait for each: they may need one another to serve.
        powered, pids = repair_each(self.off, self.db.power_on)
        ready, _ = repair_each(healed(powered), self.db.wait_ready)
        outcomes = {**powered, **ready}
        self.off = [n for n in self.off if outcomes[n] != HEALED]
        return finish({"nodes": healed(outcomes), "pids": pids, "outcomes": outcomes})


class RollingRestartNemesis:
    """Stop every broker cleanly (SIGTERM: controlled shutdown) and start it again, one at a time,
    in an order the op's seed picks; each waits until the restarted broker serves."""

    fs = ("rolling-restart",)

    def __init__(self, db, nodes: list[str]):
        self.db = db
        self.nodes = list(nodes)

    def invoke(self, op: Op) -> Any:
        if op["f"] != "rolling-restart":
            raise ValueError(f"RollingRestartNemesis cannot perform {op['f']!r}")
        order = random.Random(op.get("seed", 0)).sample(self.nodes, len(self.nodes))
        statuses = {}
        for node in order:
            statuses[node] = self.db.stop(node)
            self.db.start(node)
            self.db.wait_ready(node)
        return {"nodes": order, "signal": "SIGTERM", "exit_status": statuses}

    def heal(self) -> Any:
        def restart(node: str) -> None:
            self.db.start(node)
            self.db.wait_ready(node)

        outcomes, _ = repair_each([n for n in self.nodes if not self.db.running(n)], restart)
        return finish({"nodes": healed(outcomes), "outcomes": outcomes})

def _topic_partition(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


class StaleElectionNemesis:
    """The unclean-election experiments, as a fault and its repair.

    stale-election: `kill-follower` SIGKILLs an in-sync follower of a random
    partition (the stale replica) and waits until the leader drops it from the ISR
    (replica.lag.time.max.ms); writes go on without it. `elect-stale` SIGKILLs every replica still
    in that partition's ISR, starts the stale one first and gives the controller `wait` seconds to
    elect it (only unclean leader election can: its log lacks what was written meanwhile), then
    starts the rest. With unclean election the writes acknowledged while it was away are lost;
    without, the partition waits for an in-sync replica and loses nothing.

    lone-leader (LoneLeaderNemesis): `kill-followers` SIGKILLs every in-sync follower of a random
    partition at once and waits until the ISR is the leader alone, so acks=all needs only the
    leader (unless min.insync.replicas forbids); `elect-follower` SIGKILLs the leader and starts
    first the follower whose log on disk is longest (`log_ends`), as above. The values say which
    nodes, and who led afterwards."""

    fs = ("kill-follower", "elect-stale")
    all_followers = False

    def __init__(self, db, nodes: list[str], keys: list[str], out_of_isr_timeout: float = 60, wait: float = 15):
        self.db = db
        self.nodes = list(nodes)
        self.keys = list(keys)
        self.out_of_isr_timeout = out_of_isr_timeout
        self.wait = wait
        self.stale: tuple[str, list[str]] | None = None  # (key, its stale replicas: the first starts first)
        self.down: list[str] = []

    def invoke(self, op: Op) -> Any:
        if op["f"] == self.fs[0]:
            return self._kill_followers(random.Random(op.get("seed", 0)))
        if op["f"] == self.fs[1]:
            return self._elect_stale()
        raise ValueError(f"StaleElectionNemesis cannot perform {op['f']!r}")

    def _kill_followers(self, rng: random.Random) -> Any:
        if self.stale is not None:
            return {"nodes": [], "note": f"{', '.join(self.stale[1])} already stale in {self.stale[0]}"}
        key, leader = leader_of_random_key(self.db, self.keys, rng)
        topic, partition = _topic_partition(key)
        followers = [n for n in self.db.in_sync_replicas(topic, partition) if n != leader]
        if leader is None or not followers:
            return {"nodes": [], "key": key, "note": f"{key} has no in-sync follower to make stale"}
        stale = rng.sample(followers, len(followers)) if self.all_followers else [rng.choice(followers)]
        pids = {n: self.db.kill(n) for n in stale}
        self.stale, self.down = (key, stale), list(stale)
        seen: dict[str, list[str]] = {}

        def left() -> bool:
            # The ISR the wait saw last is the one reported: asking again after it can fail while
            # brokers die (an Admin call timing out), and wait_until retries such failures itself.
            seen["isr"] = self.db.in_sync_replicas(topic, partition)
            return not set(stale) & set(seen["isr"])

        wait_until(left, self.out_of_isr_timeout, f"{', '.join(stale)} stayed in the ISR of {key} after being killed")
        return {"nodes": stale, "key": key, "leader": leader, "signal": "SIGKILL", "pids": pids, "isr": seen["isr"]}

    def _elect_stale(self) -> Any:
        if self.stale is None:
            return {"nodes": [], "note": "no stale replica to elect"}
        key, stale = self.stale
        topic, partition = _topic_partition(key)
        in_sync = [n for n in self.db.in_sync_replicas(topic, partition) if n not in stale]
        pids = {n: self.db.kill(n) for n in in_sync}
        self.down += in_sync
        first, ends = self._first_to_start(stale, topic, partition)
        self.db.start(first)
        self.db.wait_ready(first)
        try:
            wait_until(lambda: self.db.leader(topic, partition) == first, self.wait, "not elected")
            elected = True
        except TimeoutError:
            elected = False
        led_by = self.db.leader(topic, partition)
        value = {"nodes": in_sync, "key": key, "signal": "SIGKILL", "pids": pids, "started_first": first,
                 "stale_elected": elected, "leader_then": led_by, **({"log_ends": ends} if ends else {})}
        try:
            restarted = self.heal()
        except RepairFailed as exc:
            raise RepairFailed({**value, "restarted": exc.value["nodes"], "outcomes": exc.value["outcomes"]}) from exc
        return {**value, "restarted": restarted["nodes"]}

    def _first_to_start(self, stale: list[str], topic: str, partition: int) -> tuple[str, dict[str, int | None]]:
        """The stale replica to start first, and the log ends read from the stale replicas' disks.

        Of several stale replicas, the one whose log is longest: it holds every record any of
        them holds (a follower's log is a prefix of its leader's), so the election loses only what
        the killed in-sync replicas alone held. Followers killed at once still die a fetch apart,
        and starting the shorter one would also lose writes the other had copied, which were
        acknowledged by two replicas. Ties, and dbs that cannot read a log from disk, keep the
        seeded order."""
        if len(stale) == 1:
            return stale[0], {}
        try:
            ends = {n: self.db.log_end_offset(n, topic, partition) for n in stale}
        except Unsupported:
            return stale[0], {}
        return max(stale, key=lambda n: -1 if ends[n] is None else ends[n]), ends

    def heal(self) -> Any:
        def restart(node: str) -> None:
            if not self.db.running(node):
                self.db.start(node)
            self.db.wait_ready(node)

        outcomes, _ = repair_each(self.down, restart)
        self.down = [n for n in self.down if outcomes[n] != HEALED]
        if not self.down:
            self.stale = None
        return finish({"nodes": healed(outcomes), "outcomes": outcomes})


class LoneLeaderNemesis(StaleElectionNemesis):
    """lone-leader: every in-sync follower of a partition killed at once, the leader left alone
    in the ISR; then the leader killed and a follower started first (see StaleElectionNemesis)."""

    fs = ("kill-followers", "elect-follower")
    all_followers = True
