"""The SparkSession used by the analysis.

In: the Spark master, the number of shuffle partitions, an application name
(and optionally the driver memory, and the sizes of the histories the
session is for). Out: a SparkSession with quiet logging (WARN) and no web UI,
its JVMs tuned for the analysis (`java_options`), reused if one already runs
in this process (getOrCreate), in which case only the runtime settings
(shuffle partitions, and `RUNTIME`: adaptive execution off, an uncompressed
cache, no constraint propagation) are applied to it. Its driver maps in the
class archive when one was built (class_archive: Spark's classes loaded
once, for every check).

`sized_for(spark, nbytes)`: a context in which Spark runs in one shuffle
partition when the input is small (and interpreted rather than compiling code
when it is tiny); in shuffle partitions sized from the input
(`shuffle_partitions_for`) when not.

`settings(spark, conf)`: a context in which the session has the runtime settings `conf`.

`materialise(df)`: the DataFrame computed now and kept in the executors'
storage (on disk), as a new DataFrame whose plan is only a scan
of those blocks; `release(df)` frees them.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from . import class_archive

# Spark's default log4j profile prints INFO lines at start-up, before
# setLogLevel can run; a WARN profile given to the JVM keeps them out. Two
# warnings are about Spark's own bookkeeping, nothing a user can act on: a
# plan's text cut short for display, and the analysis freeing its checkpoints
# on purpose (release).
_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
logger.strings.name = org.apache.spark.util.SparkStringUtils
logger.strings.level = error
logger.checkpoint.name = org.apache.spark.rdd.MapPartitionsRDD
logger.checkpoint.level = error
"""


def _log4j_file() -> Path:
    path = Path(tempfile.gettempdir()) / "faultline-spark-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(_LOG4J)
        tmp.replace(path)
    return path


# Below this size an analysis runs in one shuffle partition, and one history alone in a JVM with
# the client compiler only (java_options).
SMALL_INPUT_BYTES = 64 << 20
# Below this size compiling Spark's generated code (a hundred classes or so per analysis) takes
# longer than running the plan interpreted. The interpreted cost grows with the facts, mostly the
# records polls returned: a default run's history (3k operations, 5.9 MB: its consumers re-read
# the log from the start) took 38-43 s interpreted and 22-24 s compiled; a synthetic one of 1.5k
# operations (0.6 MB) 16-18 s interpreted and 19-20 s compiled (2026-11-27, 2 cores; README).
INTERPRETED_INPUT_BYTES = 1 << 20


def java_options(inputs: list[int] | None) -> list[str]:
    """The JVM options of the analysis's driver and executors, for histories of `inputs` bytes
    (None: unknown).

    - The parallel collector: the analysis is a batch job, and G1's concurrent marking took a
      core of the two for most of a 1M-operation check (100 s of 200), with 17 s of pauses.
    - Huge methods compiled: Spark's generated code for the line checks and the analysis's
      windows has methods over HotSpot's 8,000-byte limit, which it otherwise leaves to the
      bytecode interpreter (the line checks of 1M operations: 23 s, 10 s compiled).
    - For one small history only, the client compiler alone: its check is a few seconds of
      planning and compiling in a cold JVM, where C2's optimisations never pay back (a default
      run's check: 21.6 s, 17.1 s with C1). Over many analyses they do (30 such histories in
      one call: 119.5 s, 168.8 s with C1).
    """
    out = ["-XX:+UseParallelGC", "-XX:-DontCompileHugeMethods"]
    if inputs is not None and len(inputs) == 1 and inputs[0] < SMALL_INPUT_BYTES:
        out.append("-XX:TieredStopAtLevel=1")
    return out


# The runtime settings every analysis runs with.
RUNTIME = {
    # The analysis partitions its events by key once and answers every question inside those
    # partitions; adaptive re-planning after each stage has nothing to gain there and costs a
    # planning pass per stage.
    "spark.sql.adaptive.enabled": "false",
    # The cache holds a history's parsed lines only while it is loaded: building compressed
    # columns took a tenth of loading 1M operations (33.6-37.1 s, 30.5-32.5 s without).
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # No constraints derived from the plans' predicates: the analysis's filters are wide
    # disjunctions (the suspects' rules), and a checkpoint (materialise) carries the constraints of
    # its plan over to the new one by rewriting every one of them, which took 2.7 s of driver time
    # for the suspects of a 1.5k-operation history, in a warm session, for a job of 0.03 s (0.06 s
    # without). They only add null checks ahead of joins, which drop null keys anyway.
    "spark.sql.constraintPropagation.enabled": "false",
}


def get_session(master: str = "local[2]", shuffle_partitions: int = 4, app_name: str = "faultline-check",
                driver_memory: str | None = None, inputs: list[int] | None = None) -> SparkSession:
    """A SparkSession for the analysis; see the module docstring.

    `driver_memory` (default: $FAULTLINE_SPARK_DRIVER_MEMORY or 4g) and
    `inputs` (the sizes of the histories to check, None when unknown; see java_options) only take
    effect when this call starts the JVM. In local mode the driver is also
    the executor, so this is the memory the whole analysis runs in.
    """
    memory = driver_memory or os.environ.get("FAULTLINE_SPARK_DRIVER_MEMORY", "4g")
    if master.startswith("local"):
        # Without it Spark looks up the host's address and warns when it
        # resolves to loopback; a local run never needs another interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Without the web UI the status store still keeps every job, stage and SQL execution, the
        # last with its plans: a session that checks many histories (the tests, `faultline check`
        # of many paths) filled a 4 GB heap with them and spent its time in garbage collection.
        # The progress line needs only the active stages.
        .config("spark.sql.ui.retainedExecutions", "5")
        .config("spark.ui.retainedJobs", "20")
        .config("spark.ui.retainedStages", "20")
        .config("spark.ui.retainedTasks", "1000")
        .config("spark.ui.dagGraph.retainedRootRDDs", "20")
        .config("spark.driver.memory", memory)
        # The analysis's checkpoints (its operations and facts) are read back by every query:
        # Kryo writes and reads their rows faster than Java serialization (1M operations: 173 s,
        # 162 s with Kryo; a small history alike).
        .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
        # Rows hold no references to each other: tracking them reset a map for every row read back.
        .config("spark.kryo.referenceTracking", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions",
                " ".join([f"-Dlog4j2.configurationFile=file:{_log4j_file()}", *java_options(inputs),
                          *class_archive.options()]))
        .config("spark.executor.extraJavaOptions", " ".join(java_options(inputs)))
    )
    for key, value in RUNTIME.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # A session this process already ran keeps its own runtime settings: the analysis's are set again.
    for key, value in {**RUNTIME, "spark.sql.shuffle.partitions": str(shuffle_partitions)}.items():
        spark.conf.set(key, value)
    return spark


# Above SMALL_INPUT_BYTES, a shuffle partition per this many bytes of history, between 4 and 64.
# Smaller partitions sort without spilling and spread a process's or a key's rows over both
# cores: the analysis of 1M operations (450 MB) took 148 s in 4 partitions, 131 s in 16 and
# 128 s in 32 (one warm session, 2 cores); 64 and 128 gained nothing more.
BYTES_PER_PARTITION = 16 << 20
MAX_PARTITIONS = 64


def shuffle_partitions_for(nbytes: int) -> int:
    """The shuffle partitions for an input of `nbytes` bytes, at least SMALL_INPUT_BYTES."""
    return max(4, min(MAX_PARTITIONS, -(-nbytes // BYTES_PER_PARTITION)))


# A small input's settings: one shuffle partition, since each of the analysis's stages then runs
# one task instead of one per partition (30 histories of 1,500 operations in one call: 109 s with
# 4 partitions, 95 s with 1); and for a tiny one, interpreted.
_SMALL = {"spark.sql.shuffle.partitions": "1"}
_TINY = {**_SMALL, "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@contextmanager
def sized_for(spark: SparkSession, nbytes: int | None) -> Iterator[None]:
    """Run the jobs started inside in one shuffle partition when the input is known to be small
    (interpreted too when it is tiny: INTERPRETED_INPUT_BYTES); in shuffle_partitions_for(nbytes)
    partitions when it is known to be larger.

    The settings are the session's, so they are restored on exit; a job
    started elsewhere meanwhile only runs slower or faster, never differently.
    """
    if nbytes is None:
        yield
        return
    if nbytes >= SMALL_INPUT_BYTES:
        conf = {"spark.sql.shuffle.partitions": str(shuffle_partitions_for(nbytes))}
    else:
        conf = _TINY if nbytes < INTERPRETED_INPUT_BYTES else _SMALL
    with settings(spark, conf):
        yield


@contextmanager
def settings(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """The session's runtime settings `conf` for the jobs started inside, restored on exit."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def materialise(df: DataFrame) -> DataFrame:
    """`df` computed once and kept (memory, then disk), behind a plan of one scan.

    Every query built on a persisted DataFrame still carries its whole plan,
    which Catalyst analyses, optimises and matches against the cache again for
    each query: with the analysis's dozens of windows that took seconds per
    query on any history, ten times what running it took on a small one. A
    local checkpoint cuts the plan (keeping the partitioning by key, so no
    query shuffles again). Free it with `release`.
    """
    return df.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)


def release(df: DataFrame) -> None:
    """Free the blocks of a DataFrame `materialise` returned (DataFrame.unpersist knows nothing of
    them: they belong to the checkpointed RDD under its plan)."""
    df._jdf.queryExecution().analyzed().rdd().unpersist(False)
