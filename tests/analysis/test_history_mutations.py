"""Mutated histories: one change to a valid history (a field dropped, a type swapped, an extreme
number, lines spliced, duplicated, swapped or cut, another encoding, NaN, deep nesting, CRLF, a byte
order mark, unknown fields, keys without a partition) and `faultline check` with both engines must
either refuse it (exit 2, the history's file and line named in one paragraph, no traceback, the
same words from both engines) or judge it alike (the same verdict and anomaly types); a history
that breaks the format is never valid.

Hypothesis draws the examples (3x the profile's max_examples: 600 under `ci`) and the Python engine
checks each at once (`faultline check --engine python`). Spark then checks them all in batches: the
loader reads every example in one pass (history_analysis.load.validate_histories) and must refuse
the same ones with the same words, and read the accepted ones to the same lines; and a sample of
the accepted and refused examples is checked end to end with `--engine spark` in one session.
Each example's side-car (models/operations_table.py) is built as the harness's writer builds it:
one exists for exactly the examples the Python reader accepts whole, and the loader reads from
them the operations, notes, lines and stats it reads from the JSON (one pass again).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultline.checker.check import check_paths
from faultline.history_analysis import load as spark_load
from faultline.models import operations_table
from faultline.models.history import HistoryError, read_history
from faultline.models.history_schema import FIELD_NAMES, INT64_MAX, INT64_MIN, MAX_DEPTH

from .generate import FAULTS, generate
from .histories import Builder
from .test_history_rules import _clean, _plain, base

EXAMPLES = 3 * settings.default.max_examples
SPARK_SAMPLE = 6  # accepted and refused examples each checked end to end by the Spark engine


def valid_history(seed: int) -> list[dict]:
    """The rules test's history of every kind of line, then a generated scenario (sends, polls,
    assigns, info and never-completed operations, final reads), maybe with a fault."""
    rnd = random.Random(seed)
    lines = [dict(op) for op in base()]
    b = Builder()
    b.next_process = 10
    generate(b, "g", rnd, rnd.choice(FAULTS), rnd.randint(3, 12))
    t = lines[-1]["time"]
    for op in b.lines:
        lines.append({**op, "index": len(lines), "time": t + op["time"]})
    return lines


def dump(op: Any) -> bytes:
    return json.dumps(op).encode()


def paths_of(v: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(v, dict):
        for k, x in v.items():
            out.append(prefix + (k,))
            out += paths_of(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out.append(prefix + (i,))
            out += paths_of(x, prefix + (i,))
    return out


def get(v: Any, path: tuple) -> Any:
    for p in path:
        v = v[p]
    return v


def put(v: Any, path: tuple, new: Any, drop: bool = False) -> Any:
    v = json.loads(json.dumps(v))
    parent = get(v, path[:-1])
    if drop:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return v


def typed(path: tuple) -> bool:
    """Whether the format gives this place a type (not free-form: `value`, unknown fields)."""
    return path[0] in FIELD_NAMES and path[0] != "value"


def kind(v: Any) -> str:
    return ("null" if v is None else "bool" if isinstance(v, bool) else "int" if isinstance(v, int)
            else "float" if isinstance(v, float) else "str" if isinstance(v, str)
            else "list" if isinstance(v, list) else "dict")


SWAPS = ["1", "", "t/0", "nemesis", True, False, 1.5, 1e3, 0.0, None, [], {}, ["t/0"], {"keys": []},
         -1, 0, 1, 2**31, INT64_MAX - 1, INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, 2**64, -2**70]


@dataclass
class Mutated:
    kind: str
    data: bytes
    # True: the result breaks the format for certain; False: it is certainly valid; None: either.
    breaks: bool | None
    # The first line that differs from the valid history (1-based), if known.
    first: int | None = None


def mutate(draw, lines: list[dict]) -> Mutated:
    n = len(lines)
    raw = [dump(op) for op in lines]

    def joined(items: list[bytes], end: bytes = b"\n") -> bytes:
        return b"".join(x + end for x in items)

    what = draw(st.sampled_from(["drop", "swap", "swap", "extreme", "splice", "duplicate", "swap-lines", "remove",
                                 "cut-line", "cut-file", "crlf", "bom", "utf16", "bad-byte", "nan", "deep",
                                 "spaces", "unknown-field", "bad-key", "reuse-process"]))
    i = draw(st.integers(0, n - 1))
    op = lines[i]
    if what in ("drop", "swap", "extreme"):
        paths = paths_of(op)
        if what == "extreme":
            paths = [p for p in paths if kind(get(op, p)) == "int"] or paths
        path = draw(st.sampled_from(paths))
        old = get(op, path)
        if what == "drop":
            raw[i] = dump(put(op, path, None, drop=True))
            return Mutated(f"drop {path}", joined(raw), None, i + 1)
        new = draw(st.sampled_from(SWAPS if what == "swap" else [x for x in SWAPS if kind(x) == "int"]))
        raw[i] = dump(put(op, path, new))
        certain = None
        if typed(path) and path != ("process",) and new is not None:
            # A null may stand where the field's type is allowed too (an info send's offset):
            # replacing it breaks the format only sometimes.
            if kind(old) not in (kind(new), "null") and not (kind(old) == "list" and kind(new) == "list"):
                certain = True
            if kind(new) == "int" and not INT64_MIN <= new <= INT64_MAX:
                certain = True
        if old == new and kind(old) == kind(new):
            certain = False
        return Mutated(f"{what} {path}: {old!r} -> {new!r}", joined(raw), certain, i + 1)
    if what == "splice" and i + 1 < n:
        raw[i:i + 2] = [raw[i] + draw(st.sampled_from([b"", b" ", b","])) + raw[i + 1]]
        return Mutated("splice", joined(raw), True, i + 1)
    if what == "duplicate":
        raw.insert(i, raw[i])
        return Mutated("duplicate", joined(raw), True, i + 2)
    if what == "swap-lines" and i + 1 < n:
        raw[i], raw[i + 1] = raw[i + 1], raw[i]
        return Mutated("swap-lines", joined(raw), True, i + 1)
    if what == "remove":
        del raw[i]
        return Mutated("remove", joined(raw), i < n - 1 or None, i + 1)
    if what == "cut-line":
        k = draw(st.integers(0, len(raw[i]) - 1))
        raw[i] = raw[i][:k]
        return Mutated("cut-line", joined(raw), True, i + 1)
    if what == "cut-file":
        data = joined(raw)
        return Mutated("cut-file", data[:draw(st.integers(1, len(data)))], False)
    if what == "crlf":
        return Mutated("crlf", joined(raw, b"\r\n"), False)
    if what == "bom":
        return Mutated("bom", b"\xef\xbb\xbf" + joined(raw, draw(st.sampled_from([b"\n", b"\r\n"]))), False)
    if what == "utf16":
        return Mutated("utf16", joined(raw).decode().encode(draw(st.sampled_from(["utf-16", "utf-16-le"]))),
                       True, 1)
    if what == "bad-byte":
        k = draw(st.integers(0, len(raw[i])))
        raw[i] = raw[i][:k] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])) + raw[i][k:]
        return Mutated("bad-byte", joined(raw), True, i + 1)
    if what == "nan":
        ints = [p for p in paths_of(op) if kind(get(op, p)) == "int"]
        if ints:
            marker = 987654321987
            text = dump(put(op, draw(st.sampled_from(ints)), marker))
            raw[i] = text.replace(str(marker).encode(), draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"])))
            return Mutated("nan", joined(raw), True, i + 1)
    if what == "deep":
        depth = draw(st.sampled_from([MAX_DEPTH - 2, MAX_DEPTH, MAX_DEPTH + 5, 5000]))
        nested = b"[" * depth + b"]" * depth
        raw[i] = raw[i][:-1] + b', "extra": ' + nested + b"}"
        return Mutated(f"deep {depth}", joined(raw), depth + 1 > MAX_DEPTH, i + 1)
    if what == "spaces":
        # Whitespace between tokens only (a tab inside a string would be a control character).
        item = draw(st.sampled_from([",", " ,\t", " , ", ",\r "]))
        key = draw(st.sampled_from([":", " :  ", "\t:\t"]))
        raw[i] = json.dumps(op, separators=(item, key)).encode()
        return Mutated("spaces", joined(raw), False)
    if what == "unknown-field":
        raw[i] = raw[i][:-1] + b', "harness_extra": {"a": [1, 2.5, null, "x"]}}'
        return Mutated("unknown-field", joined(raw), False)
    if what == "bad-key":
        keys = [p for p in paths_of(op) if (p[-1] == "key" or (len(p) > 1 and p[-2] == "keys"))
                and isinstance(get(op, p), str)]
        if keys:
            new = draw(st.sampled_from(["t", "t/01", "t/-1", "/0", "t/0/0", "t/ 0", "t/0x1", "Tö/0", 0]))
            raw[i] = dump(put(op, draw(st.sampled_from(keys)), new))
            return Mutated(f"bad-key {new!r}", joined(raw), True, i + 1)
    if what == "reuse-process":
        # A new operation, after the end, by a process whose operation ended info.
        crashed = [o["process"] for o in lines if o["type"] == "info" and o["process"] != "nemesis"]
        if crashed:
            p = draw(st.sampled_from(crashed))
            extra = {"index": n, "time": lines[-1]["time"] + 1, "process": p, "type": "invoke", "f": "poll",
                     "mops": [{"f": "poll"}]}
            return Mutated("reuse-process", joined(raw + [dump(extra)]), True, n + 1)
    return Mutated("none", joined(raw), False)


ERROR = re.compile(r"^the history could not be read: (?P<path>\S+?):(?P<line>\d+): ")


@dataclass
class Example:
    mutated: Mutated
    path: Path
    results: dict
    python_error: HistoryError | None


def check_python(mutated: Mutated, path: Path) -> Example:
    path.parent.mkdir(parents=True)
    path.write_bytes(mutated.data)
    # Hundreds of these: the verdict is the question here; the reports are drawn for the Spark sample.
    [checked] = check_paths([path.parent], engine="python", report=False)
    results = checked.results
    try:
        read_history(path)
        error = None
    except HistoryError as exc:
        error = exc
    what = (mutated.kind, mutated.data[:3000])
    text = json.dumps(results)
    assert "Traceback" not in text and "RecursionError" not in text, what
    if error is not None:
        # Refused: exit 2, one paragraph naming the file and the line.
        assert checked.status == 2, what
        m = ERROR.match(results["error"])
        assert m and m["path"] == str(path) and int(m["line"]) == error.line, (what, results["error"])
        assert "\n" not in results["error"], what
        if mutated.first is not None:
            assert error.line >= mutated.first, (what, str(error))
    else:
        assert "could not be read" not in results.get("error", ""), what
    if mutated.breaks:
        assert error is not None, ("a history that breaks the format was accepted", what, results)
        assert results["valid"] is not True, what
    if mutated.breaks is False:
        assert error is None, ("a valid history was refused", what, str(error))
    return Example(mutated, path, results, error)


def _operations(loaded) -> dict[int, list[dict]]:
    """The loaded operations, per history, in order."""
    out: dict[int, list[dict]] = {}
    for r in loaded.operations.orderBy("_fid", "op").collect():
        out.setdefault(r["_fid"], []).append(r.asDict(recursive=True))
    return out


def test_mutated_histories_are_refused_alike_or_judged_alike(spark, tmp_path):
    examples: list[Example] = []
    calls: list[None] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=settings.default.derandomize,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(seed=st.integers(0, 2**32 - 1), data=st.data())
    def one(seed, data):
        mutated = mutate(data.draw, valid_history(seed))
        # A folder per call: Hypothesis replays a failing example, and the replay must not find
        # the first attempt's folder in its way.
        calls.append(None)
        examples.append(check_python(mutated, tmp_path / f"e{len(calls)}" / "history.jsonl"))

    one()
    assert len(examples) >= EXAMPLES
    refused = [e for e in examples if e.python_error is not None]
    accepted = [e for e in examples if e.python_error is None]
    assert refused and accepted

    # The Spark loader, every example in one pass: the same refusals, in the same words.
    spark_errors = spark_load.validate_histories(spark, [e.path for e in examples])
    for e in examples:
        got = spark_errors[str(e.path)]
        assert (None if got is None else str(got)) == (None if e.python_error is None else str(e.python_error)), \
            (e.mutated.kind, e.mutated.data[:3000])

    # The accepted ones read to the same lines by both readers (one pass again).
    paths = [str(e.path) for e in accepted]
    loaded = spark_load.load_histories(spark, paths)
    try:
        assert loaded.problems == [None] * len(paths)
        rows: dict[int, list[dict]] = {}
        for r in loaded.ops.orderBy("_fid", "line").collect():
            rows.setdefault(r["_fid"], []).append(_plain(r))
        operations = _operations(loaded)
        read_alike = [(loaded.notes[i], loaded.lines[i], loaded.stats[i]) for i in range(len(paths))]
    finally:
        loaded.unpersist()
    for fid, e in enumerate(accepted):
        python = read_history(e.path)
        got = rows.get(fid, [])
        assert len(got) == python.lines, e.mutated.kind
        for row, op in zip(got, python.ops):
            line = {k: v for k, v in row.items() if k in FIELD_NAMES}
            if "value" in line and not isinstance(op.get("value"), str):
                # Spark reads a free-form value as its JSON text, but a JSON string as its own text
                # (the loader's `value` column), so only a value that is not a string is parsed back.
                line["value"] = json.loads(line["value"])
            expected = _clean({k: v for k, v in op.items() if k in FIELD_NAMES})
            expected["process"] = str(op["process"])
            # Both sides without nulls: a null inside a free-form value too (Spark's text keeps it).
            assert _clean(line) == expected, (e.mutated.kind, row.get("line"))

    # The side-car (models/operations_table.py) exists for exactly the histories the Python reader
    # accepts whole (no torn last line), and holds what the loader read from their JSON.
    for e in examples:
        built = operations_table.build(e.path)
        whole = e.python_error is None and e.mutated.data.endswith(b"\n")
        assert (built.problem is None) == whole, (e.mutated.kind, built.problem, e.mutated.data[:3000])
    with_sidecar = [fid for fid, e in enumerate(accepted) if operations_table.fresh(e.path) is not None]
    assert with_sidecar
    loaded = spark_load.load_histories(spark, [paths[fid] for fid in with_sidecar], sidecars=True)
    try:
        assert loaded.ops is None
        from_sidecars = _operations(loaded)
        for i, fid in enumerate(with_sidecar):
            what = accepted[fid].mutated.kind
            assert from_sidecars.get(i, []) == [{**r, "_fid": i} for r in operations.get(fid, [])], what
            assert (loaded.notes[i], loaded.lines[i], loaded.stats[i]) == read_alike[fid], what
    finally:
        loaded.unpersist()

    # End to end with the Spark engine (which reads the side-cars), a sample of each, in one session: the same results.
    rnd = random.Random(0)
    sample = rnd.sample(accepted, min(SPARK_SAMPLE, len(accepted))) + rnd.sample(refused, min(SPARK_SAMPLE, len(refused)))
    for e, checked in zip(sample, check_paths([e.path.parent for e in sample], spark=spark, engine="spark")):
        r = checked.results
        assert (r["valid"], r["anomaly_types"], r.get("error"), r.get("unknown_reasons")) == \
            (e.results["valid"], e.results["anomaly_types"], e.results.get("error"), e.results.get("unknown_reasons")), \
            e.mutated.kind
        # Refused or not, the folder gets its report, with the verdict.
        head = {True: "VALID", False: "INVALID"}.get(r["valid"], "UNKNOWN")
        assert f'id="verdict">{head}<' in (e.path.parent / "report.html").read_text(), e.mutated.kind
