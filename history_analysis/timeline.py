"""A run over time, for the report: history.jsonl -> Timeline (here in plain Python, in memory;
history_analysis.spark_timeline computes the same with Spark for histories of any size).

In: a history file (history-format.md), read line by line; it should be one the checker
accepted (a line that is not a JSON object is skipped here, never guessed at). Out: a
`Timeline` with
- `known`: every client operation (op: its completion's index, or its invocation's when it never
  completed; process; f; type, `info` for one never completed; invoke and complete times;
  latency), times in seconds since the history's time 0; `ops`: those a plot draws (drawn_ops);
- `faults`: the nemesis' faults as intervals (models.faults);
- `throughput`: completions per second of the run, by type;
- `quantiles`: per second of invocation, the latency quantiles of the operations that completed;
- `lag`: Jepsen's realtime lag: for each `ok` poll or txn and each key its process had read
  (or been assigned), how long before the poll's invocation the offset after the last one it had
  seen was known to exist; 0 when it was not yet known then;
- `unseen`: per key, the number of acknowledged sends that no poll had returned yet, over time
  (a step at each acknowledgement and each first sighting);
- lags and unseen steps beyond MAX_POINTS are thinned per key and time bin (bin_lags, bin_unseen).
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..models.faults import Fault, fault_intervals

NS = 1e9
QUANTILES = (0.5, 0.95, 0.99, 1.0)
# Series longer than this are thinned (bin_lags, bin_unseen) into BINS bins of the run's time.
MAX_POINTS = 20_000
BINS = 1_000
SLOWEST = MAX_POINTS // 20
SPREAD = 2654435761  # Knuth's multiplicative hash: op * SPREAD mod 2^32 scatters ops over 32 bits


@dataclass(frozen=True, slots=True)
class Op:
    op: int
    process: int
    f: str
    type: str
    invoke: float
    complete: float | None

    @property
    def latency(self) -> float | None:
        return None if self.complete is None else self.complete - self.invoke


@dataclass(frozen=True, slots=True)
class Lag:
    time: float
    process: int
    key: str
    lag: float


@dataclass
class Timeline:
    """What the report draws. `ops`: the completed client operations to draw (drawn_ops:
    `completed` and `never` count them all); `known`: operations by id, for the witnesses'
    timelines (every one, or those asked for)."""
    end: float
    ops: list[Op]
    completed: int
    never: int
    faults: list[Fault]
    throughput: dict[str, list[tuple[int, int]]]
    quantiles: list[tuple[int, dict[float, float]]]
    lag: list[Lag]
    unseen: dict[str, list[tuple[float, int]]]
    known: dict[int, Op]

    def op(self, index: int) -> Op | None:
        """The operation whose id (as witnesses name it) is `index`, if known."""
        return self.known.get(index)


# Beyond this many seconds (a history whose clock says it ran for days) only the seconds with
# completions are listed, each run of them between zeros: a list per second would not fit in memory.
DENSE_SECONDS = 1_000_000


def throughput_of(ops: list[Op], end: float) -> dict[str, list[tuple[int, int]]]:
    """type -> [(second, completions in it)] for every second of the run (over DENSE_SECONDS: the
    seconds with completions and a zero either side of each)."""
    seconds = int(math.ceil(end)) or 1
    counts: dict[str, Counter] = {t: Counter() for t in ("ok", "fail", "info")}
    for o in ops:
        if o.complete is not None:
            counts[o.type][min(int(o.complete), seconds - 1)] += 1
    if seconds <= DENSE_SECONDS:
        shown = range(seconds)
    else:
        busy = {s for c in counts.values() for s in c}
        shown = sorted({n for s in busy for n in (s - 1, s, s + 1) if 0 <= n < seconds})
    return {t: [(n, c[n]) for n in shown] for t, c in counts.items()}


def quantiles_of(ops: list[Op]) -> list[tuple[int, dict[float, float]]]:
    """[(second, {q: latency})] for each second in which a completed operation was invoked; q =
    1.0 is the maximum. The nearest-rank quantile: the smallest latency with at least a fraction q
    of the second's latencies at or below it."""
    by_second: dict[int, list[float]] = defaultdict(list)
    for o in ops:
        if o.latency is not None:
            by_second[int(o.invoke)].append(o.latency)
    out = []
    for second in sorted(by_second):
        xs = sorted(by_second[second])
        out.append((second, {q: xs[max(0, math.ceil(q * len(xs)) - 1)] for q in QUANTILES}))
    return out


def drawn_ops(ops: list[Op]) -> list[Op]:
    """The completed operations a plot shows: all of them up to MAX_POINTS; beyond, the SLOWEST
    slowest (by latency, then op), every fail and info one if they are at most MAX_POINTS // 4,
    and one in `stride` of the rest: those whose multiplicative hash (op * SPREAD mod 2^32) falls
    in the lowest 1/stride of its range (ops are not spread evenly over residues: completions of
    two-line operations are all odd)."""
    done = [o for o in ops if o.complete is not None]
    if len(done) <= MAX_POINTS:
        return done
    slowest = {o.op for o in sorted(done, key=lambda o: (-o.latency, o.op))[:SLOWEST]}
    others = sum(o.type != "ok" for o in done) <= MAX_POINTS // 4
    stride = math.ceil(len(done) / (MAX_POINTS - SLOWEST))
    return [o for o in done if o.op in slowest or (others and o.type != "ok")
            or (o.op * SPREAD) % 2**32 * stride < 2**32]


def bin_width(end: float) -> float:
    """Beyond MAX_POINTS lags or unseen steps, they are kept per key and time bin of this width."""
    return max(end, 1e-9) / BINS


def bin_lags(lags: list[Lag], end: float) -> list[Lag]:
    """Every lag when at most MAX_POINTS; otherwise per key and bin the worst (the earliest of
    equals), in time order."""
    if len(lags) <= MAX_POINTS:
        return lags
    w = bin_width(end)
    worst: dict[tuple, Lag] = {}
    for x in lags:
        b = (x.key, int(x.time / w))
        if b not in worst or (x.lag, -x.time) > (worst[b].lag, -worst[b].time):
            worst[b] = x
    return sorted(worst.values(), key=lambda x: (x.time, x.key))


def bin_unseen(unseen: dict[str, list[tuple[float, int]]], end: float) -> dict[str, list[tuple[float, int]]]:
    """Every step when at most MAX_POINTS in all; otherwise per key and bin the highest count,
    at the bin's start."""
    if sum(map(len, unseen.values())) <= MAX_POINTS:
        return unseen
    w = bin_width(end)
    out = {}
    for key, series in unseen.items():
        top: dict[int, int] = {}
        for t, c in series:
            b = int(t / w)
            top[b] = max(top.get(b, c), c)
        out[key] = [(b * w, c) for b, c in sorted(top.items())]
    return out


def _mops(line: dict) -> list[dict]:
    mops = line.get("mops")
    return mops if isinstance(mops, list) else []


def _records(m: dict) -> list[dict]:
    """A poll micro-operation's records that have a key and an offset (a history the checker
    refused may hold others: they are left out of the plots)."""
    records = m.get("records") if m.get("f") == "poll" else None
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("key"), str)
            and isinstance(r.get("offset"), int)] if isinstance(records, list) else []


def read_timeline(path: str | Path) -> Timeline:
    """The timeline of the history at `path` (see the module docstring)."""
    invoked: dict[Any, dict] = {}  # process -> its open invocation
    ops: list[Op] = []
    nemesis: list[tuple[str, str, float, Any]] = []
    known: dict[str, list[tuple[int, float]]] = defaultdict(list)  # key -> (offset known to exist, when)
    polls: list[tuple[int, float, str, Any, list[dict], dict]] = []  # for the lag, in history order
    acked: dict[tuple, float] = {}  # (key, value) -> when first acknowledged
    seen: dict[tuple, float] = {}  # (key, value) -> when a poll first returned it
    end = 0.0
    with open(path, "rb") as lines:
        for raw in lines:
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError):  # a refused history's lines, too deep ones among them
                continue
            if not (isinstance(line, dict) and isinstance(line.get("time"), int) and isinstance(line.get("index"), int)):
                continue
            t = line["time"] / NS
            end = max(end, t)
            process, type_, f = line.get("process"), line.get("type"), line.get("f")
            if not (isinstance(process, int) or process == "nemesis") or not isinstance(f, str) \
                    or type_ not in ("invoke", "ok", "fail", "info"):
                continue  # not a line of the format (a refused history): nothing to draw from it
            if process == "nemesis":
                nemesis.append((type_, f, t, line.get("value")))
                continue
            if type_ == "invoke":
                invoked[process] = line
                continue
            inv = invoked.pop(process, None)
            if inv is None:
                continue
            ops.append(Op(line["index"], process, f, type_, inv["time"] / NS, t))
            mops = [m for m in _mops(line) or _mops(inv) if isinstance(m, dict)]
            for m in mops:
                if (m.get("f") == "send" and isinstance(m.get("offset"), int) and isinstance(m.get("key"), str)
                        and isinstance(m.get("value"), int) and type_ in ("ok", "info")):
                    known[m["key"]].append((m["offset"], t))
                    acked.setdefault((m["key"], m["value"]), t)
                for r in _records(m):
                    known[r["key"]].append((r["offset"], t))
                    if type_ == "ok" and isinstance(r.get("value"), int):
                        seen.setdefault((r["key"], r["value"]), t)
            polls.append((process, inv["time"] / NS, type_, f, mops, {**inv, **line}))
    for process, inv in invoked.items():
        ops.append(Op(inv["index"], process, inv.get("f"), "info", inv["time"] / NS, None))
    ops.sort(key=lambda o: o.op)
    never = sum(o.complete is None for o in ops)
    return Timeline(end, drawn_ops(ops), len(ops) - never, never, fault_intervals(nemesis), throughput_of(ops, end),
                    quantiles_of(ops), bin_lags(_lags(polls, known), end), bin_unseen(_unseen(acked, seen), end),
                    {o.op: o for o in ops})


def _lags(polls, known: dict[str, list[tuple[int, float]]]) -> list[Lag]:
    # For offset i of key k: the earliest time some offset >= i was known to exist (Jepsen's
    # `expired`: by then offset i - 1 was no longer the end of the log).
    expired: dict[str, tuple[list[int], list[float]]] = {}
    for key, events in known.items():
        events.sort()
        offsets = [o for o, _ in events]
        times = [t for _, t in events]
        for i in range(len(times) - 2, -1, -1):
            times[i] = min(times[i], times[i + 1])
        expired[key] = (offsets, times)

    def expired_at(key: str, offset: int) -> float:
        offsets, times = expired.get(key, ([], []))
        i = bisect.bisect_left(offsets, offset)
        return times[i] if i < len(times) else math.inf

    positions: dict[Any, dict[str, int]] = {}  # process -> key -> highest offset it has read (-1: none)
    out: list[Lag] = []
    for process, invoke, type_, f, mops, line in polls:
        if type_ != "ok":
            continue
        if f == "assign":
            before = positions.get(process, {})
            rewound = bool(line.get("seek_to_beginning"))
            keys = line.get("keys") if isinstance(line.get("keys"), list) else []
            positions[process] = {k: -1 if rewound else before.get(k, -1) for k in keys if isinstance(k, str)}
        elif f == "subscribe":
            positions[process] = {}
        elif f in ("poll", "txn"):
            mine = positions.setdefault(process, {})
            for m in mops:
                for r in _records(m):
                    mine[r["key"]] = max(mine.get(r["key"], -1), r["offset"])
            for key, offset in sorted(mine.items()):
                out.append(Lag(invoke, process, key, max(0.0, invoke - expired_at(key, offset + 1))))
    return out


def _unseen(acked: dict[tuple, float], seen: dict[tuple, float]) -> dict[str, list[tuple[float, int]]]:
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for (key, value), t in acked.items():
        steps[key].append((t, 1))
        s = seen.get((key, value))
        if s is not None:
            steps[key].append((max(s, t), -1))
    out = {}
    for key, events in sorted(steps.items()):
        events.sort()
        count, series = 0, [(0.0, 0)]
        for t, d in events:
            count += d
            if series[-1][0] == t:
                series[-1] = (t, count)
            else:
                series.append((t, count))
        out[key] = series
    return out
