"""Concurrent histories of a correct broker, with at most one injected fault.

In: a `Recorder` (history lines and the stats both engines must report), a
scenario name (the prefix of its keys), a `random.Random`, the fault to
inject (None for a correct run), the first process number the scenario may
use, and its shape (concurrency, operations, atomic or interleaved effects,
how often clients subscribe, whether txns are drawn, whether the first
operation of each kind completes ok, whether rebalance logs are typed,
whether the group's members process and commit explicitly).
Out: a `Run`: the scenario's keys, the anomaly types the engines must report
for them (exactly), the witnesses of the types a correct history can show
too (exactly, each with its cause), and, per operation, when its writes and
reads took effect (to judge the engines' dependencies).

The broker is an in-memory log per key. Several workers (`concurrency`)
each run one client process; a process runs one operation at a time, but
the operations of different processes overlap: an operation is an `invoke`
line, then the moments at which its effects happen, then its completion
line, and a scheduler interleaves these steps of all workers (and a
nemesis, whose lines the engines only count). The moments are where the
log changes, so every offset is given in the order in which appends really
happened.

Operations (the effects of one operation happen between its lines):
- send of 1-3 values to random keys: `ok` appends every value (in mop order)
  and acknowledges each with its offset; `fail` appends nothing; `info`, or
  an invocation never completed, appends all its values now, later (after
  other operations' effects; at the latest just before the final reads), or
  never, all alike, and retires the process; an `info` send may also be
  partly acknowledged: the broker appended and acknowledged its first
  values before the client gave up, and the completion records their
  offsets (history-format.md), the rest as an `info` send's (in atomic mode
  now or never, so that all its effects keep one moment);
- poll of 1-2 poll mops (consumer poll() calls): each reads, from the
  consumer's position in each key it owns, up to 3 records per key (fewer at
  the log end) and moves past them. `ok` returns
  them; `fail` usually reads nothing, sometimes returns what it read (records
  of a failed poll are evidence, and the consumer moved past them); `info`
  reads nothing and retires the process;
- txn (unless the shape leaves them out: then no operation both sends and
  polls, the stats' `mixed` is 0): 2-4 mops mixing sends and polls, done as
  a client without broker transactions does them: each mop takes effect in
  order. `ok`: all of them, and a poll may return a value the operation
  itself sent earlier; `fail`: refused before any mop took effect, or (half
  the time) aborted after its polls returned records: its sends were never
  written and the client seeks the consumer back to the first offset it
  read of each key, so the next poll reads them again (the engines judge
  its records against the poll chain without moving it); `info`/never: its sends as an `info` send's, its polls read nothing, the
  process retires;
- assign of a random subset of keys, with seek_to_beginning (positions 0) or
  without (a key the consumer holds a position for keeps it, whether it
  held it by assign or subscribe; a new one starts at the log end); leaves
  the consumer group if the process was in it. A refused (`fail`) assign
  changes nothing, as a real client's; an `info` one retires the process;
- subscribe to every key of the scenario: the process joins the scenario's
  consumer group (see below); it names every key, so it ends no poll chain;
- a process that completes `info` (or never completes) is retired, and its
  worker carries on as process old + concurrency, with a fresh consumer.

The consumer group (a simple model of Kafka's cooperative rebalancing with
fenced commits):
- every change of membership (a subscribe, a member's assign, a member's
  crash) starts a new generation, which deals the keys, in a random order,
  round-robin to the sorted members;
- a member learns of the latest generation only inside a poll (each poll
  mop of a txn too), before it fetches: it gives up the keys no longer
  dealt to it, then takes those dealt to it that no one holds (a key moves
  only once its holder gave it up, or ended). Its `rebalance_log` says what
  changed: typed entries (`lost`, `revoked`, `assigned`, the keys that
  changed, as the incremental protocols' callbacks do) or untyped ones (the
  key set after the change). A key it kept keeps its position; one it took
  restarts at the group's committed offset for it, or at 0: every key whose
  position a rebalance moves during an operation is named by an entry of
  that operation's rebalance_log, as a real consumer's is (the simulator
  asserts it). A member with typed logs leaves only by ending, as the
  subscribe workload's members do;
- commits: right after fetching, a member commits its positions
  (probability 0.6), unless the group consumes (below); commits lag, so a
  new owner may re-read records. An expelled member's commits are fenced;
- a consuming group's members instead run `process` operations (`ok`: the
  records their ok polls returned since the last one; `info`: died during
  it, the process ends) and `commit` operations of their positions (`ok`,
  `fail`, or `info`: committed or not, the process ends), in any order, and
  after the final reads a `committed` operation says the group's offsets.
  What repeats and what is passed over is predicted from what really
  happened: duplicate-consumption (a record two ok process operations
  processed) and lost-consumption (a record of the log below the highest
  offset ok commits and the committed operation gave its key, processed by
  no ok or info process operation), each witness exactly;
- holdings (history_analysis/ownership.py) are predicted as the engines
  see them: from the completion of the call whose log gave a key to the
  invocation of the call whose log took it, or of the operation that ended
  the process. Without a fault no two intersect.
So under subscribe a process may skip offsets (its key was read by others
meanwhile) or go back (its own reads were not committed): poll-skip and
nonmonotonic-poll across operations. Inside one operation the engines do
not judge a key its rebalance_log names, so a rebalance shows no int- type.

End of the run: every worker's operation completes, the `info` effects
still pending land or not, the nemesis heals, and the final reads start:
the keys are split among up to `concurrency` workers, each of which assigns
its keys with seek_to_beginning and `"final": true`, its `ok` completion
carrying `end_offsets` (the log end of each key), polls (`"final": true`)
until it has passed every key's end, and assigns again without rewinding
(same `end_offsets`): the ends did not move. Final readers run concurrently.

The engines' rules these predictions follow (issue 14, Jepsen's Kafka
checker; history_analysis/result.py, shared/anomalies.md):
- the log of a key: every record a poll of any outcome returned, and every
  acknowledged send (an `ok` operation's offset, or an `info` send's); a
  value's position (the version order) is the lowest offset the log holds
  it at;
- a poll chain of (process, key) ends only at an `ok` assign or subscribe
  of the process that does not name the key, or an `ok` assign with
  seek_to_beginning naming it; polls of any outcome are its links;
- int-poll-skip / int-nonmonotonic-poll: within one operation, on keys its
  rebalance_log does not name;
- int-send-skip / int-nonmonotonic-send: consecutive sends of one operation
  (any outcome) to a key, both with a position, compared by position;
  nonmonotonic-send: a process's `ok`/`info` operations in order, the
  earlier one's last send against the later one's first, by position;
- G1a and precommitted-read: from operations of any outcome;
- dependencies: writers of any outcome whose values have a position, ww
  between consecutive writers of a key by position, wr from each writer to
  every operation (any outcome) that returned its value; no contraction.

What a correct history shows (`Run.expected` without a fault):
- poll-skip / nonmonotonic-poll from rebalances only (a consumer that
  rejoined the group, or was moved by a rebalance, or assigned a key it
  lost to a rebalance): predicted exactly by following each process's
  poll chain (process, chain epoch, key), each with cause "rebalance";
- int-send-skip: two consecutive sends of one operation to one key with
  another process's append between them (interleaved mode only; an `info`
  send's too, when its values landed apart or were read): no write
  isolation;
- precommitted-read: an `ok` txn that polled a value it had itself sent
  earlier: correct for a client without transactions (each send is committed
  when acknowledged), though the models forbid it;
- nothing else: no unseen, lost-write, uncommitted-read (the final reads read
  every log to its end), duplicate, inconsistent or reused offsets,
  unexpected, G1a, nonmonotonic-send, int-nonmonotonic-send, int-poll-skip,
  int-nonmonotonic-poll.
Cycles: in atomic mode (all effects of an operation at one moment, an
`info` one's possibly after its completion) the moments are a topological
order of every dependency, process and real-time edge, so there is no
cycle of any type. In interleaved mode multi-key sends and txns make G0 and
G1c cycles (Kafka has no write isolation) and their process/real-time
variants; what is stable there is that every dependency the engines derive
is a real order of effects (`Run.effects`). Without txns, a cycle needs a
ww edge (every wr and order edge goes forward in time): only the G0 and
G1c-ww types, which a run without write isolation allows.

Faults (at most one per scenario, injected at a random step of the run):
- "duplicate": the broker appends a second copy of a visible value -> {duplicate};
- "unexpected": the broker appends a value nobody sent -> {unexpected};
- "aborted": the next send is reported failed, yet its values are appended -> {G1a};
- "lost": the next acknowledged value (of an ok send, or acknowledged to an
  info send) never becomes visible (readers step over its offset) ->
  {unseen}, plus lost-write when a visible record lies above it, plus the
  chain witnesses (poll-skip, int-poll-skip) that step over its offset,
  cause "lost"; the final reads are short of the end when it is the last
  record of its key (and unseen alone then proves nothing: the run is unknown);
- "truncated": just before the final reads, a key loses its last record,
  acknowledged (by an ok send, or to an info send); the final reads are
  told the shorter end -> {lost-write}, plus uncommitted-read if an ok poll
  had read it, else unseen;
- "inconsistent": a fresh process's failed send of w, and another fresh
  process's poll returning w at an existing offset -> {inconsistent-offsets,
  G1a} (a failed poll's records are evidence), plus uncommitted-read when
  the poll is ok. That send never took effect, so the engines' dependencies
  through it are not real orders (`Run.fictional`), and in atomic mode it
  may close a G0 cycle (a write placed in the past);
- "int-skip" / "int-rewind": a fresh process's ok poll returns offsets o, o+2
  (o+1 exists) / o+1, o of a key -> {int-poll-skip} / {int-nonmonotonic-poll};
- "int-send-reorder": a fresh process's ok send of two values to a key,
  appended and acknowledged in reverse order -> {int-nonmonotonic-send};
- "expelled" (typed logs): a member between operations is paused while its
  membership expires; the group deals its keys to the others, and it takes
  no step until one of them is taken (or a few hundred steps passed). Its
  next poll logs them `lost` and it joins again -> {ownership-overlap},
  every pair of intersecting holdings predicted, when another member's poll
  took a key before that poll began (else not injected); what both
  processed may show as duplicate-consumption.
A fault that finds nothing to act on (no visible record yet, say) is not
injected (`Run.injected` is False) and the run is judged as a correct one.
Not here: "write-cycle" (G0 needs no fault in interleaved mode, and the
cycle types are being split), "int-send-skip" (a correct interleaved run
shows it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterator

from .histories import Builder

FAULTS = (None, "duplicate", "unexpected", "aborted", "lost", "truncated", "inconsistent", "int-skip",
          "int-rewind", "int-send-reorder", "expelled")
# What each fault must add, whatever else happens (the rest is decided as the run goes).
FAULT_TYPES = {
    "duplicate": {"duplicate"}, "unexpected": {"unexpected"}, "aborted": {"G1a"}, "lost": {"unseen"},
    "truncated": {"lost-write"}, "inconsistent": {"inconsistent-offsets"}, "int-skip": {"int-poll-skip"},
    "int-rewind": {"int-nonmonotonic-poll"}, "int-send-reorder": {"int-nonmonotonic-send"},
    "expelled": {"ownership-overlap"},
}
# What else a fault may add, depending on how the run went (see the module docstring): with
# FAULT_TYPES, every type a fault can show beyond those a correct run shows.
FAULT_EXTRA = {
    "lost": {"lost-write", "poll-skip", "int-poll-skip"}, "truncated": {"uncommitted-read", "unseen"},
    "inconsistent": {"G1a", "uncommitted-read"},
}
# Witness types predicted one by one (`Run.witnesses`), with how to compare a found witness.
CHAIN_TYPES = ("poll-skip", "nonmonotonic-poll")
INT_POLL_TYPES = ("int-poll-skip", "int-nonmonotonic-poll")
CONSUMPTION_TYPES = ("duplicate-consumption", "lost-consumption")
PREDICTED = (*CHAIN_TYPES, *INT_POLL_TYPES, "int-send-skip", "precommitted-read", *CONSUMPTION_TYPES,
             "ownership-overlap")
PROCESS_SPAN = 100_000  # process numbers of one scenario: base .. base + PROCESS_SPAN - 1


def witness_id(kind: str, w: dict) -> tuple:
    """What identifies a witness of a PREDICTED type, as the engines write it."""
    if kind in CHAIN_TYPES:
        return (w["process"], w["key"], w["prev_offset"], w["next_offset"], tuple(w["ops"]))
    if kind in (*INT_POLL_TYPES, "int-send-skip"):
        return (w["process"], w["key"], w["op"], w["prev_offset"], w["next_offset"])
    if kind == "duplicate-consumption":
        return (w["key"], w["offset"], tuple(w["processes"]), tuple(w["ops"]))
    if kind == "lost-consumption":
        return (w["key"], w["offset"], w["value"], w["committed"], w["committed_op"])
    if kind == "ownership-overlap":
        return (w["key"], *((h["process"], h["since_op"], h["until_op"]) for h in w["held"]))
    return (w["process"], w["key"], w["op"], w["value"], w["offset"])  # precommitted-read


class Recorder:
    """History lines (through a Builder: index and time) and the stats the engines must report."""

    def __init__(self, b: Builder | None = None):
        self.b = b or Builder()
        # `mixed`: client operations whose mops both send and poll.
        self.stats: dict[str, Any] = {"ops": 0, "ok": 0, "fail": 0, "info": 0, "mixed": 0}
        self.by_f: dict[str, dict[str, int]] = {}

    @property
    def lines(self) -> list[dict]:
        return self.b.lines

    def expected_stats(self) -> dict[str, Any]:
        return {**self.stats, **({"by_f": self.by_f} if self.by_f else {})}

    def invoke(self, process, f: str, **fields) -> int:
        if process != "nemesis":
            self.stats["ops"] += 1
        return self.b.line(process, "invoke", f, **fields)

    def complete(self, process, type_: str, f: str, **fields) -> int:
        if process != "nemesis":
            self._counted(f, type_, fields.get("mops"))
        return self.b.line(process, type_, f, **fields)

    def never(self, f: str, mops: list[dict] | None) -> None:
        """An invocation the history never completes: the readers count it as info (with its
        invocation's mops)."""
        self._counted(f, "info", mops)

    def _counted(self, f: str, type_: str, mops: list[dict] | None) -> None:
        self.stats[type_] += 1
        self.stats["mixed"] += {"send", "poll"} <= {m["f"] for m in mops or []}
        n = self.by_f.setdefault(f, {"invoked": 0, "ok": 0})
        n["invoked"] += 1
        n["ok"] += type_ == "ok"


@dataclass
class Entry:
    value: int
    writer: "Op | None"
    visible: bool = True
    # Acknowledged at its offset: to an ok operation, or to an info send that recorded it; in the
    # engines' log then, read or not.
    acked: bool = False
    read_ok: bool = False  # returned by an ok poll
    read: bool = False  # returned by any poll


@dataclass
class Op:
    process: int
    f: str
    invoke: int = -1
    index: int = -1  # its completion's index; the invocation's when it never completes
    type: str = "invoke"
    first_append: dict[str, int] = field(default_factory=dict)  # key -> moment of its first append there
    last_read: dict[str, int] = field(default_factory=dict)  # key -> moment of its last fetch returning it
    rebalances: list[dict] = field(default_factory=list)  # its rebalance_log entries
    sent: set = field(default_factory=set)  # (key, value)
    sends: list = field(default_factory=list)  # (key, value) in mop order, whatever the outcome
    returned: set = field(default_factory=set)  # (key, value) its polls returned, whatever the outcome
    # What its rebalances did, in order: ("taken" | "released", key).
    handovers: list = field(default_factory=list)


@dataclass
class Consumer:
    process: int
    mode: str = "none"  # "assign" | "subscribe"
    positions: dict[str, int] = field(default_factory=dict)
    # Per key, the engines' chain epoch: how many ok assigns (or subscribes) of the process dropped
    # the key or rewound it (seek_to_beginning naming it). Nothing else ends a poll chain.
    epoch: dict = field(default_factory=dict)
    gen: int = 0  # the last generation of the group it went through
    keys: frozenset = frozenset()
    # Keys whose position a rebalance (or an assign of a key the consumer had lost to one) reset,
    # not read since.
    reset: set = field(default_factory=set)
    chain: dict = field(default_factory=dict)  # (epoch, key) -> (op index, last offset read)
    unprocessed: list = field(default_factory=list)  # records its ok polls returned, not processed yet


@dataclass
class Record:
    key: str
    offset: int
    value: int
    after_reset: bool  # the first record of its key fetched after a rebalance reset its position


@dataclass
class Run:
    name: str
    keys: list[str]
    fault: str | None
    injected: bool
    expected: set[str]
    # type -> {witness_id: cause}, for the PREDICTED types
    witnesses: dict[str, dict[tuple, str]]
    detail: dict
    atomic: bool
    # op index -> Op: when each operation's writes and reads took effect
    effects: dict[int, Op]
    # the log of each key as the final reads saw it: (end offset, values)
    final_logs: dict[str, tuple[int, list[int]]]
    first_process: int
    # Operations whose writes the engines see though they never took effect (the failed send of
    # the "inconsistent" fault): dependencies through them are not orders of effects.
    fictional: set[int] = field(default_factory=set)
    # The dependencies the engines must derive for the scenario's keys (src, dst, ww | wr, key),
    # and the operations they must list as nodes (result.DEPENDENCIES).
    dependencies: set[tuple] = field(default_factory=set)
    nodes: set[int] = field(default_factory=set)


class _Group:
    def __init__(self, keys: list[str], rnd: random.Random):
        self.keys, self.rnd = keys, rnd
        self.members: set[int] = set()
        self.gen = 0
        self.assignments: list[dict[int, frozenset]] = [{}]
        self.committed: dict[str, int] = {}
        # Who holds each key, as its consumer believes (from the call whose log gave it the key to
        # the call whose log took it away): the coordinator gives a key to its next owner only once
        # the holder gave it up (or left the group), as the cooperative protocols do.
        self.holder: dict[str, int | None] = {k: None for k in keys}
        # Keys the coordinator took from a member without its knowing (its membership expired):
        # the member holds them, and fetches them, until its next poll's log says they were lost.
        self.expelled: dict[int, set[str]] = {}

    def rebalance(self) -> None:
        members = sorted(self.members)
        keys = list(self.keys)
        self.rnd.shuffle(keys)
        deal: dict[int, set] = {m: set() for m in members}
        for i, k in enumerate(keys):
            if members:
                deal[members[i % len(members)]].add(k)
        self.gen += 1
        self.assignments.append({m: frozenset(ks) for m, ks in deal.items()})

    def join(self, process: int) -> None:
        self.members.add(process)
        self.rebalance()

    def leave(self, process: int) -> None:
        for k, holder in self.holder.items():
            if holder == process:
                self.holder[k] = None
        self.expelled.pop(process, None)
        if process in self.members:
            self.members.discard(process)
            self.rebalance()

    def expel(self, process: int) -> set[str]:
        """The member's membership expires (its session timed out while it was paused): the group
        deals its keys to the others while it still holds them. Returns them."""
        keys = {k for k, holder in self.holder.items() if holder == process}
        for k in keys:
            self.holder[k] = None
        self.expelled[process] = keys
        self.members.discard(process)
        self.rebalance()
        return keys


class _Worker:
    def __init__(self, number: int, process: int):
        self.number = number
        self.consumer = Consumer(process)
        self.task: Iterator | None = None


class Scenario:
    def __init__(self, rec: Recorder, name: str, rnd: random.Random, fault: str | None, first_process: int,
                 concurrency: int = 3, ops: int = 30, atomic: bool = False, subscribe: float = 0.3,
                 txns: bool = True, first_ok: bool = False, typed: bool = False, consume: bool = False):
        self.rec, self.rnd, self.fault = rec, rnd, fault
        self.name, self.first_process = name, first_process
        self.concurrency, self.ops, self.atomic, self.subscribe = concurrency, ops, atomic, subscribe
        # txns: whether operations that both send and poll are drawn; first_ok: the first operation
        # of each kind completes ok (so that no kind the clients issued went without success, which
        # would make the verdict unknown).
        self.txns, self.first_ok = txns, first_ok
        # typed: rebalance_log entries say what changed (assigned / revoked / lost keys), as the
        # incremental protocols' callbacks do, instead of the key set after each change; consume:
        # the group's members process what they polled and commit explicitly (process and commit
        # operations), instead of committing right after fetching.
        self.typed, self.consume = typed, consume
        self.kinds_started: set[str] = set()
        self.fictional: set[int] = set()
        self.extra_facts: list[tuple[str, int, int]] = []  # (key, offset, value) polls returned off the log
        self.dropped: list[tuple[str, int, Entry]] = []  # (key, offset, entry) cut from the log's tail
        self.keys = [f"{name}-t/{i}" for i in range(rnd.randint(1, 4))]
        self.log: dict[str, list[Entry]] = {k: [] for k in self.keys}
        self.group = _Group(self.keys, rnd)
        self.moment = 0
        self.next_value = 1
        self.fresh = first_process + PROCESS_SPAN // 2  # processes of injected operations
        self.pending: list[tuple[Op, list[tuple[str, int]]]] = []  # info effects not landed yet
        self.effects: dict[int, Op] = {}
        self.witnesses: dict[str, dict[tuple, str]] = {t: {} for t in PREDICTED}
        self.expected: set[str] = set()
        self.detail: dict = {}
        self.injected = False
        self.fault_armed = False  # aborted / lost: waiting for the operation to act on
        self.fault_due = False  # waiting for something to act on
        self.stall: dict | None = None  # an expelled member, paused until its key has a new holder
        self.workers: list[_Worker] = []
        self.processed: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (key, offset) -> [(op, process)] ok
        self.maybe_processed: set[tuple[str, int]] = set()  # by ok or info process operations
        self.commits: list[tuple[int, dict[str, int]]] = []  # (op, offsets) of ok commit / committed operations
        # (key, process, since op, until op, until invocation): a holding as the engines see it, from
        # the call whose log gave the key to the call whose log took it or that ended the process.
        self.holdings: list[tuple[str, int, int, int | None, float]] = []
        self.held_since: dict[tuple[int, str], int] = {}  # (process, key) -> the op whose log gave it
        self.last_op: dict[int, int] = {}  # process -> its latest operation

    # --- the broker ------------------------------------------------------

    def tick(self) -> int:
        self.moment += 1
        return self.moment

    def value(self) -> int:
        self.next_value += 1
        return self.next_value - 1

    def append(self, key: str, value: int, op: Op | None, acked: bool = False) -> int:
        t = self.tick()
        entry = Entry(value, op, acked=acked)
        if acked and self.fault == "lost" and self.fault_armed:
            entry.visible = False
            self.fault_armed = False
            self.injected = True
            self.detail = {"key": key, "value": value, "offset": len(self.log[key])}
        self.log[key].append(entry)
        if op is not None:
            op.first_append.setdefault(key, t)
        return len(self.log[key]) - 1

    def sync(self, c: Consumer, op: Op) -> None:
        """A member catches up with the group (inside a poll, before fetching): it gives up the keys
        the latest generation took from it (or that were taken without its knowing: lost), then
        takes those it was given that no one holds any more."""
        g = self.group
        if c.mode != "subscribe":
            return
        held = set(c.keys)
        # An expelled member learns that it lost its keys, and joins the group again.
        expelled = g.expelled.pop(c.process, None)
        lost = (expelled or set()) & held
        if expelled is not None:
            g.join(c.process)
        target = set(g.assignments[-1].get(c.process, frozenset()))
        revoked = (held - target) - lost
        for k in lost | revoked:
            if g.holder[k] == c.process:
                g.holder[k] = None
            del c.positions[k]
            op.handovers.append(("released", k))
        kept = held - lost - revoked
        gained = {k for k in target - kept if g.holder[k] is None}
        for k in gained:
            g.holder[k] = c.process
            c.positions[k] = g.committed.get(k, 0)
            c.reset.add(k)
            op.handovers.append(("taken", k))
        now = kept | gained
        if self.typed:
            op.rebalances += [{"type": t, "keys": sorted(ks)} for t, ks in
                              (("lost", lost), ("revoked", revoked), ("assigned", gained)) if ks]
        elif now != held:
            op.rebalances.append({"keys": sorted(now)})
        named = {k for e in op.rebalances for k in e["keys"]}
        for k in gained | lost | revoked:
            # The operation's rebalance_log names every key whose position a rebalance moved.
            assert k in named or not self.typed and k not in now, (c.process, k, op.rebalances)
        c.keys = frozenset(now)

    def fetch(self, c: Consumer, op: Op, most: int = 3) -> list[Record]:
        self.sync(c, op)
        t = self.tick()
        out = []
        for k in self.rnd.sample(sorted(c.positions), len(c.positions)):
            pos = c.positions[k]
            end = min(pos + self.rnd.randint(0, most), len(self.log[k]))
            got = [Record(k, o, self.log[k][o].value, False) for o in range(pos, end) if self.log[k][o].visible]
            c.positions[k] = end
            if got:
                got[0].after_reset = k in c.reset
                c.reset.discard(k)
                op.last_read[k] = t
                op.returned |= {(k, r.value) for r in got}
            out += got
        if c.mode == "subscribe" and self.rnd.random() < 0.6 and not self.consume \
                and not self.group.expelled.get(c.process):  # an expelled member's commit is fenced
            for k in c.keys:
                self.group.committed[k] = c.positions[k]
        return out

    # --- what the engines will find in a process's records -----------------

    def observe(self, c: Consumer, op: Op, records: list[Record], ok: bool, moves_chain: bool = True) -> None:
        """Follow the engines' poll chains (process, epoch, key) over an operation's records (of any
        outcome), predicting their chain witnesses, and the int- poll witnesses on the keys its
        rebalance_log does not name; mark what was read. A rolled-back transaction's records
        (`moves_chain` false) are judged against the chain but leave it where it was."""
        rebalanced = {k for e in op.rebalances for k in e["keys"]}
        last_in_op: dict[str, Record] = {}
        for r in records:
            e = self.log[r.key][r.offset]
            e.read = True
            e.read_ok |= ok
            prev = last_in_op.get(r.key)
            if prev is not None:
                a, b = prev.offset, r.offset
                kind = "int-nonmonotonic-poll" if b <= a else "int-poll-skip" if b > a + 1 else None
                if kind and r.key not in rebalanced:
                    self.witnesses[kind][(c.process, r.key, op.index, a, b)] = self.cause(r, a, b, op, False)
            else:
                before = c.chain.get((c.epoch.get(r.key, 0), r.key))
                if before is not None:
                    prev_op, a = before
                    b = r.offset
                    kind = "nonmonotonic-poll" if b <= a else "poll-skip" if b > a + 1 else None
                    if kind:
                        self.witnesses[kind][(c.process, r.key, a, b, (prev_op, op.index))] = \
                            self.cause(r, a, b, op, True)
            last_in_op[r.key] = r
        for k, r in last_in_op.items():
            if moves_chain:
                c.chain[(c.epoch.get(k, 0), k)] = (op.index, r.offset)

    def cause(self, r: Record, a: int, b: int, op: Op, chain: bool) -> str:
        # A moved position shows across operations only: inside one, the rebalance_log names the key.
        if r.after_reset and chain:
            return "rebalance"
        if self.fault == "lost" and self.detail.get("key") == r.key and a < self.detail["offset"] < b:
            return "lost"
        if op.process >= self.first_process + PROCESS_SPAN // 2:
            return "fault"
        return "unexplained"  # a bug of this generator: the test fails on it

    def version_order(self) -> tuple[dict[tuple, int], dict[str, list[int]]]:
        """What the engines know of the logs at the end: each (key, value)'s position (the lowest
        offset the log holds it at) and each key's known offsets, sorted. The log: what polls of
        any outcome returned, and acknowledged sends."""
        pos: dict[tuple, int] = {}
        offsets: dict[str, set[int]] = {k: set() for k in self.keys}
        for k, o, v in self.facts():
            pos[(k, v)] = min(pos.get((k, v), o), o)
            offsets[k].add(o)
        return pos, {k: sorted(os) for k, os in offsets.items()}

    def predict_dependencies(self) -> tuple[set[tuple], set[int]]:
        """The engines' dependencies (Jepsen's writer-of, readers-of, ww-graph, wr-graph), from what
        each operation sent and returned: a writer is an operation of any outcome that sent a value
        with a position, placed in a key at the lowest position of its values there; ww joins
        consecutive writers of a key (by position, then operation; a writer whose position is
        an offset that holds another value too is left out), wr each writer of a value to
        every other operation (any outcome) that returned it. No operation is passed through."""
        pos, _ = self.version_order()
        held: dict[tuple, set[int]] = {}  # (key, offset) -> the values the log holds there
        for k, o, v in self.facts():
            held.setdefault((k, o), set()).add(v)
        position: dict[tuple, int] = {}
        writers: dict[tuple, set[int]] = {}
        for op in self.effects.values():
            for k, v in op.sends:
                if (k, v) in pos:
                    writers.setdefault((k, v), set()).add(op.index)
                    at = pos[(k, v)]
                    position[(k, op.index)] = min(position.get((k, op.index), at), at)
        position = {(k, i): at for (k, i), at in position.items() if len(held[(k, at)]) == 1}
        edges = set()
        for k in self.keys:
            ws = sorted((at, i) for (key, i), at in position.items() if key == k)
            edges |= {(a, b, "ww", k) for (_, a), (_, b) in zip(ws, ws[1:])}
        for op in self.effects.values():
            for k, v in op.returned:
                edges |= {(w, op.index, "wr", k) for w in writers.get((k, v), ()) if w != op.index}
        nodes = {i for ws in writers.values() for i in ws} | {op.index for op in self.effects.values() if op.returned}
        return edges, nodes

    def facts(self) -> list[tuple[str, int, int]]:
        """(key, offset, value) of the log: what polls of any outcome returned, and acknowledged sends."""
        facts = [(k, o, e.value) for k in self.keys for o, e in enumerate(self.log[k]) if e.read or e.acked]
        facts += [(k, o, e.value) for k, o, e in self.dropped if e.read or e.acked]
        return facts + self.extra_facts

    def predict_sends(self) -> None:
        """int-send-skip: consecutive sends of one operation (any outcome) to a key, both with a
        position, with a known offset strictly between their positions: another operation's
        append landed between them (no write isolation). Positions come from the version order,
        so an info or failed operation's sends count where polls returned them."""
        pos, offsets = self.version_order()
        for op in self.effects.values():
            by_key: dict[str, list[int]] = {}
            for k, v in op.sends:
                by_key.setdefault(k, []).append(v)
            for k, vs in by_key.items():
                for v1, v2 in zip(vs, vs[1:]):
                    a, b = pos.get((k, v1)), pos.get((k, v2))
                    if a is None or b is None:
                        continue
                    if b > a + 1 and any(a < o < b for o in offsets[k]):
                        self.witnesses["int-send-skip"][(op.process, k, op.index, a, b)] = "interleaved"

    # --- client operations: generators, one step per effect ----------------

    def retire(self, w: _Worker) -> None:
        """The process ended (its last operation is `info`, or never completed): it holds nothing past
        that operation's invocation, and its worker goes on as a fresh process."""
        c = w.consumer
        last = self.effects[self.last_op[c.process]]
        for k in sorted(k for p, k in self.held_since if p == c.process):
            self.release(c.process, k, last)
        self.group.leave(c.process)
        w.consumer = Consumer(c.process + self.concurrency)

    def release(self, process: int, key: str, op: Op) -> None:
        self.holdings.append((key, process, self.held_since.pop((process, key)), op.index, op.invoke))

    def finish(self, op: Op, type_: str, f: str, **fields) -> None:
        op.type = type_
        if type_ == "never":
            op.index = op.invoke
            self.rec.never(f, fields.get("mops"))
        else:
            op.index = self.rec.complete(op.process, type_, f, **fields)
        self.effects[op.index] = op
        self.last_op[op.process] = op.index
        # Held from the completion of the call that gave the key (none if the same call took it back).
        given = set()
        for what, k in op.handovers:
            if what == "taken":
                given.add(k)
            else:
                given.discard(k)
                if (op.process, k) in self.held_since:
                    self.release(op.process, k, op)
        for k in given:
            self.held_since.setdefault((op.process, k), op.index)

    def outcome(self, f: str, outcomes: list[str], weights: list[int]) -> str:
        """How an operation of kind f completes (with `first_ok`, the first of its kind: ok)."""
        first = f not in self.kinds_started
        self.kinds_started.add(f)
        return "ok" if first and self.first_ok else self.rnd.choices(outcomes, weights)[0]

    def indeterminate(self, op: Op, sends: list[tuple[str, int]], later: bool = True) -> Iterator:
        """The sends of an info (or never completed) operation: all now, all later, or none."""
        when = self.rnd.choice(["now", "later", "never"] if later else ["now", "never"])
        if when == "now":
            for i, (k, v) in enumerate(sends):
                if i and not self.atomic:
                    yield
                self.append(k, v, op)
        elif when == "later" and sends:
            self.pending.append((op, sends))

    def send_op(self, w: _Worker) -> Iterator:
        c = w.consumer
        sends = [(self.rnd.choice(self.keys), self.value()) for _ in range(self.rnd.randint(1, 3))]
        outcome = self.outcome("send", ["ok", "fail", "info", "never"], [70, 10, 12, 8])
        aborted = self.fault == "aborted" and self.fault_armed
        if aborted:
            outcome, self.fault_armed, self.injected = "fail", False, True
            self.detail = {"values": [(k, v) for k, v in sends]}
        # An info send may be partly acknowledged: its first `acked` values were appended and
        # acknowledged before the client gave up, and its completion records their offsets.
        acked = self.rnd.randint(1, len(sends)) if outcome == "info" and self.rnd.random() < 0.4 else 0
        op = Op(c.process, "send", sent=set(sends), sends=list(sends))
        op.invoke = self.rec.invoke(c.process, "send", mops=[{"f": "send", "key": k, "value": v} for k, v in sends])
        yield
        offsets: list[int | None] = [None] * len(sends)
        if outcome == "ok" or aborted:
            for i, (k, v) in enumerate(sends):
                if i and not self.atomic:
                    yield
                offsets[i] = self.append(k, v, op, acked=outcome == "ok")
            yield
        elif outcome in ("info", "never"):
            for i, (k, v) in enumerate(sends[:acked]):
                if i and not self.atomic:
                    yield
                offsets[i] = self.append(k, v, op, acked=True)
            # In atomic mode the rest lands with the acknowledged ones or never: one moment.
            yield from self.indeterminate(op, sends[acked:], later=not (acked and self.atomic))
            yield
        done = [{"f": "send", "key": k, "value": v, "offset": offsets[i] if outcome == "ok" or i < acked else None}
                for i, (k, v) in enumerate(sends)]
        self.finish(op, outcome, "send", mops=done)
        if outcome in ("info", "never"):
            self.retire(w)

    def poll_op(self, w: _Worker, final: bool = False, most: int = 3) -> Iterator:
        c = w.consumer
        outcome = self.rnd.choices(["ok", "fail", "info"], [90, 10, 0])[0] if final else \
            self.outcome("poll", ["ok", "fail", "info"], [85, 10, 5])
        returns = outcome == "ok" or (outcome == "fail" and not final and self.rnd.random() < 0.3)
        calls = 1 if final else self.rnd.choices([1, 2], [80, 20])[0]
        op = Op(c.process, "poll")
        op.invoke = self.rec.invoke(c.process, "poll", mops=[{"f": "poll"}] * calls, final=final or None)
        yield
        fetched: list[list[Record]] = []
        for i in range(calls):
            if i and not self.atomic:
                yield
            fetched.append(self.fetch(c, op, most) if returns else [])
        yield
        if outcome == "info":
            self.finish(op, "info", "poll", mops=[{"f": "poll"}] * calls)
            self.retire(w)
            return
        done = [{"f": "poll", "records": [{"key": r.key, "offset": r.offset, "value": r.value} for r in got]}
                for got in fetched]
        self.finish(op, outcome, "poll", mops=done, final=final or None,
                    rebalance_log=op.rebalances or None)
        self.observe(c, op, [r for got in fetched for r in got], outcome == "ok")
        if outcome == "ok":
            self.to_process(c, [r for got in fetched for r in got])

    def txn_op(self, w: _Worker) -> Iterator:
        c = w.consumer
        n = self.rnd.randint(2, 4)
        kinds = ["send", "poll"] + [self.rnd.choice(["send", "poll"]) for _ in range(n - 2)]
        self.rnd.shuffle(kinds)
        mops = [("send", self.rnd.choice(self.keys), self.value()) if kind == "send" else ("poll",) for kind in kinds]
        sends = [(m[1], m[2]) for m in mops if m[0] == "send"]
        outcome = self.outcome("txn", ["ok", "fail", "info", "never"], [75, 8, 10, 7])
        op = Op(c.process, "txn", sent=set(sends), sends=sends)
        op.invoke = self.rec.invoke(c.process, "txn", mops=[
            {"f": "send", "key": m[1], "value": m[2]} if m[0] == "send" else {"f": "poll"} for m in mops])
        yield
        if outcome == "ok":
            done, records = [], []
            for i, m in enumerate(mops):
                if i and not self.atomic:
                    yield
                if m[0] == "send":
                    o = self.append(m[1], m[2], op, acked=True)
                    done.append({"f": "send", "key": m[1], "value": m[2], "offset": o})
                else:
                    done.append(self.poll_mop(c, op, records))
            yield
            self.finish(op, "ok", "txn", mops=done, rebalance_log=op.rebalances or None)
            self.observe(c, op, records, True)
            self.to_process(c, records)
            for r in records:
                if (r.key, r.value) in op.sent:
                    self.witnesses["precommitted-read"][(op.process, r.key, op.index, r.value, r.offset)] = \
                        "own write"
            return
        if outcome == "fail" and self.rnd.random() < 0.5:
            yield from self.aborted_after_polling(c, op, mops)
            return
        if outcome in ("info", "never"):
            yield from self.indeterminate(op, sends)
        yield
        done = [{"f": "send", "key": m[1], "value": m[2], "offset": None} if m[0] == "send" else {"f": "poll"}
                for m in mops]
        self.finish(op, outcome, "txn", mops=done)
        if outcome in ("info", "never"):
            self.retire(w)

    def poll_mop(self, c: Consumer, op: Op, records: list[Record]) -> dict:
        """One poll micro-operation of a transaction: fetch, add what came to `records`, and return
        the completed mop."""
        got = self.fetch(c, op)
        records += got
        return {"f": "poll", "records": [{"key": r.key, "offset": r.offset, "value": r.value} for r in got]}

    def aborted_after_polling(self, c: Consumer, op: Op, mops: list[tuple]) -> Iterator:
        """A transaction that polled, then aborted: its records are in the history, its sends were
        never written, and the client seeks the consumer back to the first offset it read of each
        key (the workload's rewind), so the next poll reads them again. The engines judge its
        records against the poll chain without moving the chain (Jepsen's txn abort semantics)."""
        done, records = [], []
        for m in mops:
            if m[0] == "send":
                done.append({"f": "send", "key": m[1], "value": m[2], "offset": None})
            else:
                done.append(self.poll_mop(c, op, records))
        yield
        self.finish(op, "fail", "txn", mops=done, rebalance_log=op.rebalances or None)
        self.observe(c, op, records, False, moves_chain=False)
        firsts: dict[str, Record] = {}
        for r in records:
            firsts.setdefault(r.key, r)
        for k, r in firsts.items():
            if k in c.positions:
                c.positions[k] = r.offset
                if r.after_reset:
                    c.reset.add(k)

    def to_process(self, c: Consumer, records: list[Record]) -> None:
        """What an ok poll gave a member of a consuming group, for its application to process."""
        if self.consume and c.mode == "subscribe":
            c.unprocessed += records

    def process_op(self, w: _Worker) -> Iterator:
        """The application processes what its polls gave it: `ok`, all of it; `info`, it died
        during the processing (some may have been processed) and the process ends."""
        c = w.consumer
        records, c.unprocessed = c.unprocessed, []
        outcome = self.outcome("process", ["ok", "info"], [92, 8])
        op = Op(c.process, "process")
        op.invoke = self.rec.invoke(c.process, "process")
        yield
        self.finish(op, outcome, "process",
                    processed=[{"key": r.key, "offset": r.offset, "value": r.value} for r in records])
        for r in records:
            self.maybe_processed.add((r.key, r.offset))
            if outcome == "ok":
                self.processed.setdefault((r.key, r.offset), {}).setdefault(op.index, c.process)
        if outcome == "info":
            self.retire(w)

    def commit_op(self, w: _Worker) -> Iterator:
        """The member commits its positions for the group: `ok`, committed; `fail`, refused (always,
        for a member whose membership expired: the coordinator fences its generation); `info`,
        unknown (committed or not) and the process ends."""
        c = w.consumer
        offsets = {k: c.positions[k] for k in sorted(c.keys)}
        fenced = bool(self.group.expelled.get(c.process))
        outcome = "fail" if fenced else self.outcome("commit", ["ok", "fail", "info"], [85, 10, 5])
        op = Op(c.process, "commit")
        op.invoke = self.rec.invoke(c.process, "commit")
        yield
        if outcome == "ok" or outcome == "info" and self.rnd.random() < 0.5:
            self.group.committed.update(offsets)
        self.finish(op, outcome, "commit", offsets=offsets)
        if outcome == "ok":
            self.commits.append((op.index, offsets))
        if outcome == "info":
            self.retire(w)

    def committed_op(self, process: int) -> Iterator:
        """After the final reads: the group's committed offsets, as the broker says them."""
        op = Op(process, "committed")
        op.invoke = self.rec.invoke(process, "committed", final=True)
        yield
        offsets = dict(sorted(self.group.committed.items()))
        self.finish(op, "ok", "committed", final=True, offsets=offsets)
        self.commits.append((op.index, offsets))

    def assign_op(self, w: _Worker, keys: list[str] | None = None, seek: bool | None = None,
                  final: bool = False) -> Iterator:
        c = w.consumer
        keys = keys or sorted(self.rnd.sample(self.keys, self.rnd.randint(1, len(self.keys))))
        seek = self.rnd.random() < 0.4 if seek is None else seek
        outcome = "ok" if final else self.outcome("assign", ["ok", "fail", "info"], [90, 5, 5])
        op = Op(c.process, "assign")
        fields = {"keys": keys, "seek_to_beginning": True if seek else None, "final": final or None}
        op.invoke = self.rec.invoke(c.process, "assign", **fields)
        yield
        ends = None
        # Only an ok assign changes the consumer (a refused one leaves its positions as they were).
        if outcome == "ok":
            self.group.leave(c.process)
            old = c.positions
            # A key it holds a position for keeps it (by assign or subscribe alike; the poll chain
            # goes on); one it lost to a rebalance, or never had, starts at the log end (the chain
            # goes on too, but its position moved: a rebalance took the key away).
            fresh = {k for k in keys if not seek and k not in old}
            c.mode, c.keys = "assign", frozenset(keys)
            c.reset = (c.reset & set(keys) | fresh) if not seek else set()
            c.positions = {k: 0 if seek else old.get(k, len(self.log[k])) for k in keys}
            # The chains it ends: every key the assign does not name, and with seek_to_beginning
            # every key it names.
            for k in self.keys:
                if seek or k not in keys:
                    c.epoch[k] = c.epoch.get(k, 0) + 1
            if final:
                ends = {k: len(self.log[k]) for k in keys}
        yield
        self.finish(op, outcome, "assign", **fields, end_offsets=ends)
        if outcome == "info":
            self.retire(w)

    def subscribe_op(self, w: _Worker) -> Iterator:
        c = w.consumer
        outcome = self.outcome("subscribe", ["ok", "fail", "info"], [90, 5, 5])
        op = Op(c.process, "subscribe")
        # It names every key of the scenario: it ends no poll chain (the positions a rebalance gives
        # show as poll-skip or nonmonotonic-poll).
        op.invoke = self.rec.invoke(c.process, "subscribe", keys=list(self.keys))
        yield
        if outcome == "ok":
            if c.process in self.group.members or c.process in self.group.expelled:
                self.group.rebalance()  # (an expelled member learns it at its next poll)
            else:
                c.mode, c.positions, c.keys, c.reset = "subscribe", {}, frozenset(), set()
                self.group.join(c.process)
                c.gen = self.group.gen - 1
        yield
        self.finish(op, outcome, "subscribe", keys=list(self.keys))
        if outcome == "info":
            self.retire(w)

    def client_op(self, w: _Worker) -> Iterator:
        r = self.rnd.random()
        if w.consumer.mode == "none" and r < 0.5:
            return self.subscribe_op(w) if self.rnd.random() < self.subscribe else self.assign_op(w)
        # A member seldom subscribes again or leaves: its poll chain goes on through rebalances.
        member = w.consumer.mode == "subscribe"
        consuming = member and self.consume
        # A member whose rebalances are typed leaves the group only by ending, as the subscribe
        # workload's do: an assign would take its keys with no entry of its log saying so.
        action = self.rnd.choices(["send", "poll", "txn", "assign", "subscribe", "process", "commit"],
                                  [35, 30, 15 * self.txns,
                                   0 if member and self.typed else 1 + 10 * (1 - self.subscribe) * (not member),
                                   1 if member else 10 * self.subscribe,
                                   15 * (consuming and bool(w.consumer.unprocessed)),
                                   10 * (consuming and bool(w.consumer.keys))])[0]
        return {"send": self.send_op, "poll": self.poll_op, "txn": self.txn_op, "assign": self.assign_op,
                "subscribe": self.subscribe_op, "process": self.process_op, "commit": self.commit_op}[action](w)

    def nemesis_op(self, f: str) -> Iterator:
        self.rec.invoke("nemesis", f, value={"grudge": {"n1": ["n2"]}})
        yield
        self.rec.complete("nemesis", "info", f, value={"grudge": {"n1": ["n2"]}})

    # --- faults ------------------------------------------------------------

    def fresh_process(self) -> int:
        self.fresh += 1
        return self.fresh - 1

    def inject(self) -> Iterator | None:
        """Try the fault now (`injected` once done, `fault_armed` while it waits for an operation to
        act on); returns the operation of fresh processes that carries it, if it needs one."""
        r, f = self.rnd, self.fault
        visible = {k: [o for o, e in enumerate(self.log[k]) if e.visible] for k in self.keys}
        k = r.choice(self.keys)
        if f == "duplicate":
            keys = [k for k in self.keys if visible[k]]
            if keys:
                k = r.choice(keys)
                v = self.log[k][r.choice(visible[k])].value
                self.append(k, v, None)
                self.injected, self.detail = True, {"key": k, "value": v}
        elif f == "unexpected":
            v = 10_000_000 + self.value()
            self.append(k, v, None)
            self.injected, self.detail = True, {"key": k, "value": v}
        elif f in ("aborted", "lost"):
            self.fault_armed = True
            return None
        elif f == "truncated":
            return None  # at the end
        elif f == "inconsistent":
            keys = [k for k in self.keys if visible[k]]
            if keys:
                k = r.choice(keys)
                self.injected = True
                return self.inconsistent_op(k, r.choice(visible[k]))
        elif f in ("int-skip", "int-rewind"):
            runs = [(k, o) for k in self.keys for o in visible[k] if o + 1 in visible[k] and o + 2 in visible[k]]
            if runs:
                k, o = r.choice(runs)
                self.injected = True
                return self.misread_op(k, [o, o + 2] if f == "int-skip" else [o + 1, o])
        elif f == "int-send-reorder":
            self.injected = True
            return self.reorder_op(k)
        elif f == "expelled" and self.typed:
            g = self.group
            # A member between operations, whose next poll will be its first to learn of it.
            idle = {w.consumer.process for w in self.workers if w.task is None}
            holders = sorted({p for p in g.holder.values() if p in idle}) if len(g.members) > 1 else []
            if holders:
                p = r.choice(holders)
                keys = g.expel(p)
                # Injected; whether an overlap shows (another member's poll taking a key before the
                # expelled one's next poll began) is known at the end.
                self.injected, self.detail = True, {"process": p, "keys": sorted(keys)}
                self.stall = {"process": p, "keys": keys, "steps": 300}
        return None

    def inconsistent_op(self, k: str, o: int) -> Iterator:
        w, p, q = self.value(), self.fresh_process(), self.fresh_process()
        inv = self.rec.invoke(p, "send", mops=[{"f": "send", "key": k, "value": w}])
        yield
        op = Op(p, "send", invoke=inv, sent={(k, w)}, sends=[(k, w)])
        self.finish(op, "fail", "send", mops=[{"f": "send", "key": k, "value": w, "offset": None}])
        self.fictional.add(op.index)  # a writer for the engines (w has a position), yet it wrote nothing
        type_ = self.rnd.choice(["ok", "fail"])
        poll = Op(q, "poll")
        poll.invoke = self.rec.invoke(q, "poll", mops=[{"f": "poll"}])
        yield
        poll.last_read[k] = self.tick()
        poll.returned.add((k, w))
        self.finish(poll, type_, "poll", mops=[{"f": "poll", "records": [{"key": k, "offset": o, "value": w}]}])
        self.extra_facts.append((k, o, w))
        self.detail = {"key": k, "offset": o, "values": sorted([self.log[k][o].value, w]), "poll": type_,
                       "value": w}
        # A poll of any outcome that returned a failed send's value is G1a; only an ok one's read is
        # an uncommitted-read (the final log holds another value there).
        self.expected |= {"uncommitted-read", "G1a"} if type_ == "ok" else {"G1a"}

    def misread_op(self, k: str, offsets: list[int]) -> Iterator:
        c = Consumer(self.fresh_process())
        op = Op(c.process, "poll")
        op.invoke = self.rec.invoke(c.process, "poll", mops=[{"f": "poll"}])
        yield
        records = [Record(k, o, self.log[k][o].value, False) for o in offsets]
        op.last_read[k] = self.tick()
        op.returned |= {(k, r.value) for r in records}
        self.finish(op, "ok", "poll", mops=[{"f": "poll", "records": [
            {"key": r.key, "offset": r.offset, "value": r.value} for r in records]}])
        self.observe(c, op, records, True)
        self.detail = {"key": k, "offsets": offsets}

    def reorder_op(self, k: str) -> Iterator:
        p = self.fresh_process()
        v1, v2 = self.value(), self.value()
        op = Op(p, "send", sent={(k, v1), (k, v2)}, sends=[(k, v1), (k, v2)])
        op.invoke = self.rec.invoke(p, "send", mops=[{"f": "send", "key": k, "value": v} for v in (v1, v2)])
        yield
        o2 = self.append(k, v2, op, acked=True)
        o1 = self.append(k, v1, op, acked=True)
        yield
        self.finish(op, "ok", "send", mops=[{"f": "send", "key": k, "value": v1, "offset": o1},
                                            {"f": "send", "key": k, "value": v2, "offset": o2}])
        self.detail = {"key": k, "offsets": [o1, o2]}

    # --- the run -----------------------------------------------------------

    def run(self) -> Run:
        r = self.rnd
        workers = self.workers = [_Worker(i, self.first_process + i) for i in range(self.concurrency)]
        nemesis: Iterator | None = None
        faulty: Iterator | None = None
        started = 0
        inject_at = r.randrange(max(self.ops, 1))
        while started < self.ops or any(w.task for w in workers) or nemesis or faulty:
            if self.fault and not self.injected and not self.fault_armed and started >= inject_at and not faulty:
                faulty = self.inject()
            if self.group.members and r.random() < 0.03:
                self.group.rebalance()  # the group's coordinator moved: the members rejoin
            if self.pending and r.random() < 0.15:
                op, sends = self.pending.pop(r.randrange(len(self.pending)))
                for k, v in sends:
                    self.append(k, v, op)
            choices = [w for w in workers if w.task or started < self.ops]
            lanes: list[Any] = [w for w in choices if w.consumer.process != self.stalled()] or list(choices)
            if nemesis is not None or (started < self.ops and r.random() < 0.03):
                lanes.append("nemesis")
            if faulty is not None:
                lanes.append("fault")
            lane = r.choice(lanes)
            if lane == "nemesis":
                nemesis = nemesis or self.nemesis_op(r.choice(["start-partition", "stop-partition"]))
                nemesis = self.step(nemesis)
            elif lane == "fault":
                faulty = self.step(faulty)
            else:
                if lane.task is None:
                    lane.task = self.client_op(lane)
                    started += 1
                lane.task = self.step(lane.task)
        # Indeterminate effects still pending land now or never.
        for op, sends in self.pending:
            if r.random() < 0.5:
                for k, v in sends:
                    self.append(k, v, op)
        self.pending = []
        # A fault that found nothing to act on yet has a last chance.
        if self.fault and not self.injected and self.fault not in ("aborted", "lost", "truncated", "expelled"):
            got = self.inject()
            if got is not None:
                self.drain(got)
        self.drain(self.nemesis_op("heal"))
        if self.fault == "truncated":
            self.truncate()
        self.final_reads(workers)
        return self.result()

    def stalled(self) -> int | None:
        """The process of an expelled member that is still paused (as a consumer whose membership
        expired during a long pause is): it takes no step until another member took its key, for
        at most a few hundred steps."""
        st = self.stall
        if st is None or st["steps"] <= 0 or any(self.group.holder[k] is not None for k in st["keys"]):
            return None
        st["steps"] -= 1
        return st["process"]

    @staticmethod
    def step(task: Iterator) -> Iterator | None:
        try:
            next(task)
            return task
        except StopIteration:
            return None

    def drain(self, task: Iterator) -> None:
        while task is not None:
            task = self.step(task)

    def truncate(self) -> None:
        keys = [k for k in self.keys if len(self.log[k]) >= 2 and self.log[k][-1].acked and self.log[k][-1].visible]
        if keys:
            k = self.rnd.choice(keys)
            e = self.log[k].pop()
            self.dropped.append((k, len(self.log[k]), e))  # the engines still know it: it was acknowledged
            self.injected = True
            self.expected.add("uncommitted-read" if e.read_ok else "unseen")
            self.detail = {"key": k, "value": e.value, "offset": len(self.log[k]), "read": e.read_ok}

    def final_reads(self, workers: list[_Worker]) -> None:
        keys = list(self.keys)
        self.rnd.shuffle(keys)
        readers = workers[:min(len(workers), len(keys))]
        groups = [keys[i::len(readers)] for i in range(len(readers))]
        tasks = {w.number: self.final_read(w, sorted(ks)) for w, ks in zip(readers, groups)}
        while tasks:
            n = self.rnd.choice(sorted(tasks))
            if self.step(tasks[n]) is None:
                del tasks[n]
        if self.consume:
            self.drain(self.committed_op(readers[0].consumer.process))

    def final_read(self, w: _Worker, keys: list[str]) -> Iterator:
        yield from self.assign_op(w, keys, seek=True, final=True)
        while any(w.consumer.positions[k] < len(self.log[k]) for k in keys):
            yield from self.poll_op(w, final=True, most=4)
        yield from self.assign_op(w, keys, seek=False, final=True)

    def predict_consumption(self) -> None:
        """duplicate-consumption: a record (key, offset) that two or more ok process operations
        processed; lost-consumption: a record of the log below the highest offset ok commit and
        committed operations gave its key, that no ok or info process operation processed."""
        for (k, o), by_op in self.processed.items():
            if len(by_op) > 1:
                ops = sorted(by_op)
                self.witnesses["duplicate-consumption"][(k, o, tuple(by_op[i] for i in ops), tuple(ops))] = "group"
        top: dict[str, tuple[int, int]] = {}  # key -> (highest offset committed, the earliest op that did)
        for op, offsets in sorted(self.commits):
            for k, o in offsets.items():
                if k not in top or o > top[k][0]:
                    top[k] = (o, op)
        for k, o, v in set(self.facts()):
            if k in top and o < top[k][0] and (k, o) not in self.maybe_processed:
                self.witnesses["lost-consumption"][(k, o, v, *top[k])] = "group"

    def predict_overlaps(self) -> None:
        """ownership-overlap: two processes' holdings of a key (history_analysis/ownership.py) that
        intersect, the earlier-begun first; only an expelled member's can."""
        held = self.holdings + [(k, p, since, None, float("inf")) for (p, k), since in self.held_since.items()]
        for a in held:
            for b in held:
                if a[0] == b[0] and a[1] != b[1] and (a[2], a[1]) < (b[2], b[1]) and b[2] < a[4]:
                    self.witnesses["ownership-overlap"][(a[0], a[1:4], b[1:4])] = \
                        "fault" if self.fault == "expelled" else "unexplained"
        if self.fault == "expelled":
            self.injected = bool(self.witnesses["ownership-overlap"])

    def result(self) -> Run:
        self.predict_sends()
        self.predict_consumption()
        if self.typed:
            self.predict_overlaps()
        expected = set(self.expected)
        if self.injected:
            expected |= FAULT_TYPES[self.fault]
            if self.fault == "lost":
                k, o = self.detail["key"], self.detail["offset"]
                if any(e.visible for e in self.log[k][o + 1:]):
                    expected.add("lost-write")
        else:
            expected = set()
        witnesses = {t: ws for t, ws in self.witnesses.items() if ws}
        expected |= set(witnesses)
        finals = {k: (len(log), [e.value for e in log if e.visible]) for k, log in self.log.items()}
        dependencies, nodes = self.predict_dependencies()
        return Run(self.name, self.keys, self.fault, self.injected, expected, witnesses, self.detail, self.atomic,
                   self.effects, finals, self.first_process, set(self.fictional), dependencies, nodes)


def generate(rec: Recorder, name: str, rnd: random.Random, fault: str | None, first_process: int,
             **shape) -> Run:
    """One scenario's history (into `rec`) and what the engines must find in it; `shape`: the
    keyword arguments of `Scenario` (concurrency, ops, atomic, subscribe, txns, first_ok)."""
    return Scenario(rec, name, rnd, fault, first_process, **shape).run()
