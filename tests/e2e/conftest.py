"""Every history an end-to-end test records is held to the history format: after each test, each
`history.jsonl` under its tmp_path is read by the validator both engines use
(models.history.read_history, built from models/history_schema.py), so the harness never writes a
history that `faultline check` would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultline.models.history import HistoryError, read_history


def refused_histories(directory: Path) -> list[str]:
    """The validator's error for each history under `directory` that it refuses."""
    errors = []
    for path in sorted(Path(directory).rglob("history.jsonl")):
        if path.is_file():
            try:
                read_history(path)
            except HistoryError as exc:
                errors.append(str(exc))
    return errors


@pytest.fixture(autouse=True)
def recorded_histories_follow_the_format(request):
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None:
        return
    errors = refused_histories(tmp)
    assert not errors, "the harness recorded a history the validator refuses:\n" + "\n".join(errors)
