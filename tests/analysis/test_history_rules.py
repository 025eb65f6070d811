"""Each rule of docs/history-format.md, one malformed history each: both readers refuse it at the
same line, naming the field, in the same words (one paragraph: file, line, field, what was expected,
how to fix it); and the unusual but valid histories (CRLF, a byte order mark, unknown fields, the
largest offsets, the final-reads record, ...) are read alike.

The Python reader (models.history.read_history) reads each file; the Spark loader reads all of
them in one pass (history_analysis.load.validate_histories, the same checks as load_history).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from faultline.history_analysis.load import load_history, validate_histories
from faultline.models.history import HistoryError, read_history
from faultline.models.history_schema import INT64_MAX, MAX_DEPTH, MAX_NAME_LENGTH, OFFSET_MAX

K = "t/0"


def base() -> list[dict]:
    """A valid history with every kind of line (1-based line numbers in the comments)."""
    return [
        {"index": 0, "time": 10, "process": 0, "type": "invoke", "f": "send",  # 1
         "mops": [{"f": "send", "key": K, "value": 1}]},
        {"index": 1, "time": 20, "process": 0, "type": "ok", "f": "send",  # 2
         "mops": [{"f": "send", "key": K, "value": 1, "offset": 0}]},
        {"index": 2, "time": 30, "process": 1, "type": "invoke", "f": "assign", "keys": [K],  # 3
         "seek_to_beginning": True, "final": True},
        {"index": 3, "time": 40, "process": 1, "type": "ok", "f": "assign", "keys": [K],  # 4
         "seek_to_beginning": True, "final": True, "end_offsets": {K: 1}, "unavailable": {"t/1": "no leader"}},
        {"index": 4, "time": 50, "process": "nemesis", "type": "invoke", "f": "start-partition",  # 5
         "value": {"grudge": {"n1": ["n2"]}}},
        {"index": 5, "time": 60, "process": "nemesis", "type": "info", "f": "start-partition",  # 6
         "value": {"grudge": {"n1": ["n2"]}}},
        {"index": 6, "time": 70, "process": 1, "type": "invoke", "f": "poll", "mops": [{"f": "poll"}]},  # 7
        {"index": 7, "time": 80, "process": 1, "type": "ok", "f": "poll", "warning": "Broker: leader moved",  # 8
         "mops": [{"f": "poll", "records": [{"key": K, "offset": 0, "value": 1}]}]},
        {"index": 8, "time": 90, "process": 0, "type": "invoke", "f": "send",  # 9
         "mops": [{"f": "send", "key": K, "value": 2}, {"f": "send", "key": K, "value": 3}]},
        {"index": 9, "time": 100, "process": 0, "type": "info", "f": "send", "error": "timed out",  # 10
         "mops": [{"f": "send", "key": K, "value": 2, "offset": 1},
                  {"f": "send", "key": K, "value": 3, "offset": None, "error": "Local: Message timed out"}]},
        {"index": 10, "time": 110, "process": 1, "type": "invoke", "f": "final-reads", "final": True},  # 11
        {"index": 11, "time": 120, "process": 1, "type": "ok", "f": "final-reads", "final": True,  # 12
         "final_reads": [{"key": K, "end": 2, "read_to": 2, "outcome": "reached"},
                         {"key": "t/1", "end": None, "read_to": 0, "outcome": "unavailable"}]},
        {"index": 12, "time": 130, "process": 2, "type": "invoke", "f": "subscribe", "keys": [K]},  # 13
        {"index": 13, "time": 140, "process": 2, "type": "ok", "f": "subscribe", "keys": [K]},  # 14
        {"index": 14, "time": 150, "process": 2, "type": "invoke", "f": "poll", "mops": [{"f": "poll"}]},  # 15
        {"index": 15, "time": 160, "process": 2, "type": "ok", "f": "poll", "rebalance_log": [{"keys": []}],  # 16
         "mops": [{"f": "poll", "records": []}], "positions": {K: 2}},
        {"index": 16, "time": 170, "process": 3, "type": "invoke", "f": "crash", "final": True},  # 17
        {"index": 17, "time": 180, "process": 3, "type": "info", "f": "crash", "final": True},  # 18
        {"index": 18, "time": 190, "process": 4, "type": "invoke", "f": "process"},  # 19
        {"index": 19, "time": 200, "process": 4, "type": "ok", "f": "process",  # 20
         "processed": [{"key": K, "offset": 0, "value": 1}]},
        {"index": 20, "time": 210, "process": 4, "type": "invoke", "f": "commit"},  # 21
        {"index": 21, "time": 220, "process": 4, "type": "ok", "f": "commit", "offsets": {K: 1}},  # 22
    ]


def text(lines: list) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def at(line: int, **changes):
    """Set fields of a line (1-based); a value of `DROP` removes the field."""
    def mutate(lines):
        op = dict(lines[line - 1])
        for k, v in changes.items():
            if v is DROP:
                op.pop(k, None)
            else:
                op[k] = v
        lines[line - 1] = op
        return text(lines)
    return mutate


def mop(line: int, i: int, **changes):
    def mutate(lines):
        op = dict(lines[line - 1])
        op["mops"] = [dict(m) for m in op["mops"]]
        for k, v in changes.items():
            if v is DROP:
                op["mops"][i].pop(k, None)
            else:
                op["mops"][i][k] = v
        lines[line - 1] = op
        return text(lines)
    return mutate


def record(**changes):
    """Change the record the poll of line 8 returned."""
    def mutate(lines):
        r = {"key": K, "offset": 0, "value": 1}
        r.update({k: v for k, v in changes.items() if v is not DROP})
        for k, v in changes.items():
            if v is DROP:
                r.pop(k)
        return at(8, mops=[{"f": "poll", "records": [r]}])(lines)
    return mutate


def raw(line: int, data: bytes):
    def mutate(lines):
        out = text(lines).split(b"\n")
        out[line - 1] = data
        return b"\n".join(out)
    return mutate


def final_read(**changes):
    def mutate(lines):
        r = {"key": K, "end": 2, "read_to": 2, "outcome": "reached"}
        r.update(changes)
        return at(12, final_reads=[r])(lines)
    return mutate


DROP = object()
LINE5 = json.dumps(base()[4]).encode()


def renumber(lines):
    return [{**op, "index": i} if isinstance(op, dict) else op for i, op in enumerate(lines)]


# name: (mutation, line, field, words the message holds)
REFUSED = {
    # required fields and their JSON types
    "index missing": (at(3, index=DROP), 3, "index", "field index is missing: it is required (always)"),
    "index a boolean": (at(1, index=False), 1, "index", "found false (a boolean)"),
    "index a string of digits": (at(1, index="0"), 1, "index", 'found "0" (a string)'),
    "time a fraction": (at(2, time=20.5), 2, "time", "found 20.5 (a number)"),
    "time with an exponent": (at(2, time=2e1), 2, "time", "found 20.0 (a number)"),
    "time negative": (at(1, time=-1), 1, "time", "expected a non-negative integer"),
    "time beyond 64 bits": (at(2, time=2**63), 2, "time", "found 9223372036854775808"),
    "process a string of digits": (at(3, process="1"), 3, "process", 'found "1" (a string)'),
    "process negative": (at(1, process=-1), 1, "process", "a non-negative integer (a client process)"),
    "process a boolean": (at(1, process=True), 1, "process", "found true (a boolean)"),
    "process a fraction": (at(1, process=0.0), 1, "process", "found 0.0 (a number)"),
    "process beyond 64 bits": (at(1, process=2**64), 1, "process", "found 18446744073709551616"),
    "type unknown": (at(6, type="done"), 6, "type", "expected one of invoke, ok, fail, info"),
    "type missing": (at(6, type=DROP), 6, "type", "field type is missing"),
    "f a number": (at(5, f=7), 5, "f", "expected a non-empty string, found 7 (an integer)"),
    "f empty": (at(5, f=""), 5, "f", 'found "" (a string)'),
    "client f unknown": (at(1, f="write"), 1, "f", "expected one of send, poll, txn, assign, subscribe, crash"),
    # micro-operations
    "mops missing": (at(1, mops=DROP), 1, "mops", "field mops is missing: it is required (on lines of client "
                                                  "send, poll and txn operations)"),
    "mops an object": (at(1, mops={"f": "send"}), 1, "mops", "expected a list of micro-operations"),
    "mops on a nemesis line": (at(5, mops=[]), 5, "mops", "field mops does not belong on this line"),
    "mop null": (at(1, mops=[None]), 1, "mops[0]", "found null"),
    "mop f unknown": (mop(1, 0, f="read"), 1, "mops[0].f", 'expected "send" or "poll", found "read"'),
    "send without key": (mop(1, 0, key=DROP), 1, "mops[0].key", "field mops[0].key is missing"),
    "send value a string": (mop(1, 0, value="1"), 1, "mops[0].value", 'found "1" (a string)'),
    "send value a boolean": (mop(1, 0, value=True), 1, "mops[0].value", "found true (a boolean)"),
    "send value beyond 64 bits": (mop(2, 0, value=-2**63 - 1), 2, "mops[0].value", "found -9223372036854775809"),
    "offset negative": (mop(2, 0, offset=-1), 2, "mops[0].offset", "an offset: an integer from 0 to"),
    "offset the largest long": (mop(2, 0, offset=INT64_MAX), 2, "mops[0].offset", f"to {OFFSET_MAX}"),
    "offset a boolean": (mop(2, 0, offset=True), 2, "mops[0].offset", "found true (a boolean)"),
    "offset on an invocation": (mop(1, 0, offset=0), 1, "mops[0].offset", "only written on ok and info lines"),
    "offset on a fail": (lambda ls: at(10, type="fail")(ls), 10, "mops[0].offset", "only written on ok and info"),
    "send error a number": (mop(10, 1, error=5), 10, "mops[1].error", "expected a string, found 5"),
    "poll with a key": (mop(8, 0, key=K), 8, "mops[0].key", "does not belong on a poll micro-operation"),
    "records on an invocation": (mop(7, 0, records=[]), 7, "mops[0].records", "only written on completions"),
    "records an object": (mop(8, 0, records={}), 8, "mops[0].records", "expected a list of records"),
    "record offset negative": (record(offset=-1), 8, "mops[0].records[0].offset", "found -1"),
    "record without value": (record(value=DROP), 8, "mops[0].records[0].value", "is missing"),
    "record value a boolean": (record(value=False), 8, "mops[0].records[0].value", "found false"),
    # keys
    "key without partition": (mop(1, 0, key="t"), 1, "mops[0].key", 'found "t" (a string)'),
    "key a number": (record(key=5), 8, "mops[0].records[0].key", "found 5 (an integer)"),
    # Found by the mutation property: a list where a key belongs once reached a set lookup.
    "key a list": (mop(1, 0, key=[K]), 1, "mops[0].key", "a key: a string topic/partition"),
    "keys holding a list": (at(3, keys=[[K]]), 3, "keys[0]", "a key: a string topic/partition"),
    "key partition with a leading zero": (mop(1, 0, key="t/01"), 1, "mops[0].key", "without leading zeros"),
    "key partition beyond 32 bits": (mop(1, 0, key="t/2147483648"), 1, "mops[0].key", '"t/2147483648"'),
    "key topic with a space": (mop(1, 0, key="my topic/0"), 1, "mops[0].key", "the topic of 1 to 249"),
    "key with a newline": (mop(1, 0, key="t/0\n"), 1, "mops[0].key", "a key: a string topic/partition"),
    "key not ASCII": (mop(1, 0, key="tö/0"), 1, "mops[0].key", '"tö/0"'),
    "keys missing on assign": (at(3, keys=DROP), 3, "keys", "on lines of client assign and subscribe"),
    "keys a string": (at(3, keys=K), 3, "keys", "expected a list of keys"),
    "keys with a number": (at(3, keys=[K, 5]), 3, "keys[1]", "found 5"),
    "keys on a poll": (at(7, keys=[K]), 7, "keys", "does not belong on this line"),
    # booleans
    "seek_to_beginning a string": (at(3, seek_to_beginning="false"), 3, "seek_to_beginning", 'found "false"'),
    "seek_to_beginning a number": (at(4, seek_to_beginning=1), 4, "seek_to_beginning", "found 1 (an integer)"),
    "seek_to_beginning on a poll": (at(7, seek_to_beginning=True), 7, "seek_to_beginning", "does not belong"),
    "final a string": (at(3, final="true"), 3, "final", 'found "true" (a string)'),
    "final on the nemesis": (at(5, final=True), 5, "final", "only written on lines of client operations"),
    # rebalance_log
    "rebalance_log a string": (at(16, rebalance_log="x"), 16, "rebalance_log", 'found "x" (a string)'),
    "rebalance_log of strings": (at(16, rebalance_log=[K]), 16, "rebalance_log[0]", "expected an object"),
    "rebalance_log entry without keys": (at(16, rebalance_log=[{}]), 16, "rebalance_log[0].keys", "is missing"),
    "rebalance_log on an invocation": (at(15, rebalance_log=[]), 15, "rebalance_log", "on completions"),
    "rebalance_log on a send": (at(2, rebalance_log=[]), 2, "rebalance_log", "poll and txn operations"),
    # processed, offsets
    "processed on a poll": (at(16, processed=[]), 16, "processed", "process operations"),
    "processed of strings": (at(20, processed=["x"]), 20, "processed[0]", "expected a record"),
    "processed on an invocation": (at(19, processed=[]), 19, "processed", "on completions"),
    "offsets on a process": (at(20, offsets={K: 1}), 20, "offsets", "commit and committed operations"),
    "offsets negative": (at(22, offsets={K: -1}), 22, 'offsets["t/0"]', "found -1"),
    # positions
    "positions a list": (at(16, positions=[2]), 16, "positions", "an object of key -> offset"),
    "positions negative": (at(16, positions={K: -1}), 16, 'positions["t/0"]', "found -1"),
    "positions on an invocation": (at(15, positions={K: 1}), 15, "positions", "on completions"),
    "positions on a send": (at(2, positions={K: 1}), 2, "positions", "poll and txn operations"),
    # strings
    "error a number": (at(10, error=5), 10, "error", "expected a string, found 5"),
    "error an object": (at(10, error={"code": 7}), 10, "error", 'found {"code": 7} (an object)'),
    "node a list": (at(2, node=["n1"]), 2, "node", "expected a string"),
    "warning a boolean": (at(8, warning=False), 8, "warning", "found false"),
    # end_offsets, unavailable
    "end_offsets a list": (at(4, end_offsets=[1]), 4, "end_offsets", "an object of key -> end offset"),
    "end_offsets negative": (at(4, end_offsets={K: -1}), 4, 'end_offsets["t/0"]', "found -1"),
    "end_offsets a string": (at(4, end_offsets={K: "1"}), 4, 'end_offsets["t/0"]', 'found "1"'),
    "end_offsets named by no key": (at(4, end_offsets={"t": 1}), 4, "end_offsets (a name in it)", 'found "t"'),
    "end_offsets on an invocation": (at(3, end_offsets={K: 1}), 3, "end_offsets", "only written on completions"),
    "unavailable a number": (at(4, unavailable={K: 5}), 4, 'unavailable["t/0"]', "expected a string, found 5"),
    # final_reads
    "final_reads missing": (at(12, final_reads=DROP), 12, "final_reads", "on ok lines of client final-reads"),
    "final_reads outcome unknown": (final_read(outcome="done"), 12, "final_reads[0].outcome",
                                    "one of reached, unavailable, timeout"),
    "final_reads read_to negative": (final_read(read_to=-1), 12, "final_reads[0].read_to", "found -1"),
    "final_reads end a string": (final_read(end="2"), 12, "final_reads[0].end", 'found "2"'),
    "final_reads without key": (final_read(key=None), 12, "final_reads[0].key", "is null"),
    "final_reads on a poll": (at(8, final_reads=[]), 8, "final_reads", "final-reads operations"),
    # JSON itself
    "NaN": (raw(2, b'{"index": 1, "time": NaN}'), 2, None, "NaN is not JSON"),
    "-Infinity in a nemesis value": (raw(5, LINE5[:-1] + b', "value": {"ms": -Infinity}}'), 5, None,
                                     "-Infinity is not JSON"),
    "Infinity in an unknown field": (raw(5, LINE5[:-1] + b', "x": [Infinity]}'), 5, None, "Infinity is not JSON"),
    "two objects on a line": (raw(5, LINE5 + b" " + LINE5), 5, None, "more than one JSON value on the line"),
    "two objects with a comma": (raw(5, LINE5 + b"," + LINE5), 5, None, "more than one JSON value"),
    "an array closed early": (raw(5, LINE5 + b'],[{"x": 1}'), 5, None, "more than one JSON value"),
    "a number after the object": (raw(5, LINE5 + b" 7"), 5, None, "more than one JSON value"),
    "single quotes": (raw(5, b"{'index': 4}"), 5, None, "bad JSON: Expecting property name"),
    "a trailing comma": (raw(5, LINE5[:-1] + b",}"), 5, None, "bad JSON"),
    "not UTF-8": (raw(2, b'{"index": 1, "error": "\xff"}'), 2, None, "not UTF-8: byte 0xff at column 24"),
    "UTF-16": (raw(2, json.dumps(base()[1]).encode("utf-16")), 2, None, "not UTF-8"),
    "a byte order mark inside": (raw(2, b"\xef\xbb\xbf" + json.dumps(base()[1]).encode()), 2, None,
                                 "a byte order mark (U+FEFF) that does not start the file"),
    "empty line": (raw(3, b""), 3, None, "empty line"),
    "blank line": (raw(3, b" \t\r"), 3, None, "empty line"),
    "a list": (raw(1, b"[1, 2]"), 1, None, "a history line must be a JSON object, found [1, 2] (a list)"),
    "null": (raw(1, b"null"), 1, None, "a history line must be a JSON object, found null"),
    "nested too deep": (raw(5, LINE5[:-1] + b', "x": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"), 5, None,
                        f"nested deeper than {MAX_DEPTH} levels"),
    "nested 100000 deep": (raw(5, b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 5, None,
                           f"nested deeper than {MAX_DEPTH} levels"),
    "a number of 1001 digits": (raw(5, LINE5[:-1] + b', "x": ' + b"7" * 1001 + b"}"), 5, None,
                                "numbers have at most 1000 digits"),
    "a fraction of 1001 digits": (raw(5, LINE5[:-1] + b', "x": 1.' + b"5" * 1000 + b"}"), 5, None,
                                  "numbers have at most 1000 digits"),
    "a field name too long": (raw(5, LINE5[:-1] + b', "' + b"n" * (MAX_NAME_LENGTH + 1) + b'": 1}'), 5, None,
                              f"names have at most {MAX_NAME_LENGTH}"),
    # across lines
    "process used again after its info": (lambda ls: text(renumber(ls + [
        {"index": 0, "time": 230, "process": 3, "type": "invoke", "f": "poll", "mops": [{"f": "poll"}]}])),
        23, "process", "process 3 crashed (its operation at index 17 ended info)"),
    "process completes again after its info": (lambda ls: text(renumber(ls + [
        {"index": 0, "time": 230, "process": 0, "type": "ok", "f": "send", "mops": []}])),
        23, "process", "process 0 crashed (its operation at index 9 ended info)"),
    "invokes while open": (lambda ls: text(renumber(ls[:1] + ls[2:])), 8, "process",
                           "process 0 invokes while its operation at index 0 has not completed"),
    "completion without invocation": (lambda ls: text(renumber(ls[1:])), 1, "type",
                                      "a ok completion of process 0 with no invocation before it"),
    "completion f differs": (at(8, f="send", mops=[]), 8, "f", "expected 'poll' (the f of its invocation at index 6)"),
    "index gap": (at(4, index=4), 4, "index", "expected 3, found 4"),
    "time goes back": (at(4, time=5), 4, "time", "expected at least 30 (the previous line's time"),
}


def accepted_extremes(lines):
    lines[1] = {**lines[1], "time": 20, "mops": [{"f": "send", "key": K, "value": -2**63, "offset": OFFSET_MAX}]}
    lines[3] = {**lines[3], "end_offsets": {K: INT64_MAX, "t/2147483647": 0}}
    for op in lines[2:]:
        op["time"] = INT64_MAX
    return text(lines)


ACCEPTED = {
    "the base history": lambda ls: text(ls),
    "CRLF line ends": lambda ls: text(ls).replace(b"\n", b"\r\n"),
    "a byte order mark at the start": lambda ls: b"\xef\xbb\xbf" + text(ls),
    "both": lambda ls: b"\xef\xbb\xbf" + text(ls).replace(b"\n", b"\r\n"),
    "no newline at the end": lambda ls: text(ls)[:-1],
    "unknown fields and free-form values": at(2, x={"deep": [[[1.5, None, "é"]]]}, value=[1e300, -0.0, None]),
    "a null optional field": at(2, node=None, error=None, warning=None),
    "extremes of 64 bits": accepted_extremes,
    "nested as deep as allowed": raw(5, LINE5[:-1] + b', "x": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
                                     + b"}"),
    "a number of 1000 digits": raw(5, LINE5[:-1] + b', "x": ' + b"7" * 1000 + b"}"),
    "escapes in names and strings": raw(5, LINE5[:-1].replace(b'"f"', b'"\\u0066"') + b', "\\u0078": "\\"}"}'),
    "a torn last line": lambda ls: text(ls) + b'{"index": 18, "ti',
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rules")
    paths = {}
    for i, (name, mutate) in enumerate({**{n: c[0] for n, c in REFUSED.items()}, **ACCEPTED}.items()):
        (d / str(i)).mkdir()
        path = d / str(i) / "history.jsonl"
        path.write_bytes(mutate([dict(op) for op in base()]))
        paths[name] = path
    return paths


@pytest.fixture(scope="module")
def spark_errors(spark, cases) -> dict[str, HistoryError | None]:
    got = validate_histories(spark, list(cases.values()))
    return {name: got[str(path)] for name, path in cases.items()}


def python_error(path: Path) -> HistoryError | None:
    try:
        read_history(path)
    except HistoryError as exc:
        return exc
    return None


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_broken_rule_is_refused_by_both_readers_naming_the_line_and_field(name, cases, spark_errors):
    _, line, field, words = REFUSED[name]
    path = cases[name]
    err = python_error(path)
    assert err is not None, "the Python reader accepted it"
    assert (err.line, err.field) == (line, field), str(err)
    assert words in err.problem, str(err)
    text_ = str(err)
    assert text_.startswith(f"{path}:{line}: ") and "\n" not in text_ and "Traceback" not in text_
    assert text_.endswith("(the format: docs/history-format.md)")
    if field is not None:
        assert re.match(rf"field {re.escape(field)}[ :]", err.problem), err.problem
    assert str(spark_errors[name]) == text_


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_unusual_valid_histories_are_accepted_by_both(name, cases, spark_errors):
    assert python_error(cases[name]) is None
    assert spark_errors[name] is None


def _plain(v):
    """A Spark value as JSON data: rows as dicts, without the fields the line did not have."""
    if hasattr(v, "asDict"):
        v = v.asDict()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _clean(v):
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


@pytest.mark.parametrize("name", ["both", "extremes of 64 bits", "escapes in names and strings"])
def test_both_readers_read_the_same_lines(spark, cases, name):
    python = read_history(cases[name])
    history = load_history(spark, str(cases[name]))
    try:
        rows = [_plain(r) for r in history.ops.orderBy("line").collect()]
    finally:
        history.unpersist()
    assert len(rows) == python.lines
    for row, op in zip(rows, python.ops):
        row.pop("line")
        if "value" in row:
            row["value"] = json.loads(row["value"])
        expected = _clean({k: v for k, v in op.items() if k in row or k in ("index", "process")})
        expected["process"] = str(op["process"])
        assert row == expected


def test_an_unreadable_history_is_one_paragraph_in_both_readers(spark, tmp_path, monkeypatch):
    import builtins

    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps(base()[0]) + "\n")
    real_open = builtins.open

    def deny(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", deny)
    monkeypatch.setattr(Path, "read_bytes", lambda self: deny(self))
    errors = validate_histories(spark, [path, tmp_path / "absent.jsonl", tmp_path])
    for p, words in ((path, "cannot read the file (Permission denied)"), (tmp_path / "absent.jsonl", "no such file"),
                     (tmp_path, "is a directory")):
        err = errors[str(p)]
        assert str(err).startswith(f"{p}: ") and words in str(err) and "does not exist" not in str(err)
        assert "\n" not in str(err)
    with pytest.raises(HistoryError) as err:
        load_history(spark, str(path))
    assert "Permission denied" in str(err.value)


def test_a_failure_of_spark_itself_is_one_line(spark, tmp_path):
    from faultline.history_analysis.load import spark_failure

    try:
        spark.read.text(str(tmp_path / "nothing-*.jsonl")).collect()
    except Exception as exc:  # noqa: BLE001
        reason = spark_failure(exc)
    assert "\n" not in reason and len(reason) <= 400 and "at org.apache" not in reason


def test_offsets_at_the_64_bit_edge_are_checked_alike_by_both_engines(spark, tmp_path):
    # The largest offset the format allows, acknowledged, polled and read by the final reads, the
    # largest end offset, times at the edge: Spark's arithmetic must not overflow (one past the
    # largest offset is the largest long).
    from faultline.checker.check import check_paths

    top = OFFSET_MAX
    lines = [
        {"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send", "mops": [{"f": "send", "key": K, "value": 1}]},
        {"index": 1, "time": 1, "process": 0, "type": "ok", "f": "send",
         "mops": [{"f": "send", "key": K, "value": 1, "offset": top}]},
        {"index": 2, "time": 2, "process": 1, "type": "invoke", "f": "assign", "keys": [K], "seek_to_beginning": True,
         "final": True},
        {"index": 3, "time": 3, "process": 1, "type": "ok", "f": "assign", "keys": [K], "seek_to_beginning": True,
         "final": True, "end_offsets": {K: INT64_MAX}},
        {"index": 4, "time": INT64_MAX, "process": 1, "type": "invoke", "f": "poll", "mops": [{"f": "poll"}],
         "final": True},
        {"index": 5, "time": INT64_MAX, "process": 1, "type": "ok", "f": "poll", "final": True,
         "mops": [{"f": "poll", "records": [{"key": K, "offset": top - 1, "value": -2**63},
                                             {"key": K, "offset": top, "value": 1}]}]},
        {"index": 6, "time": INT64_MAX, "process": 1, "type": "invoke", "f": "final-reads", "final": True},
        {"index": 7, "time": INT64_MAX, "process": 1, "type": "ok", "f": "final-reads", "final": True,
         "final_reads": [{"key": K, "end": INT64_MAX, "read_to": INT64_MAX, "outcome": "reached"}]},
    ]
    d = tmp_path / "edge"
    d.mkdir()
    (d / "history.jsonl").write_bytes(text(lines))
    [python] = check_paths([d], engine="python")
    [spark_checked] = check_paths([d], engine="spark", spark=spark)
    for r in (python.results, spark_checked.results):
        assert "could not be read" not in r.get("error", "") and "checker failed" not in r.get("error", ""), r
    keys = ("valid", "anomaly_types", "counts", "error")
    assert {k: spark_checked.results.get(k) for k in keys} == {k: python.results.get(k) for k in keys}
