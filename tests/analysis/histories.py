"""Building histories for the analysis tests.

In: operations described by what they do (a send of these values, a poll
returning these records, an assign). Out: history lines (dicts) with
index, time and process filled in, as `faultline.models.history` writes
them, plus the expected operation counts.

`Catalog` packs many small scenarios into one history: each gets its own
keys (prefixed with its name) and its own processes, so the anomalies of
one never touch another, and one Spark analysis checks them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Op = dict[str, Any]


@dataclass
class Builder:
    """Appends invocation/completion pairs; returns the completion's index."""

    lines: list[Op] = field(default_factory=list)
    time: int = 0
    next_process: int = 0
    # `mixed`: client operations that both send and poll (by their mops), as the stats' `mixed`.
    counts: dict[str, int] = field(default_factory=lambda: {"ops": 0, "ok": 0, "fail": 0, "info": 0, "mixed": 0})
    # Client operations per f: {"invoked": n, "ok": n}, as the stats' `by_f`.
    by_f: dict[str, dict[str, int]] = field(default_factory=dict)
    # What the nemesis' heals that failed said, as the stats' `heal_errors`.
    heal_errors: list[dict[str, Any]] = field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        """The stats both engines must report for these lines."""
        return {**self.counts, **({"by_f": self.by_f} if self.by_f else {}),
                **({"heal_errors": self.heal_errors} if self.heal_errors else {})}

    def process(self) -> int:
        self.next_process += 1
        return self.next_process - 1

    def line(self, process: int | str, type_: str, f: str, **fields: Any) -> int:
        self.time += 10
        op = {"index": len(self.lines), "time": self.time, "process": process, "type": type_, "f": f}
        op.update({k: v for k, v in fields.items() if v is not None})
        self.lines.append(op)
        return op["index"]

    def op(self, process: int | str, f: str, type_: str, invoke: dict, complete: dict | None = None,
           completed: bool = True) -> int:
        index = self.line(process, "invoke", f, **invoke)
        if process != "nemesis":
            mops = (complete or {}).get("mops") if completed and (complete or {}).get("mops") is not None \
                else invoke.get("mops")
            fs = {m["f"] for m in mops or []}
            self.counts["mixed"] += {"send", "poll"} <= fs
            self.counts["ops"] += 1
            self.counts[type_ if completed else "info"] += 1
            by_f = self.by_f.setdefault(f, {"invoked": 0, "ok": 0})
            by_f["invoked"] += 1
            by_f["ok"] += completed and type_ == "ok"
        if not completed:
            return index
        return self.line(process, type_, f, **(invoke if complete is None else complete))

    def send(self, process: int, sends: list[tuple[str, int, int | None]], type_: str = "ok",
             f: str = "send", completed: bool = True, acked: bool | None = None) -> int:
        """sends: (key, value, offset); offsets are recorded on ok completions, and on others with
        `acked` (the sends of an info operation that the broker acknowledged)."""
        invoke = [{"f": "send", "key": k, "value": v} for k, v, _ in sends]
        keep = type_ == "ok" if acked is None else acked
        done = [{"f": "send", "key": k, "value": v, "offset": o if keep else None} for k, v, o in sends]
        return self.op(process, f, type_, {"mops": invoke}, {"mops": done}, completed)

    def poll(self, process: int, records: list[tuple[str, int, int]], type_: str = "ok",
             completed: bool = True, positions: dict[str, int] | None = None,
             rebalances: list[tuple[str, list[str]]] | None = None) -> int:
        """positions: where the consumer found each key's end (the completion's `positions`);
        rebalances: its rebalance_log, as (type, keys) entries (type None: an untyped entry)."""
        done = [{"f": "poll", "records": [{"key": k, "offset": o, "value": v} for k, o, v in records]}]
        log = None if rebalances is None else [{"keys": keys, **({"type": t} if t else {})} for t, keys in rebalances]
        return self.op(process, "poll", type_, {"mops": [{"f": "poll"}]},
                       {"mops": done, "positions": positions, "rebalance_log": log}, completed)

    def txn(self, process: int, mops: list[tuple], type_: str = "ok", completed: bool = True) -> int:
        """A transaction (`f: txn`): mops are ("send", key, value, offset) and ("poll", [(key, offset,
        value), ...]), in the order performed; a send's offset is recorded on ok and info completions
        (the only ones the format gives it)."""
        invoke = [{"f": "send", "key": m[1], "value": m[2]} if m[0] == "send" else {"f": "poll"} for m in mops]
        send = ((lambda m: {"f": "send", "key": m[1], "value": m[2], "offset": m[3]}) if type_ in ("ok", "info")
                else (lambda m: {"f": "send", "key": m[1], "value": m[2]}))
        done = [send(m) if m[0] == "send" else
                {"f": "poll", "records": [{"key": k, "offset": o, "value": v} for k, o, v in m[1]]} for m in mops]
        return self.op(process, "txn", type_, {"mops": invoke}, {"mops": done}, completed)

    def processed(self, process: int, records: list[tuple[str, int, int]], type_: str = "ok") -> int:
        """A process operation: the records (key, offset, value) the consumer's application processed."""
        done = {"processed": [{"key": k, "offset": o, "value": v} for k, o, v in records]}
        return self.op(process, "process", type_, {}, done)

    def commit(self, process: int, offsets: dict[str, int], type_: str = "ok", f: str = "commit") -> int:
        """A commit (or, with f="committed", the group's committed offsets asked after the run)."""
        return self.op(process, f, type_, {}, {"offsets": offsets})

    def assign(self, process: int, keys: list[str], seek: bool = False, type_: str = "ok", f: str = "assign",
               ends: dict[str, int] | None = None) -> int:
        """ends: the `end_offsets` the completion reports (where the broker said each key ends)."""
        fields = {"keys": keys, "seek_to_beginning": True if seek else None}
        return self.op(process, f, type_, fields, {**fields, "end_offsets": ends})

    def nemesis(self, f: str = "start-partition", type_: str = "info", error: str | None = None,
                completed: bool = True) -> int:
        """error: what the completion reports; a heal that reports one is in the stats' `heal_errors`."""
        invoke = {"value": {"grudge": {"n1": ["n2"]}}}
        index = self.op("nemesis", f, type_, invoke, {**invoke, "error": error}, completed)
        if f == "heal" and error is not None and completed:
            self.heal_errors.append({"op": index - 1, "error": error})
        return index


class Scenario:
    """A view of a Builder with keys namespaced by the scenario's name and its own processes."""

    def __init__(self, name: str, builder: Builder):
        self.name = name
        self.b = builder

    def key(self, k: str = "0") -> str:
        return f"{self.name}-t/{k}"

    def __getattr__(self, attr):
        return getattr(self.b, attr)


class Catalog:
    """Scenarios registered by name, laid out one after another in one history."""

    def __init__(self) -> None:
        self.scenarios: dict[str, Callable[[Scenario], Any]] = {}

    def __call__(self, fn: Callable[[Scenario], Any]) -> Callable[[Scenario], Any]:
        self.scenarios[fn.__name__] = fn
        return fn

    def build(self) -> tuple[Builder, dict[str, Any]]:
        b = Builder()
        facts = {name: fn(Scenario(name, b)) for name, fn in self.scenarios.items()}
        return b, facts
