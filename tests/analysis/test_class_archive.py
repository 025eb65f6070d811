"""The class-data archive of the check's JVM (history_analysis.class_archive), built and used.

The archive is built into a fresh cache folder by its own command, as scripts/setup does; a check
then maps it in (the JVM's class-loading log says which classes came from it) and gives the same
results.json as a check whose JVM loads every class from the jars.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO
from .generate import write_with_anomalies

pytest.importorskip("pyspark")


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env})


def _check(run: Path, env: dict[str, str]) -> dict:
    proc = _run("faultline.runner.cli", "check", str(run), "--no-progress", "--no-report", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return json.loads((run / "results.json").read_text())


def test_a_built_archive_is_mapped_by_later_checks_which_judge_alike(tmp_path):
    cache = tmp_path / "cache"
    env = {"FAULTLINE_SPARK_CACHE": str(cache)}
    built = _run("faultline.history_analysis.class_archive", env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    archives = list(cache.glob("classes-*.jsa"))
    assert len(archives) == 1, list(cache.iterdir())
    assert f"class archive: {archives[0]}" in built.stdout
    # Nothing half-written is left beside it.
    assert [p.name for p in cache.iterdir()] == [archives[0].name]

    again = _run("faultline.history_analysis.class_archive", env=env)
    assert again.returncode == 0 and "is there already" in again.stdout, again.stdout + again.stderr

    with_archive, without = tmp_path / "with", tmp_path / "without"
    with_archive.mkdir()
    without.mkdir()
    expected = write_with_anomalies(with_archive)
    (without / "history.jsonl").write_bytes((with_archive / "history.jsonl").read_bytes())

    loads = tmp_path / "class-load.log"
    mapped = _check(with_archive, {**env, "_JAVA_OPTIONS": f"-Xlog:class+load=info:file={loads}"})
    # The dynamic archive is the top layer over the JDK's own: Spark's classes came from it.
    from_archive = [line for line in loads.read_text().splitlines()
                    if "org.apache.spark." in line and "source: shared objects file (top)" in line]
    assert len(from_archive) > 2000, len(from_archive)

    unmapped = _check(without, {**env, "FAULTLINE_SPARK_ARCHIVE": "0"})
    assert set(mapped["anomaly_types"]) == expected
    assert mapped == unmapped
