"""Reading a history into Spark: malformed input is refused with the exact line.

Every malformed file is also given to the Python reader
(faultline.models.history.read_history): both must name the same line with
the same words, so the two readers accept and refuse the same histories.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultline.history_analysis.load import load_history
from faultline.models.history import HistoryError, read_history

from .histories import Builder


def valid_lines() -> list[dict]:
    b = Builder()
    p, c = b.process(), b.process()
    b.send(p, [("t/0", 1, 0)])
    b.assign(c, ["t/0"], seek=True)
    b.nemesis()
    b.poll(c, [("t/0", 0, 1)])
    b.send(p, [("t/0", 2, 1), ("t/0", 3, 2)])
    b.poll(c, [("t/0", 1, 2), ("t/0", 2, 3)])
    # lines: 1-2 send (process 0), 3-4 assign (1), 5-6 nemesis, 7-8 poll (1), 9-10 send (0), 11-12 poll (1)
    return b.lines


def write(path: Path, lines: list, end: str = "\n") -> Path:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    path.write_text(text + end)
    return path


def with_(position: int, **changes):
    def mutate(lines):
        lines[position] = {**lines[position], **changes}
        return lines
    return mutate


def drop_field(index: int, name: str):
    def mutate(lines):
        lines[index] = {k: v for k, v in lines[index].items() if k != name}
        return lines
    return mutate


def replace(index: int, text: str):
    def mutate(lines):
        lines[index] = text
        return lines
    return mutate


def reorder_invoke_twice(lines):
    # without its completion (line 2), process 0 invokes again at line 8
    del lines[1]
    return [{**op, "index": i} for i, op in enumerate(lines)]


def orphan_completion(lines):
    return [{**op, "index": i} for i, op in enumerate(lines[1:])]


MALFORMED = {
    "bad JSON": (replace(2, '{"index": 2, "time": 30, "process": 1,'), 3),
    "missing time": (drop_field(1, "time"), 2),
    "missing mops": (drop_field(6, "mops"), 7),
    "index gap": (with_(3, index=4), 4),
    "time goes back": (with_(2, time=5), 3),
    "bad type": (with_(5, type="done"), 6),
    "bad process": (with_(4, process=True), 5),
    "invokes while open": (reorder_invoke_twice, 8),
    "completion without invocation": (orphan_completion, 1),
    "completion f differs": (with_(7, f="send"), 8),
    "empty line": (replace(4, ""), 5),
    "trailing data": (replace(4, json.dumps(valid_lines()[4]) + " 7"), 5),
    "bad record": (with_(7, mops=[{"f": "poll", "records": [{"key": "t/0", "offset": 0}]}]), 8),
    "negative end offset": (with_(3, end_offsets={"t/0": 1, "t/1": -1}), 4),
    "end offset not an integer": (with_(3, end_offsets={"t/0": "1"}), 4),
    "end_offsets not an object": (with_(3, end_offsets=[1]), 4),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_line_is_refused_with_its_line_number(spark, tmp_path, case):
    mutate, line = MALFORMED[case]
    path = write(tmp_path / "history.jsonl", mutate(valid_lines()))
    with pytest.raises(HistoryError) as python:
        read_history(path)
    with pytest.raises(HistoryError) as spark_error:
        load_history(spark, str(path))
    assert spark_error.value.line == python.value.line == line
    assert str(spark_error.value) == str(python.value)
    assert str(spark_error.value).startswith(f"{path}:{line}: ")


def test_the_first_problem_wins_across_kinds(spark, tmp_path):
    lines = valid_lines()
    lines[5] = {**lines[5], "time": 1}  # line 6: time goes back
    lines[8] = "not json"  # line 9: later, though checked by another pass
    path = write(tmp_path / "history.jsonl", lines)
    with pytest.raises(HistoryError) as err:
        load_history(spark, str(path))
    assert err.value.line == 6


def test_torn_last_line_is_ignored_with_a_note(spark, tmp_path):
    lines = valid_lines()
    torn = json.dumps(lines[-1])[:25]
    path = write(tmp_path / "history.jsonl", lines[:-1] + [torn], end="")
    history = load_history(spark, str(path))
    try:
        expected = read_history(path)
        assert history.notes == expected.notes
        assert history.notes[0].startswith(f"{path}:12: the last line is cut short")
        assert history.lines == 11
        assert history.ops.count() == 11
        ops = history.operations.orderBy("op").collect()
        # the poll invoked at line 11 never completed: an info operation at its invocation
        assert [(r["op"], r["type"], r["completed"]) for r in ops][-1] == (10, "info", False)
        assert history.stats == {"ops": 5, "ok": 4, "fail": 0, "info": 1}
    finally:
        history.unpersist()


def test_bad_last_line_with_its_newline_is_an_error(spark, tmp_path):
    lines = valid_lines()
    path = write(tmp_path / "history.jsonl", lines[:-1] + [json.dumps(lines[-1])[:25]])
    with pytest.raises(HistoryError) as err:
        load_history(spark, str(path))
    assert err.value.line == 12 and "bad JSON" in err.value.problem


def test_last_line_without_newline_is_kept_when_whole(spark, tmp_path):
    # a file name Spark would otherwise take for a glob pattern
    path = write(tmp_path / "run [1] *.jsonl", valid_lines(), end="")
    history = load_history(spark, str(path))
    try:
        assert history.notes == [] and history.lines == 12
        ops, notes = history  # unpacks as (ops, notes)
        row = ops.orderBy("line").collect()[-1]
        assert (row["line"], row["index"], row["type"], row["process"]) == (12, 11, "ok", "1")
        nemesis = ops.filter("process = 'nemesis'").orderBy("line").collect()
        assert [r["line"] for r in nemesis] == [5, 6] and json.loads(nemesis[0]["value"]) == {"grudge": {"n1": ["n2"]}}
    finally:
        history.unpersist()


def test_line_numbers_are_exact_across_many_file_splits(spark, tmp_path):
    b = Builder()
    p = b.process()
    for i in range(300):
        b.send(p, [("t/0", i, i)])
    lines = b.lines
    bad = 517
    lines[bad - 1] = {**lines[bad - 1], "index": 0}
    path = write(tmp_path / "history.jsonl", lines)
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "8192")  # about 9 splits
    try:
        with pytest.raises(HistoryError) as err:
            load_history(spark, str(path))
        assert err.value.line == bad
        lines[bad - 1] = {**lines[bad - 1], "index": bad - 1}
        write(path, lines)
        history = load_history(spark, str(path))
        try:
            assert spark.read.text(str(path)).rdd.getNumPartitions() > 5
            assert history.ops.filter("index != line - 1").count() == 0
            assert history.lines == 600 and history.stats["ok"] == 300
        finally:
            history.unpersist()
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)


def test_missing_file(spark, tmp_path):
    with pytest.raises(HistoryError) as err:
        load_history(spark, str(tmp_path / "nope.jsonl"))
    assert err.value.line is None and "no such file" in str(err.value)


def test_empty_history(spark, tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text("")
    history = load_history(spark, str(path))
    try:
        assert history.lines == 0 and history.notes == []
        assert history.stats == {"ops": 0, "ok": 0, "fail": 0, "info": 0}
        assert history.operations.count() == 0
    finally:
        history.unpersist()


def test_assignment_counts_the_assign_and_subscribe_invocations_of_a_process(spark, tmp_path):
    # `assignment` (not a broker epoch): which assignment of its process an operation ran in.
    # A failed assign still starts a new one (the consumer's position is unknown after it), and
    # an operation the history never completes keeps its process's current assignment.
    b = Builder()
    c, p = b.process(), b.process()
    b.poll(c, [])                                  # c: 0
    b.send(p, [("t/0", 1, 0)])                     # p: 0
    b.assign(c, ["t/0"], seek=True)                # c: 1
    b.poll(c, [("t/0", 0, 1)])                     # c: 1
    b.assign(c, ["t/0"], type_="fail")             # c: 2
    b.nemesis()
    b.assign(p, ["t/0"], f="subscribe")            # p: 1
    b.poll(c, [])                                  # c: 2
    b.poll(p, [("t/0", 0, 1)], completed=False)    # p: 1, never completed
    path = write(tmp_path / "history.jsonl", b.lines)
    read_history(path)
    history = load_history(spark, str(path))
    try:
        got = sorted((r["op"], r["assignment"]) for r in history.operations.filter("process != 'nemesis'").collect())
        assert [a for _, a in got] == [0, 0, 1, 1, 2, 1, 2, 1]
    finally:
        history.unpersist()


def test_end_offsets_of_a_completion_are_read_as_a_map(spark, tmp_path):
    # Only the completion's: the made-up completion of an invocation never completed has none.
    b = Builder()
    c, d = b.process(), b.process()
    b.assign(c, ["t/0", "t/1"], seek=True, ends={"t/0": 3, "t/1": 0})
    b.assign(c, ["t/0"])
    b.op(d, "assign", "ok", {"keys": ["t/0"], "seek_to_beginning": True, "final": True}, completed=False)
    path = write(tmp_path / "history.jsonl", b.lines)
    read_history(path)
    history = load_history(spark, str(path))
    try:
        got = [(r["op"], r["end_offsets"]) for r in history.operations.orderBy("op").collect()]
        assert got == [(1, {"t/0": 3, "t/1": 0}), (3, None), (4, None)]
    finally:
        history.unpersist()


def test_final_reads_of_a_completion_are_a_column_of_operations(spark, tmp_path):
    # The completion's final_reads (array of struct key, end, read_to, outcome); null elsewhere.
    b = Builder()
    c, d = b.process(), b.process()
    finals = [{"key": "t/0", "end": 3, "read_to": 3, "outcome": "reached"},
              {"key": "t/1", "end": None, "read_to": 0, "outcome": "unavailable"}]
    b.op(c, "final-reads", "ok", {"final": True}, {"final": True, "final_reads": finals})
    b.assign(c, ["t/0"])
    b.op(d, "final-reads", "ok", {}, completed=False)
    path = write(tmp_path / "history.jsonl", b.lines)
    read_history(path)
    history = load_history(spark, str(path))
    try:
        got = [(r["op"], r["final_reads"]) for r in history.operations.orderBy("op").collect()]
        assert [(op, None if f is None else [x.asDict() for x in f]) for op, f in got] == \
            [(1, finals), (3, None), (4, None)]
        assert history.operations.schema["final_reads"].dataType.simpleString() == \
            "array<struct<key:string,end:bigint,read_to:bigint,outcome:string>>"
    finally:
        history.unpersist()


def test_an_analysis_leaves_nothing_in_spark_storage(spark, tmp_path):
    """A session checks many histories (`faultline check` of a store, the test session): each
    analysis must free the tables it kept, or their blocks fill the driver's heap."""
    from faultline.history_analysis.anomalies import analyse

    path = write(tmp_path / "history.jsonl", valid_lines())
    context = spark.sparkContext._jsc.sc()
    before = context.getPersistentRDDs().size()
    analysis = analyse(spark, str(path))
    assert analysis.stats["ops"] == 5 and analysis.counts == {}
    assert context.getPersistentRDDs().size() == before
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
