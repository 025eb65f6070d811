"""The hook that holds every history an e2e test records to the format (conftest.py) finds a
history it refuses, and passes those it accepts; it needs no cluster."""

from __future__ import annotations

import json

from faultline.models.history import HistoryWriter

from .conftest import refused_histories


def test_the_hook_reads_every_recorded_history(tmp_path_factory):
    # (Not tmp_path: the hook itself would hold this test's deliberately bad history against it.)
    tmp_path = tmp_path_factory.mktemp("recorded")
    run = tmp_path / "store" / "queue" / "20260101T000000"
    run.mkdir(parents=True)
    writer = HistoryWriter(run / "history.jsonl")
    writer.append({"process": 0, "type": "invoke", "f": "send", "mops": [{"f": "send", "key": "t/0", "value": 1}]})
    writer.append({"process": 0, "type": "ok", "f": "send",
                   "mops": [{"f": "send", "key": "t/0", "value": 1, "offset": 0}]})
    writer.close()
    assert refused_histories(tmp_path) == []
    bad = tmp_path / "store" / "queue" / "other"
    bad.mkdir()
    (bad / "history.jsonl").write_text(json.dumps({"index": 0, "time": 0, "process": "0", "type": "invoke",
                                                   "f": "poll", "mops": [{"f": "poll"}]}) + "\n")
    [error] = refused_histories(tmp_path)
    assert error.startswith(f"{bad / 'history.jsonl'}:1: field process")
