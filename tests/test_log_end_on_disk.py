"""A stopped replica's log end, read from its disk (`db.core.log_end_on_disk`), is the end the
broker's own recovery leaves, whatever a kill tore or corrupted; and each db reads it from the
folder its brokers keep the partition in."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultline.broker.config import load_config
from faultline.broker.log import PartitionLog
from faultline.broker.records import encode_batch, read_header, with_offsets
from faultline.db import DBS
from faultline.db.core import log_end_on_disk
from faultline.runner import testmap
from faultline.runner.cli import _spec_from_args, build_parser


def write_log(directory: Path, shapes: list[tuple[int, int]], segment_bytes: int) -> PartitionLog:
    config = load_config(1, "127.0.0.1:9092", directory.parent, overrides=[f"log.segment.bytes={segment_bytes}"])
    plog = PartitionLog(directory, config)
    for i, (records, size) in enumerate(shapes):
        raw = encode_batch([(None, f"{i}:{j}".encode().ljust(size, b"x")) for j in range(records)], timestamp=i)
        out = with_offsets(raw, plog.log_end_offset, 0)
        plog.append(out, read_header(out))
    return plog


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 200)), min_size=1, max_size=15),
       segment_bytes=st.integers(14, 1200), damage=st.sampled_from(["none", "cut", "flip"]), data=st.data())
def test_the_end_read_from_disk_is_where_the_brokers_recovery_ends_the_log(shapes, segment_bytes, damage, data):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        plog = write_log(directory, shapes, segment_bytes)
        written = plog.log_end_offset
        config = plog.config
        plog.close()
        last = sorted(directory.glob("*.log"))[-1]
        size = last.stat().st_size
        if damage == "cut":
            os.truncate(last, data.draw(st.integers(0, size), label="cut"))
        elif damage == "flip" and size:
            at = data.draw(st.integers(0, size - 1), label="flipped byte")
            raw = bytearray(last.read_bytes())
            raw[at] ^= 0xFF
            last.write_bytes(bytes(raw))
        end = log_end_on_disk(directory)
        assert damage != "none" or end == written
        recovered = PartitionLog(directory, config, recovery_point=0)
        try:
            assert end == recovered.log_end_offset
        finally:
            recovered.close()


def test_a_folder_without_a_segment_has_no_log_end(tmp_path):
    assert log_end_on_disk(tmp_path / "absent-0") is None
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-0" / "leader-epoch-checkpoint").write_text("0\n0\n")
    assert log_end_on_disk(tmp_path / "t-0") is None


def test_each_db_reads_the_log_from_where_its_brokers_keep_the_partition(tmp_path):
    for argv in (["--nodes", "3"], ["--db", "kafka", "--nodes", "3"]):
        spec = _spec_from_args(build_parser().parse_args(["run", *argv]))
        nodes, support = testmap.node_names(spec)
        remotes = {n: SimpleNamespace(address=f"10.0.0.{i + 2}") for i, n in enumerate(nodes + support)}
        db = DBS[spec.broker](spec, remotes, tmp_path / spec.broker)
        assert db.log_end_offset("n2", "faultline-0", 1) is None
        plog = write_log(db.partition_dir("n2", "faultline-0", 1), [(3, 10), (2, 10)], 1 << 20)
        plog.close()
        assert db.log_end_offset("n2", "faultline-0", 1) == 5, spec.broker
        assert db.log_end_offset("n3", "faultline-0", 1) is None
