"""A class-data archive of the check's JVM: Spark's classes loaded and verified once, mapped in
by every later check.

A cold JVM spends most of a small check loading and verifying Spark's classes: the session
started in 3.8 s and its first query took 2.6 s, against 1.8 s and 1.2 s with the archive
(measured on 2 cores). The archive is HotSpot's dynamic class-data sharing (JDK 13 and later):
one training check of a small synthetic history with `-XX:ArchiveClassesAtExit`, whose JVM writes
every class it loaded when it exits; later checks' drivers start with `-XX:SharedArchiveFile`
(session.get_session).

In: nothing (`build()`), or the environment of a check (`options()`). Out: the archive at
`path()`, in the cache folder, keyed by the pyspark version and installation and the `java`
binary, so another Spark, checkout or Java gets another archive (one unused for UNUSED_DAYS is
removed when another is built); and the JVM options a check's driver gets. An archive the JVM
cannot use (another build, another class path, a damaged file) is ignored by the JVM without a
word: the check then only runs as it would without one.

    .venv/bin/python -m faultline.history_analysis.class_archive [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Set in the training check's environment: where its JVM writes the archive when it exits.
DUMP_ENV = "FAULTLINE_SPARK_ARCHIVE_DUMP"
# Set to 0 to start checks without the archive (to measure what it saves).
USE_ENV = "FAULTLINE_SPARK_ARCHIVE"


def cache_root() -> Path:
    """~/.cache/faultline/spark/ (or $FAULTLINE_SPARK_CACHE)."""
    env = os.environ.get("FAULTLINE_SPARK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "faultline" / "spark"


def _java() -> Path | None:
    """The java binary pyspark starts (JAVA_HOME's, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(w) if (w := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def path() -> Path | None:
    """Where the archive for this pyspark and this java lives; None without a java."""
    import pyspark

    java = _java()
    if java is None:
        return None
    st = java.stat()
    # The JVM takes an archive only with the class path it was built with: the jars of this pyspark
    # installation (another checkout's .venv has its own).
    jars = Path(pyspark.__file__).resolve().parent
    key = hashlib.sha256(f"{pyspark.__version__}\0{jars}\0{java}\0{st.st_size}\0{st.st_mtime_ns}".encode()
                         ).hexdigest()
    return cache_root() / f"classes-{pyspark.__version__}-{key[:16]}.jsa"


# An archive no check has used for this long is removed when another is built (each checkout's
# .venv gets one of about 170 MB).
UNUSED_DAYS = 7


def options() -> list[str]:
    """The archive's JVM options for a check's driver: write it (the training check), map it in
    (when built), or none."""
    dump = os.environ.get(DUMP_ENV)
    if dump:
        return [f"-XX:ArchiveClassesAtExit={dump}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    if os.environ.get(USE_ENV) == "0":
        return []
    archive = path()
    if archive is None or not archive.is_file():
        return []
    try:
        os.utime(archive)  # in use: see UNUSED_DAYS
    except OSError:
        pass
    # The JVM's own warnings to stderr, not stdout (its default), which is the check's; and none for
    # an archive it cannot use (it then only starts slower).
    return [f"-XX:SharedArchiveFile={archive}", "-Xlog:disable", "-Xlog:all=warning,cds=off,cds+dynamic=off:stderr"]


def build(force: bool = False, progress=print) -> Path | None:
    """Build the archive by one training check (about 25 s on 2 cores), unless it is there already;
    its path, or None without a java. Raises RuntimeError when the training check fails."""
    from ..models.synthetic_history import write_history

    archive = path()
    if archive is None:
        return None
    if archive.is_file() and not force:
        progress(f"class archive: {archive} is there already")
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    for other in archive.parent.glob("classes-*.jsa"):
        if other != archive and time.time() - other.stat().st_mtime > UNUSED_DAYS * 86400:
            other.unlink(missing_ok=True)
            progress(f"class archive: removed {other}, unused for {UNUSED_DAYS} days")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faultline-archive-") as tmp:
        store = Path(tmp) / "run"
        store.mkdir()
        write_history(store / "history.jsonl", 300, processes=4, keys=5)
        dump = archive.with_name(f".{archive.name}.{os.getpid()}")
        env = {**os.environ, DUMP_ENV: str(dump)}
        progress("class archive: a training check of a synthetic history ...")
        proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check", str(store), "--no-progress"],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not dump.is_file():
            dump.unlink(missing_ok=True)
            raise RuntimeError(f"the training check exited {proc.returncode} and wrote no archive: "
                               f"{(proc.stdout + proc.stderr).strip()[-2000:]}")
        # Renamed into place: a check starting meanwhile sees no archive or a whole one.
        dump.replace(archive)
    progress(f"class archive: {archive} ({archive.stat().st_size / 1e6:.0f} MB) "
             f"in {time.monotonic() - started:.1f} s")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faultline.history_analysis.class_archive",
        description="Build the class-data archive that starts every `faultline check` JVM faster: one "
                    "training check of a small synthetic history (about 25 s), written to "
                    f"{cache_root()}/ (set FAULTLINE_SPARK_CACHE to move it). scripts/setup runs it; run it "
                    "again after changing Java or pyspark (a check without a matching archive only starts "
                    f"slower). {USE_ENV}=0 makes checks start without it.")
    parser.add_argument("--force", action="store_true", help="build it again even if it is there")
    args = parser.parse_args(argv)
    try:
        built = build(force=args.force)
    except RuntimeError as exc:
        print(f"class archive: not built: {exc}", file=sys.stderr)
        return 1
    if built is None:
        print("class archive: not built: no java found (set JAVA_HOME or put java on PATH)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
