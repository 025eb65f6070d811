"""A stored test.json is checked against a schema of its own (models/spec_schema.py): a test.json that
cannot be used makes the check unknown (exit 2) with one paragraph naming test.json and the field,
in results.json and in the summary, never a traceback; a good one is read as before."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from faultline.checker.check import check_paths, read_spec
from faultline.models.history import write_history
from faultline.models.spec import TestSpec
from faultline.models.spec_schema import SpecFileError, read_spec_file

from .test_cli import REPO, sends_and_reads

GOOD = dataclasses.asdict(TestSpec())


def spec_bytes(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


# name: (test.json's bytes, or "dir" for a directory; the field named, or None; words of the message)
BAD = {
    "a directory": ("dir", None, "is a directory, not a file"),
    "a list": (b"[1, 2]", None, "expected one JSON object (the run's settings), found [1, 2] (a list)"),
    "a string": (b'"exactly-once"', None, 'found "exactly-once" (a string)'),
    "invalid JSON": (b'{"model": "exactly-once",\n}', None, "not valid JSON: Expecting property name enclosed in "
                                                           "double quotes at line 2, column 1 of test.json"),
    "empty": (b"", None, "not valid JSON: Expecting value at line 1, column 1"),
    "NaN": (b'{"rate": NaN}', None, "not valid JSON: NaN is not JSON"),
    "not UTF-8": (b'{"name": "\xff"}', None, "not UTF-8"),
    "a list where the model name belongs": (spec_bytes(model=["exactly-once"]), "model",
                                            'field model: expected a string or null, found ["exactly-once"] (a list)'),
    "an unknown model": (spec_bytes(model="perfect"), "model", "field model: unknown model 'perfect'"),
    "a string where the producer settings belong": (spec_bytes(producer="acks=1"), "producer",
                                                    "field producer: expected an object of setting name -> value"),
    "a list in the settings": (spec_bytes(broker_settings={"min.insync.replicas": [2]}), "broker_settings",
                               "field broker_settings: expected an object"),
    "nemesis a string": (spec_bytes(nemesis="kill"), "nemesis", 'field nemesis: expected a list of strings, found "kill"'),
    "nodes a string": (spec_bytes(nodes="3"), "nodes", 'field nodes: expected an integer, found "3" (a string)'),
    "seed a boolean": (spec_bytes(seed=True), "seed", "field seed: expected an integer or null, found true"),
    "consumer_mode unknown": (spec_bytes(consumer_mode="poll"), "consumer_mode",
                              'field consumer_mode: expected "assign", "subscribe" or null, found "poll"'),
}


def store(tmp_path: Path, spec: bytes | str | None) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    write_history(d / "history.jsonl", sends_and_reads([(0, 1), (1, 2)]))
    if spec == "dir":
        (d / "test.json").mkdir()
    elif spec is not None:
        (d / "test.json").write_bytes(spec)
    return d


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_test_json_is_one_paragraph_naming_it_and_the_field(tmp_path, name):
    content, field, words = BAD[name]
    d = store(tmp_path, content)
    [checked] = check_paths([d], engine="python")
    assert checked.status == 2
    error = checked.results["error"]
    assert error.startswith(f"{d / 'test.json'}: ") and words in error, error
    assert "\n" not in error and "Traceback" not in error and "history.jsonl" not in error
    assert json.loads((d / "results.json").read_text())["error"] == error
    if field is not None:
        with pytest.raises(SpecFileError) as exc:
            if field == "model":
                from faultline.checker.check import model_for
                model_for(d, None)
            else:
                read_spec(d)
        assert exc.value.field == field


def test_good_test_json_files_are_read_as_before(tmp_path):
    for i, spec in enumerate([GOOD, {}, {"model": "at-least-once", "unknown": [1, {"x": None}]},
                              {**GOOD, "producer": {"acks": 1, "enable.idempotence": False}, "consumer_mode": None,
                               "rate": 12, "seed": None}]):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps(spec))
        assert read_spec_file(path) == spec
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode())
    assert read_spec_file(bom) == GOOD
    [checked] = check_paths([store(tmp_path, spec_bytes(model="at-least-once"))], engine="python")
    assert checked.results["model"] == "at-least-once" and checked.status == 0


def test_the_command_line_prints_the_paragraph_and_exits_2(tmp_path):
    d = store(tmp_path, spec_bytes(producer="acks=1"))
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", str(d), "--no-progress",
                           "--engine", "python"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert f"unknown: {d / 'test.json'}: field producer: expected" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
