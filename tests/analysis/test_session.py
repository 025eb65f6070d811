"""The analysis's Spark session: its JVM tuned for the size of what it checks, and started early
for a run's check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from faultline.checker.check import history_sizes
from faultline.history_analysis.session import (INTERPRETED_INPUT_BYTES, SMALL_INPUT_BYTES, java_options,
                                                 shuffle_partitions_for, sized_for)

# In a fresh process: start the session as a run does during its teardown, wait for it, and print
# the JVM's options and whether the check's get_session found the same session.
_START_EARLY = """
import json, sys
from pathlib import Path
from faultline.runner.checking import start_spark_early
from faultline.history_analysis.session import get_session
start_spark_early("local[1]", Path(sys.argv[1])).join()
from pyspark.sql import SparkSession
early = SparkSession._instantiatedSession
spark = get_session("local[1]")
args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
print(json.dumps({"same": early is spark, "args": args}))
spark.stop()
"""


def _jvm_arguments(spark) -> list[str]:
    return list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())


def test_the_analysis_jvm_uses_the_parallel_collector_and_compiles_huge_methods(spark):
    args = _jvm_arguments(spark)
    assert "-XX:+UseParallelGC" in args
    assert "-XX:-DontCompileHugeMethods" in args
    # The tests run hundreds of analyses in this session: both compilers.
    assert "-XX:TieredStopAtLevel=1" not in args


def test_only_one_small_history_gets_the_client_compiler_alone():
    assert "-XX:TieredStopAtLevel=1" in java_options([SMALL_INPUT_BYTES - 1])
    assert "-XX:TieredStopAtLevel=1" not in java_options([SMALL_INPUT_BYTES])
    assert "-XX:TieredStopAtLevel=1" not in java_options([1000, 1000])
    assert "-XX:TieredStopAtLevel=1" not in java_options(None)
    assert {"-XX:+UseParallelGC", "-XX:-DontCompileHugeMethods"} <= set(java_options(None))


@pytest.mark.parametrize("size, partitions, interpreted", [
    (1000, "1", True), (INTERPRETED_INPUT_BYTES - 1, "1", True),
    # A default run's history (a few MB: its consumers re-read the log) runs faster compiled.
    (INTERPRETED_INPUT_BYTES, "1", False), (SMALL_INPUT_BYTES - 1, "1", False),
    (SMALL_INPUT_BYTES, str(shuffle_partitions_for(SMALL_INPUT_BYTES)), False),
    (450 << 20, "29", False)])
def test_an_analysis_runs_interpreted_only_when_tiny_and_in_one_partition_only_when_small(
        spark, size, partitions, interpreted):
    keys = ("spark.sql.shuffle.partitions", "spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")
    before = [spark.conf.get(k, None) for k in keys]
    with sized_for(spark, size):
        shuffle, whole_stage, factory = (spark.conf.get(k, None) for k in keys)
        assert shuffle == partitions
        assert (whole_stage, factory) == (("false", "NO_CODEGEN") if interpreted else tuple(before[1:]))
    assert [spark.conf.get(k, None) for k in keys] == before
    with sized_for(spark, None):
        assert [spark.conf.get(k, None) for k in keys] == before


def test_history_sizes_are_measured_through_store_folders_and_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.jsonl").write_bytes(b"x" * 300)
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"x" * 120)
    assert history_sizes([run, other]) == [300, 120]
    # An unreadable size: the session is tuned for any size.
    assert history_sizes([other, tmp_path / "absent"]) is None


@pytest.mark.parametrize("size, client_compiler_only", [(1000, True), (SMALL_INPUT_BYTES, False)])
def test_a_run_starts_the_checks_session_early_tuned_for_its_history(tmp_path, size, client_compiler_only):
    history = tmp_path / "history.jsonl"
    with open(history, "wb") as f:
        f.truncate(size)  # sparse: only its size matters here
    out = subprocess.run([sys.executable, "-c", _START_EARLY, str(history)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["same"] is True
    assert "-XX:+UseParallelGC" in result["args"]
    assert ("-XX:TieredStopAtLevel=1" in result["args"]) is client_compiler_only
