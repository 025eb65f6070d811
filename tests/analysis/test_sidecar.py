"""The side-car (models/operations_table.py): the harness's writer builds it as it writes a history;
the check reads it only while it matches the history, and it holds what the loader reads from the
JSON. (Its equality with the loader's reading on hundreds of mutated histories, and that one
exists exactly for the histories the Python reader accepts whole: test_history_mutations.)

- A history written by HistoryWriter gets a side-car once closed; the check reads the operations
  from it (not the JSON), and they, the notes, lines and stats, and the whole analysis are the
  ones the JSON gives, with operations never completed (a run interrupted) and nemesis lines.
- Any change to the history (a line appended, one byte changed in place, the history replaced),
  to the side-car's files (one more, one cut short, bytes changed in place), or a side-car of
  another format: stale, and the check reads the JSON: its analysis is the JSON's.
- A side-car removed while the check reads it (queries read its Parquet files as they run): the
  check reads the JSON instead, and its analysis is the JSON's.
- The check writes the side-car of a large history read from its JSON (a small one's, the tests'
  included, is left alone), from what it loaded: the next check reads it, alike; none for a torn
  or refused history, nor where it cannot write.
- No side-car for a history the Python reader refuses, one whose writer never closed (a killed
  harness), one opened to append to an earlier file, or one with a torn last line; an
  earlier side-car of the same name is removed as a new history starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from faultline.history_analysis import anomalies, load
from faultline.history_analysis.anomalies import analyse
from faultline.history_analysis.load import load_histories
from faultline.models import operations_table
from faultline.models.history import HistoryError, HistoryWriter, read_history, write_history

from .test_history_rules import base


def written(path: Path, ops: list[dict], close: bool = True) -> HistoryWriter:
    """ops written through the harness's writer (which numbers and stamps them itself)."""
    writer = HistoryWriter(path)
    for op in ops:
        writer.append({k: v for k, v in op.items() if k not in ("index", "time")})
    if close:
        writer.close()
    return writer


def rows(loaded) -> list[dict]:
    return sorted((r.asDict(recursive=True) for r in loaded.operations.collect()), key=lambda r: (r["_fid"], r["op"]))


def every_kind(open_ops: bool) -> list[dict]:
    """The rules test's history of every kind of line (sends, assigns with end_offsets and
    unavailable keys, the nemesis, warnings, an info send, final-reads, subscribe and rebalance_log,
    positions, a crash, process and commit), and, when asked, two operations never completed (a
    client's and the nemesis's)."""
    ops = base()
    if open_ops:
        ops += [{"process": 7, "type": "invoke", "f": "send", "mops": [{"f": "send", "key": "t/0", "value": 9}],
                 "node": "n1"},
                {"process": "nemesis", "type": "invoke", "f": "kill", "value": ["n1"]}]
    return ops


@pytest.mark.parametrize("open_ops", [False, True], ids=["complete", "never-completed"])
def test_the_writer_s_side_car_holds_what_the_loader_reads_from_the_json(spark, tmp_path, open_ops):
    history = tmp_path / "history.jsonl"
    written(history, every_kind(open_ops))
    found = operations_table.fresh(history)
    assert found is not None and found[0] == tmp_path / "history.jsonl.operations"
    from_sidecar = load_histories(spark, [history], sidecars=True)
    from_json = load_histories(spark, [history])
    try:
        assert from_sidecar.ops is None and from_json.ops is not None  # each read as intended
        assert rows(from_sidecar) == rows(from_json)
        assert [(f.name, f.dataType) for f in from_sidecar.operations.schema] == \
            [(f.name, f.dataType) for f in from_json.operations.schema]
        assert (from_sidecar.notes, from_sidecar.lines, from_sidecar.stats) == \
            (from_json.notes, from_json.lines, from_json.stats)
        assert from_sidecar.notes == ([["2 invocation(s) never completed; counted as info"]] if open_ops else [[]])
    finally:
        from_sidecar.unpersist()
        from_json.unpersist()
    with_sidecar = analyse(spark, history, limit=1000)
    shutil.rmtree(found[0])
    assert analyse(spark, history, limit=1000) == with_sidecar


def test_a_changed_history_or_side_car_is_stale_and_the_json_is_read(spark, tmp_path, monkeypatch):
    history = tmp_path / "history.jsonl"
    written(history, every_kind(False))
    folder = operations_table.path_for(history)
    original = history.read_bytes()
    assert operations_table.fresh(history) is not None
    monkeypatch.setenv("FAULTLINE_SIDECAR", "0")
    from_json = analyse(spark, history, limit=1000)
    monkeypatch.delenv("FAULTLINE_SIDECAR")

    # A line appended.
    extra = {"index": len(base()), "time": 10**6, "process": 9, "type": "invoke", "f": "poll",
             "mops": [{"f": "poll"}]}
    history.write_bytes(original + json.dumps(extra).encode() + b"\n")
    assert operations_table.fresh(history) is None
    loaded = load_histories(spark, [history], sidecars=True)
    try:
        assert loaded.ops is not None and loaded.lines == [len(base()) + 1]
    finally:
        loaded.unpersist()

    # One byte changed in place (the same size): a value 1 read as 7.
    changed = original.replace(b'"value":1}]}', b'"value":7}]}', 1)
    assert changed != original and len(changed) == len(original)
    history.write_bytes(changed)
    assert operations_table.fresh(history) is None

    history.write_bytes(original)
    assert operations_table.fresh(history) is not None
    stamp_path = folder / operations_table.STAMP
    stamp = json.loads(stamp_path.read_text())
    for broken in ({**stamp, "format": operations_table.FORMAT + 1}, {**stamp, "files": {}}):
        stamp_path.write_text(json.dumps(broken))
        assert operations_table.fresh(history) is None
    stamp_path.write_text(json.dumps(stamp))
    assert operations_table.fresh(history) is not None
    # A Parquet file more, or one cut short.
    part = folder / "part-0.parquet"
    shutil.copy(part, folder / "part-1.parquet")
    assert operations_table.fresh(history) is None
    (folder / "part-1.parquet").unlink()
    whole = part.read_bytes()
    part.write_bytes(whole[:-10])
    assert operations_table.fresh(history) is None
    # Bytes changed in place, the same size: Spark read such a file as operations that never happened.
    middle = len(whole) // 2
    part.write_bytes(whole[:middle] + bytes(b ^ 0xFF for b in whole[middle:middle + 64]) + whole[middle + 64:])
    assert operations_table.fresh(history) is None
    assert analyse(spark, history, limit=1000) == from_json
    part.write_bytes(whole)
    assert operations_table.fresh(history) is not None
    stamp_path.write_text("{not json")
    assert operations_table.fresh(history) is None
    loaded = load_histories(spark, [history], sidecars=True)
    try:
        assert loaded.ops is not None and loaded.lines == [len(base())]
    finally:
        loaded.unpersist()


def test_no_side_car_for_a_refused_unfinished_appended_or_torn_history(tmp_path):
    # A line the reader refuses (a send without its mops): none, and the problem names the line.
    bad = tmp_path / "bad" / "history.jsonl"
    bad.parent.mkdir()
    ops = every_kind(False)
    ops[0] = {k: v for k, v in ops[0].items() if k != "mops"}
    writer = written(bad, ops)
    assert writer._table.problem.startswith("line 1: ")
    assert not operations_table.path_for(bad).exists()
    with pytest.raises(HistoryError, match=r":1: "):
        read_history(bad)

    # A writer never closed (the harness killed): nothing in place.
    killed = tmp_path / "killed" / "history.jsonl"
    killed.parent.mkdir()
    written(killed, every_kind(False), close=False)
    assert not operations_table.path_for(killed).exists()

    # A writer appending to an earlier history writes none (it has not read the earlier lines),
    # and a new history of the same name removes the earlier side-car.
    again = tmp_path / "again" / "history.jsonl"
    again.parent.mkdir()
    written(again, every_kind(False))
    assert operations_table.fresh(again) is not None
    writer = HistoryWriter(again)
    assert writer._table is None
    writer.close()
    assert operations_table.fresh(again) is not None  # nothing appended: still the same file
    written(again, every_kind(False)[:2])
    assert operations_table.fresh(again) is None
    again.unlink()
    written(again, every_kind(False)[:2])
    found = operations_table.fresh(again)
    assert found is not None and found[1]["lines"] == 2

    # A torn last line (no newline): the reader accepts the history without it; no side-car.
    torn = tmp_path / "torn" / "history.jsonl"
    torn.parent.mkdir()
    written(torn, every_kind(False))
    shutil.rmtree(operations_table.path_for(torn))
    torn.write_bytes(torn.read_bytes() + b'{"index": 22, "ti')
    built = operations_table.build(torn)
    assert built.problem is not None and not operations_table.path_for(torn).exists()


def test_the_check_writes_the_side_car_of_a_large_history_read_from_its_json(spark, tmp_path, monkeypatch):
    # Written by other means (no side-car), with an operation never completed.
    history = tmp_path / "history.jsonl"
    write_history(history, [{**op, "index": i, "time": 10 * i} for i, op in enumerate(every_kind(True))])
    folder = operations_table.path_for(history)
    # Only a history of SIDECAR_MIN_BYTES or more gets one: this one is far smaller.
    for _ in range(2):
        load_histories(spark, [history], sidecars=True).unpersist()
    assert not folder.exists()

    monkeypatch.setattr(load, "SIDECAR_MIN_BYTES", 0)
    first = load_histories(spark, [history], sidecars=True)
    second = load_histories(spark, [history], sidecars=True)
    try:
        assert first.ops is not None and second.ops is None  # the JSON, then the side-car it left
        assert operations_table.fresh(history)[1]["lines"] == len(every_kind(True))
        assert rows(second) == rows(first)
        assert (second.notes, second.lines, second.stats) == (first.notes, first.lines, first.stats)
    finally:
        first.unpersist()
        second.unpersist()

    # None for a torn last line (its note names the file), nor for a refused history; the stale
    # side-car stays where it is, stale.
    history.write_bytes(history.read_bytes() + b'{"index": 99, "ti')
    load_histories(spark, [history], sidecars=True).unpersist()
    assert operations_table.fresh(history) is None
    history.write_bytes(history.read_bytes()[:-len(b'{"index": 99, "ti')] + b"[]\n")
    refused = load_histories(spark, [history], sidecars=True)
    assert refused.problems[0] is not None and operations_table.fresh(history) is None
    refused.unpersist()
    # A folder it cannot write in: no side-car, the same analysis.
    history.write_bytes(history.read_bytes()[:-3])
    shutil.rmtree(folder)
    monkeypatch.setattr(operations_table, "aside", lambda target: Path("/proc/no-such-place") / target.name)
    loaded = load_histories(spark, [history], sidecars=True)
    assert loaded.problems == [None] and loaded.ops is not None and not folder.exists()
    loaded.unpersist()


def test_a_side_car_removed_while_the_check_reads_it_gives_way_to_the_json(spark, tmp_path, monkeypatch):
    history = tmp_path / "history.jsonl"
    written(history, every_kind(True))
    monkeypatch.setenv("FAULTLINE_SIDECAR", "0")
    from_json = analyse(spark, history, limit=1000)
    monkeypatch.delenv("FAULTLINE_SIDECAR")
    folder = operations_table.path_for(history)
    loads = []

    def load_then_remove(spark_, paths, sidecars=False):
        loaded = load_histories(spark_, paths, sidecars=sidecars)
        loads.append(loaded.sidecars)
        if loaded.sidecars:
            shutil.rmtree(folder)
        return loaded

    monkeypatch.setattr(anomalies, "load_histories", load_then_remove)
    assert analyse(spark, history, limit=1000) == from_json
    assert loads == [True, False]  # the side-car, then the JSON
