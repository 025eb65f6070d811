"""A partition's log on disk: what is appended reads back byte for byte, reads
honour their limits, segments roll and carry sparse indexes, and a reopened
log recovers from torn tails, corrupt batches and damaged indexes by cutting
exactly the damaged part and keeping every complete batch before it."""

from __future__ import annotations

import os
import random
import struct
import tempfile
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultline.broker import log as log_module
from faultline.broker.config import BrokerConfig, load_config
from faultline.broker.log import INDEX_ENTRY, PartitionLog
from faultline.broker.records import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    check_batch,
    encode_batch,
    encode_varint,
    iter_headers,
    read_header,
    with_offsets,
)
from faultline.broker.state import CHECKPOINT_FILE, BrokerState

LISTEN = "127.0.0.1:9092"


# --- helpers --------------------------------------------------------------------------------


def spy_on_rebuild(monkeypatch) -> list[int]:
    """Record the base offset of every segment whose index is rebuilt from its log."""
    rebuilt: list[int] = []
    real_rebuild = log_module.Segment.rebuild

    def spy(self, check):
        rebuilt.append(self.base_offset)
        return real_rebuild(self, check)

    monkeypatch.setattr(log_module.Segment, "rebuild", spy)
    return rebuilt


def make_config(data_dir: Path, settings: dict[str, object] | None = None) -> BrokerConfig:
    return load_config(1, LISTEN, data_dir, overrides=[f"{k}={v}" for k, v in (settings or {}).items()])


def open_broker(data_dir: Path, settings: dict[str, object] | None = None) -> BrokerState:
    return BrokerState(make_config(data_dir, settings))


def crash(state: BrokerState) -> None:
    """What a SIGKILL leaves: file descriptors closed, no flush, no checkpoint."""
    for topic in state.topics.values():
        for plog in topic.partitions.values():
            plog.close()


def batch(i: int, records: int = 1, size: int = 8, timestamp: int | None = None) -> bytes:
    """A producer's batch of `records` records whose values are `size` bytes and name `i`."""
    values = [(None, f"{i}:{j}:".encode().ljust(size, b"x")) for j in range(records)]
    return encode_batch(values, timestamp=1000 + i if timestamp is None else timestamp)


def produce(state: BrokerState, plog: PartitionLog, raws: list[bytes]) -> list[bytes]:
    """Append each batch through the broker; return the bytes the log must now hold for each."""
    stored = []
    for raw in raws:
        epoch = plog.leader_epoch
        result = state.append(plog, raw)
        assert not result.duplicate
        stored.append(bytes(with_offsets(raw, result.base_offset, epoch)))
    return stored


def base_of(stored: bytes) -> int:
    return read_header(stored).base_offset


def split_batches(data: bytes) -> list[bytes]:
    out = []
    for pos, header in iter_headers(data):
        out.append(bytes(data[pos : pos + header.size]))
    assert sum(len(b) for b in out) == len(data), "a read returned a partial batch"
    return out


def read_all(plog: PartitionLog) -> list[bytes]:
    """Every batch below the high watermark, by fetching on from the log start."""
    out: list[bytes] = []
    offset = plog.log_start_offset
    while offset < plog.high_watermark:
        data = plog.read(offset, 1 << 30, plog.high_watermark, True)
        assert data, f"nothing read at offset {offset} below the high watermark {plog.high_watermark}"
        got = split_batches(data)
        assert read_header(got[0]).base_offset <= offset <= read_header(got[0]).last_offset
        out += got
        offset = read_header(got[-1]).next_offset
    return out


def segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


def index_entries(path: Path) -> list[tuple[int, int]]:
    return list(INDEX_ENTRY.iter_unpack(path.read_bytes()))


def one_partition(tmp_path: Path, settings: dict[str, object] | None = None):
    state = open_broker(tmp_path / "data", settings)
    plog = state.create_topic("t", 1).partitions[0]
    return state, plog


def reopen(tmp_path: Path, settings: dict[str, object] | None = None):
    state = open_broker(tmp_path / "data", settings)
    return state, state.partition("t", 0)


def pdir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "t-0"


def offsets_of(stored: list[bytes]) -> list[int]:
    return [base_of(b) for b in stored]


def assert_log_is(plog: PartitionLog, expected: list[bytes]) -> None:
    got = read_all(plog)
    assert offsets_of(got) == offsets_of(expected)
    assert got == expected
    end = read_header(expected[-1]).next_offset if expected else plog.log_start_offset
    assert plog.log_end_offset == end
    # Every offset reads back its own batch.
    for b in expected:
        h = read_header(b)
        for offset in range(h.base_offset, h.next_offset):
            assert split_batches(plog.read(offset, 1, plog.high_watermark, True)) == [b]


# --- append and read --------------------------------------------------------------------------


def test_appended_batches_read_back_byte_identical_by_offset(tmp_path):
    state, plog = one_partition(tmp_path)
    raws = [batch(i, records=1 + i % 4, size=3 + 7 * i) for i in range(20)]
    stored = produce(state, plog, raws)
    # Only the base offset and partition leader epoch (outside the CRC) change.
    for raw, got in zip(raws, stored):
        assert got[16:] == raw[16:]
        check_batch(got)
    offsets = offsets_of(stored)
    assert offsets[0] == 0
    assert all(read_header(a).next_offset == base_of(b) for a, b in zip(stored, stored[1:]))
    assert plog.high_watermark == plog.log_end_offset == read_header(stored[-1]).next_offset
    assert_log_is(plog, stored)
    # The segment file is the batches, back to back.
    assert pdir(tmp_path).joinpath("00000000000000000000.log").read_bytes() == b"".join(stored)


def test_read_in_the_middle_of_a_batch_starts_at_that_batch(tmp_path):
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i, records=5) for i in range(4)])
    assert split_batches(plog.read(7, 1 << 20, plog.high_watermark, True)) == stored[1:]
    assert plog.read(plog.log_end_offset, 1 << 20, plog.high_watermark, True) == b""


def test_read_honours_max_bytes_with_whole_batches(tmp_path):
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i, size=10 + 13 * (i % 5)) for i in range(12)])
    hw = plog.high_watermark
    for start in range(len(stored)):
        offset = base_of(stored[start])
        for max_bytes in range(0, sum(len(b) for b in stored[start:]) + 5, 17):
            fits = []
            total = 0
            for b in stored[start:]:
                if total + len(b) > max_bytes:
                    break
                fits.append(b)
                total += len(b)
            got = split_batches(plog.read(offset, max_bytes, hw, False))
            assert got == fits
            assert sum(len(b) for b in got) <= max_bytes
            # min_one: at least the first batch, even when it alone is over the limit.
            got_one = split_batches(plog.read(offset, max_bytes, hw, True))
            assert got_one == (fits or [stored[start]])


def test_read_stops_below_the_upper_bound(tmp_path):
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i, records=3) for i in range(6)])
    for upper_batch in range(len(stored) + 1):
        upper = base_of(stored[upper_batch]) if upper_batch < len(stored) else plog.log_end_offset
        for start in range(len(stored)):
            got = split_batches(plog.read(base_of(stored[start]) + 1, 1 << 20, upper, True))
            assert got == stored[start:upper_batch]
    # An offset at or above the bound reads nothing, even with min_one.
    assert plog.read(9, 1 << 20, 9, True) == b""
    assert plog.read(12, 1 << 20, 9, True) == b""


# --- segments and indexes -------------------------------------------------------------------


def test_segments_roll_before_exceeding_log_segment_bytes(tmp_path):
    size = len(batch(0))
    state, plog = one_partition(tmp_path, {"log.segment.bytes": 3 * size + size // 2})
    stored = produce(state, plog, [batch(i) for i in range(10)])
    files = segment_files(pdir(tmp_path))
    # 3 batches fit, a 4th would exceed: segments start at offsets 0, 3, 6, 9.
    assert [f.name for f in files] == [f"{o:020d}.log" for o in (0, 3, 6, 9)]
    assert [s.base_offset for s in plog.segments] == [0, 3, 6, 9]
    for f in files:
        assert f.stat().st_size <= 3 * size + size // 2
        assert f.with_suffix(".index").exists()
    assert b"".join(f.read_bytes() for f in files) == b"".join(stored)
    # Each segment file starts with the batch at its base offset.
    for f in files:
        assert read_header(f.read_bytes()).base_offset == int(f.stem)
    assert_log_is(plog, stored)


def test_reads_walk_across_segments(tmp_path):
    size = len(batch(0))
    state, plog = one_partition(tmp_path, {"log.segment.bytes": 2 * size})
    stored = produce(state, plog, [batch(i) for i in range(7)])
    assert len(plog.segments) == 4
    # A read ends at its segment's end; the next read continues in the next segment.
    assert split_batches(plog.read(0, 1 << 20, plog.high_watermark, True)) == stored[0:2]
    assert split_batches(plog.read(2, 1 << 20, plog.high_watermark, True)) == stored[2:4]
    assert split_batches(plog.read(6, 1 << 20, plog.high_watermark, True)) == stored[6:7]
    assert_log_is(plog, stored)


def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    state, plog = one_partition(tmp_path, {"log.segment.bytes": 200})
    stored = produce(state, plog, [batch(0, size=10), batch(1, size=500), batch(2, size=10), batch(3, size=10)])
    assert [s.base_offset for s in plog.segments] == [0, 1, 2]
    assert [len(split_batches(f.read_bytes())) for f in segment_files(pdir(tmp_path))] == [1, 1, 2]
    assert_log_is(plog, stored)


def expected_index(batches: list[bytes], base_offset: int, interval: int) -> list[tuple[int, int]]:
    """One entry for the first batch, then one for the first batch at least
    `interval` bytes after the previous entry."""
    entries: list[tuple[int, int]] = []
    pos = 0
    for b in batches:
        if not entries or pos - entries[-1][1] >= interval:
            entries.append((base_of(b) - base_offset, pos))
        pos += len(b)
    return entries


@pytest.mark.parametrize("interval_batches", [0, 1, 3])
def test_sparse_index_has_an_entry_per_interval_of_log(tmp_path, interval_batches):
    size = len(batch(0, records=2))
    interval = interval_batches * size
    state, plog = one_partition(tmp_path, {"log.segment.bytes": 10 * size, "log.index.interval.bytes": interval})
    stored = produce(state, plog, [batch(i, records=2) for i in range(25)])
    by_segment: dict[int, list[bytes]] = {}
    for seg in plog.segments:
        by_segment[seg.base_offset] = [b for b in stored if seg.base_offset <= base_of(b) < seg.next_offset]
    for path in segment_files(pdir(tmp_path), ".index"):
        base = int(path.stem)
        entries = index_entries(path)
        assert entries == expected_index(by_segment[base], base, interval)
        if interval_batches:
            assert len(entries) == -(-len(by_segment[base]) // interval_batches)
        # Each entry names the batch that starts at its position.
        log_bytes = path.with_suffix(".log").read_bytes()
        for rel, pos in entries:
            assert read_header(log_bytes, pos).base_offset == base + rel


def test_reopening_loads_the_index_of_a_flushed_segment(tmp_path, monkeypatch):
    size = len(batch(0))
    settings = {"log.segment.bytes": 4 * size, "log.index.interval.bytes": size}
    state, plog = one_partition(tmp_path, settings)
    stored = produce(state, plog, [batch(i) for i in range(10)])
    before = {p.name: p.read_bytes() for p in segment_files(pdir(tmp_path), ".index")}
    loaded_before = [(s.base_offset, list(s.index_offsets), list(s.index_positions)) for s in plog.segments]
    state.shutdown()

    rebuilt = spy_on_rebuild(monkeypatch)
    state, plog = reopen(tmp_path, settings)
    # Segments below the recovery point are trusted with their index; only the
    # active segment is scanned.
    assert rebuilt == [8]
    assert [(s.base_offset, list(s.index_offsets), list(s.index_positions)) for s in plog.segments] == loaded_before
    assert {p.name: p.read_bytes() for p in segment_files(pdir(tmp_path), ".index")} == before
    assert_log_is(plog, stored)
    # Appends after the reopen go on indexing as before.
    stored += produce(state, plog, [batch(i) for i in range(10, 14)])
    assert_log_is(plog, stored)
    last = plog.segments[-1]
    assert index_entries(pdir(tmp_path) / f"{last.base_offset:020d}.index") == expected_index(
        [b for b in stored if base_of(b) >= last.base_offset], last.base_offset, size)
    state.shutdown()


# --- recovery: torn tails ------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 11, 12, 40, HEADER_SIZE - 1, HEADER_SIZE, -1])
@pytest.mark.parametrize("clean", [True, False])
def test_torn_last_batch_is_cut_and_every_complete_batch_kept(tmp_path, keep, clean):
    size = len(batch(0, records=3))
    settings = {"log.segment.bytes": 5 * size, "log.index.interval.bytes": 0}
    state, plog = one_partition(tmp_path, settings)
    stored = produce(state, plog, [batch(i, records=3) for i in range(13)])
    state.shutdown() if clean else crash(state)
    last = segment_files(pdir(tmp_path))[-1]
    torn = stored[-1]
    end = last.stat().st_size - len(torn)
    with open(last, "r+b") as f:
        f.truncate(end + (keep if keep > 0 else len(torn) + keep))

    state, plog = reopen(tmp_path, settings)
    assert_log_is(plog, stored[:-1])
    assert last.stat().st_size == end
    assert all(pos < end for _, pos in index_entries(last.with_suffix(".index")))
    # The log goes on at the cut: the torn batch's offsets are given again.
    again = produce(state, plog, [batch(99, records=3)])
    assert base_of(again[0]) == base_of(torn)
    assert_log_is(plog, stored[:-1] + again)
    state.shutdown()


@pytest.mark.parametrize("garbage", [
    pytest.param(b"\x00", id="one-zero"),
    pytest.param(b"\x00" * 4096, id="zero-page"),
    pytest.param(random.Random(1).randbytes(37), id="random-short"),
    pytest.param(random.Random(2).randbytes(5000), id="random-long"),
    pytest.param(batch(7)[:HEADER_SIZE], id="lone-header"),
    pytest.param(struct.pack(">qi", 99, 10_000) + bytes(60), id="huge-length"),
    pytest.param(struct.pack(">qi", 99, 3) + bytes(60), id="tiny-length"),
])
def test_garbage_after_the_last_batch_is_cut_exactly(tmp_path, garbage):
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i, records=2) for i in range(6)])
    crash(state)
    path = pdir(tmp_path) / "00000000000000000000.log"
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(garbage)
    state, plog = reopen(tmp_path)
    assert path.stat().st_size == size
    assert_log_is(plog, stored)
    more = produce(state, plog, [batch(6)])
    assert_log_is(plog, stored + more)
    state.shutdown()


# --- recovery: corrupt batches -------------------------------------------------------------------


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def locate(directory: Path, offset: int) -> tuple[Path, int]:
    """The segment file and byte position of the batch whose base offset is `offset`."""
    for path in segment_files(directory):
        data = path.read_bytes()
        for pos, header in iter_headers(data):
            if header.base_offset == offset:
                return path, pos
    raise AssertionError(f"no batch at offset {offset}")


# Byte positions inside a batch, relative to its start; all but the first two are under the CRC.
FIELDS = {
    "magic": 16,
    "crc": 17,
    "attributes": 22,
    "last-offset-delta": 26,
    "base-timestamp": 34,
    "producer-id": 50,
    "record-count": HEADER_SIZE - 1,
    "record-body": HEADER_SIZE + 3,
    "batch-length-low": 11,
    "batch-length-high": 8,
}


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("victim", [4, 6, 11])  # mid-segment, first of a segment, the very last
def test_corrupt_batch_in_the_unflushed_log_is_cut_with_everything_after_it(tmp_path, field, victim):
    size = len(batch(0, records=2))
    settings = {"log.segment.bytes": 3 * size, "log.index.interval.bytes": 0}
    state, plog = one_partition(tmp_path, settings)
    stored = produce(state, plog, [batch(i, records=2) for i in range(12)])
    crash(state)  # the checkpoint still says 0: everything is unflushed
    victim_offset = base_of(stored[victim])
    path, pos = locate(pdir(tmp_path), victim_offset)
    flip(path, pos + FIELDS[field], 0x80 if field == "batch-length-high" else 0x01)
    later = [p for p in segment_files(pdir(tmp_path)) if p.name > path.name]

    state, plog = reopen(tmp_path, settings)
    assert_log_is(plog, stored[:victim])
    assert path.stat().st_size == pos
    for p in later:
        assert not p.exists(), f"{p.name} after the corrupt batch was kept"
        assert not p.with_suffix(".index").exists()
    assert [s.base_offset for s in plog.segments] == [int(p.stem) for p in segment_files(pdir(tmp_path))]
    # New appends take the offsets the cut batches had.
    again = produce(state, plog, [batch(50, records=2)])
    assert base_of(again[0]) == victim_offset
    assert_log_is(plog, stored[:victim] + again)
    state.shutdown()


def test_corruption_above_the_recovery_point_is_cut_and_the_flushed_part_is_not_rescanned(tmp_path, monkeypatch):
    size = len(batch(0))
    settings = {"log.segment.bytes": 3 * size}
    state, plog = one_partition(tmp_path, settings)
    flushed = produce(state, plog, [batch(i) for i in range(6)])
    state.shutdown()  # recovery point 6
    state, plog = reopen(tmp_path, settings)
    unflushed = produce(state, plog, [batch(i) for i in range(6, 15)])
    crash(state)
    path, pos = locate(pdir(tmp_path), 10)
    flip(path, pos + HEADER_SIZE + 2)

    rebuilt = spy_on_rebuild(monkeypatch)
    state, plog = reopen(tmp_path, settings)
    assert rebuilt == [6, 9]  # the segments at or above the recovery point, up to the cut
    assert_log_is(plog, flushed + unflushed[:4])
    assert [s.base_offset for s in plog.segments] == [0, 3, 6, 9]
    assert not (pdir(tmp_path) / f"{12:020d}.log").exists()
    state.shutdown()


def test_corrupt_base_offset_in_the_unflushed_log_is_cut(tmp_path):
    # The base offset lies outside the CRC, so the CRC cannot catch a flipped
    # bit there; a recovered log must still have each batch at the offset
    # where the previous one ended, or fetches skip and repeat offsets.
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i, records=2) for i in range(5)])
    crash(state)
    path, pos = locate(pdir(tmp_path), 4)
    flip(path, pos + 7, 0x40)  # offset 4 becomes 68
    state, plog = reopen(tmp_path)
    assert_log_is(plog, stored[:2])


# --- recovery: indexes ---------------------------------------------------------------------------


def corrupt_index(path: Path, how: str) -> None:
    raw = path.read_bytes()
    entries = index_entries(path)
    if how == "deleted":
        path.unlink()
    elif how == "emptied":
        path.write_bytes(b"")
    elif how == "torn-entry":
        path.write_bytes(raw[:-3])
    elif how == "zero-filled":
        path.write_bytes(bytes(len(raw)))
    elif how == "zero-tail":
        path.write_bytes(raw + bytes(4 * INDEX_ENTRY.size))
    elif how == "garbage":
        path.write_bytes(random.Random(3).randbytes(len(raw)))
    elif how == "entry-past-the-end":
        path.write_bytes(raw + INDEX_ENTRY.pack(entries[-1][0] + 1, 10**6))
    elif how == "swapped":
        entries[1], entries[2] = entries[2], entries[1]
        path.write_bytes(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
    elif how == "last-mid-batch":
        entries[-1] = (entries[-1][0], entries[-1][1] + 5)
        path.write_bytes(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
    elif how == "middle-mid-batch":
        entries[1] = (entries[1][0], entries[1][1] + 10)
        path.write_bytes(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
    elif how == "wrong-offset":
        entries[2] = (entries[1][0], entries[2][1])
        path.write_bytes(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
    else:
        raise AssertionError(how)


INDEX_DAMAGE = ["deleted", "emptied", "torn-entry", "zero-filled", "zero-tail", "garbage",
                "entry-past-the-end", "swapped", "last-mid-batch", "middle-mid-batch", "wrong-offset"]


@pytest.mark.parametrize("how", INDEX_DAMAGE)
def test_damaged_index_of_a_flushed_segment_is_rebuilt(tmp_path, how):
    size = len(batch(0, records=2))
    settings = {"log.segment.bytes": 6 * size, "log.index.interval.bytes": size}
    state, plog = one_partition(tmp_path, settings)
    stored = produce(state, plog, [batch(i, records=2) for i in range(15)])
    state.shutdown()
    first = pdir(tmp_path) / f"{0:020d}.index"
    good = first.read_bytes()
    assert len(index_entries(first)) == 6
    corrupt_index(first, how)

    state, plog = reopen(tmp_path, settings)
    assert_log_is(plog, stored)
    assert first.read_bytes() == good
    state.shutdown()


@pytest.mark.parametrize("how", ["deleted", "garbage", "torn-entry", "middle-mid-batch"])
def test_damaged_index_of_the_active_segment_is_rebuilt(tmp_path, how):
    size = len(batch(0))
    settings = {"log.index.interval.bytes": size}
    state, plog = one_partition(tmp_path, settings)
    stored = produce(state, plog, [batch(i) for i in range(6)])
    crash(state)
    index = pdir(tmp_path) / f"{0:020d}.index"
    good = index.read_bytes()
    corrupt_index(index, how)
    state, plog = reopen(tmp_path, settings)
    assert_log_is(plog, stored)
    assert index.read_bytes() == good
    state.shutdown()


def test_an_index_without_its_log_is_removed(tmp_path):
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i) for i in range(3)])
    state.shutdown()
    orphan = pdir(tmp_path) / f"{500:020d}.index"
    orphan.write_bytes(INDEX_ENTRY.pack(0, 0))
    state, plog = reopen(tmp_path)
    assert not orphan.exists()
    assert_log_is(plog, stored)
    state.shutdown()


# --- the recovery checkpoint ---------------------------------------------------------------------


def read_checkpoint(data_dir: Path) -> tuple[list[str], dict[tuple[str, int], int]]:
    lines = (data_dir / CHECKPOINT_FILE).read_text().splitlines()
    points = {}
    for line in lines[2:]:
        topic, partition, offset = line.split()
        points[(topic, int(partition))] = int(offset)
    return lines, points


def test_checkpoint_is_written_at_shutdown_and_read_at_start(tmp_path):
    data = tmp_path / "data"
    state = open_broker(data)
    a = state.create_topic("a", 2)
    state.create_topic("b.x_y-z", 1)
    lines, points = read_checkpoint(data)
    assert lines[:2] == ["0", "3"]
    assert points == {("a", 0): 0, ("a", 1): 0, ("b.x_y-z", 0): 0}
    produce(state, a.partitions[0], [batch(i, records=3) for i in range(4)])
    produce(state, a.partitions[1], [batch(i) for i in range(2)])
    # Appended but not flushed: the checkpoint on disk does not move.
    assert read_checkpoint(data)[1][("a", 0)] == 0
    state.shutdown()
    lines, points = read_checkpoint(data)
    assert lines[:2] == ["0", "3"] and len(lines) == 5
    assert points == {("a", 0): 12, ("a", 1): 2, ("b.x_y-z", 0): 0}
    assert not (data / (CHECKPOINT_FILE + ".tmp")).exists()

    state = open_broker(data)
    assert state.partition("a", 0).recovery_point == 12
    assert state.partition("a", 1).recovery_point == 2
    assert state.partition("b.x_y-z", 0).recovery_point == 0
    assert state.partition("a", 0).log_end_offset == 12
    state.shutdown()


def test_checkpoint_written_after_a_flush_survives_a_crash(tmp_path):
    data = tmp_path / "data"
    state, plog = one_partition(tmp_path)
    produce(state, plog, [batch(i) for i in range(5)])
    plog.flush()
    state.write_checkpoint()
    produce(state, plog, [batch(i) for i in range(5, 8)])
    crash(state)
    assert read_checkpoint(data)[1] == {("t", 0): 5}
    state, plog = reopen(tmp_path)
    assert plog.recovery_point == 5
    assert plog.log_end_offset == 8
    state.shutdown()
    assert read_checkpoint(data)[1] == {("t", 0): 8}


def test_flush_interval_messages_moves_the_recovery_point(tmp_path):
    state, plog = one_partition(tmp_path, {"log.flush.interval.messages": 4})
    produce(state, plog, [batch(i, records=3) for i in range(1)])
    assert plog.recovery_point == 0
    produce(state, plog, [batch(1, records=3)])
    assert plog.recovery_point == 6
    crash(state)


def test_a_checkpoint_beyond_the_log_end_is_clamped(tmp_path):
    data = tmp_path / "data"
    state, plog = one_partition(tmp_path)
    stored = produce(state, plog, [batch(i) for i in range(4)])
    state.shutdown()
    (data / CHECKPOINT_FILE).write_text("0\n1\nt 0 1000\n")
    state, plog = reopen(tmp_path)
    assert plog.recovery_point == 4
    assert_log_is(plog, stored)
    state.shutdown()


# --- timestamps ----------------------------------------------------------------------------------




def timed_batch(timestamps: list[int]) -> bytes:
    """An uncompressed batch with one record per timestamp (CreateTime)."""
    base = timestamps[0]
    body = bytearray()
    for delta, ts in enumerate(timestamps):
        value = b"v%d" % delta
        rec = b"\x00" + encode_varint(ts - base) + encode_varint(delta) + encode_varint(-1) + encode_varint(len(value)) + value + encode_varint(0)
        body += encode_varint(len(rec)) + rec
    n = len(timestamps)
    out = bytearray(HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD + len(body), -1, MAGIC_V2, 0, 0, n - 1,
                                base, max(timestamps), -1, -1, -1, n)) + body
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


BATCH_TIMESTAMPS = [[100, 300, 200], [150, 400, 400], [50], [400, 120], [10, 20, 30]]


def record_times() -> list[tuple[int, int]]:
    flat = [ts for b in BATCH_TIMESTAMPS for ts in b]
    return list(enumerate(flat))


def test_offset_for_timestamp_is_the_first_record_at_or_after_it(tmp_path):
    state, plog = one_partition(tmp_path, {"log.segment.bytes": 150})
    produce(state, plog, [timed_batch(ts) for ts in BATCH_TIMESTAMPS])
    assert len(plog.segments) > 1
    records = record_times()
    for hw in (plog.log_end_offset, 6, 3, 0):
        plog.high_watermark = hw
        visible = [(o, ts) for o, ts in records if o < hw]
        for target in sorted({ts for _, ts in records} | {0, 1, 99, 101, 299, 301, 399, 401, 10**12}):
            expected = next(((o, ts) for o, ts in visible if ts >= target), None)
            assert plog.offset_for_timestamp(target) == expected, (hw, target)
    state.shutdown()


def test_spot_values_of_offset_for_timestamp(tmp_path):
    state, plog = one_partition(tmp_path)
    produce(state, plog, [timed_batch(ts) for ts in BATCH_TIMESTAMPS])
    assert plog.offset_for_timestamp(0) == (0, 100)
    assert plog.offset_for_timestamp(150) == (1, 300)  # offset 1 holds the first time >= 150
    assert plog.offset_for_timestamp(301) == (4, 400)
    assert plog.offset_for_timestamp(401) is None
    state.shutdown()


def test_max_timestamp_is_the_first_record_with_the_largest_time(tmp_path):
    state, plog = one_partition(tmp_path, {"log.segment.bytes": 150})
    assert plog.max_timestamp() is None
    assert plog.offset_for_timestamp(0) is None
    produce(state, plog, [timed_batch(ts) for ts in BATCH_TIMESTAMPS])
    assert plog.max_timestamp() == (4, 400)
    records = record_times()
    # The high watermark always lies at a batch boundary.
    for hw in (12, 9, 7, 6, 3, 0):
        plog.high_watermark = hw
        visible = [(o, ts) for o, ts in records if o < hw]
        expected = max(visible, key=lambda r: (r[1], -r[0])) if visible else None
        assert plog.max_timestamp() == expected, hw
    state.shutdown()


def test_timestamps_survive_a_restart(tmp_path):
    state, plog = one_partition(tmp_path)
    produce(state, plog, [timed_batch(ts) for ts in BATCH_TIMESTAMPS])
    state.shutdown()
    state, plog = reopen(tmp_path)
    assert plog.max_timestamp() == (4, 400)
    assert plog.offset_for_timestamp(301) == (4, 400)
    state.shutdown()


def test_log_append_time_is_what_timestamp_lookups_see(tmp_path):
    # With LogAppendTime every record of a batch carries the broker's append
    # time (the batch's max timestamp), as Kafka's consumers and ListOffsets see it.
    state, plog = one_partition(tmp_path, {"log.message.timestamp.type": "LogAppendTime"})
    first = state.append(plog, timed_batch([100, 200]))
    second = state.append(plog, timed_batch([300]))
    assert first.log_append_time > 10**12 and second.log_append_time >= first.log_append_time
    stored = read_all(plog)
    assert [read_header(b).max_timestamp for b in stored] == [first.log_append_time, second.log_append_time]
    for b in stored:
        check_batch(b)
    assert plog.offset_for_timestamp(first.log_append_time) == (0, first.log_append_time)
    assert plog.max_timestamp() in {(0, first.log_append_time), (2, second.log_append_time)}
    assert plog.max_timestamp()[1] == second.log_append_time
    state.shutdown()


# --- property: any torn last segment ---------------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 300)), min_size=1, max_size=20),
    segment_bytes=st.integers(14, 1500),
    interval=st.integers(0, 600),
    data=st.data(),
)
def test_any_cut_of_the_last_segment_keeps_exactly_the_batches_before_it(shapes, segment_bytes, interval, data):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        config = make_config(Path(tmp), {"log.segment.bytes": segment_bytes, "log.index.interval.bytes": interval})
        plog = PartitionLog(directory, config)
        stored = []
        for i, (records, size) in enumerate(shapes):
            out = with_offsets(batch(i, records, size), plog.log_end_offset, plog.leader_epoch)
            plog.append(out, read_header(out))
            stored.append(bytes(out))
        files = segment_files(directory)
        assert b"".join(f.read_bytes() for f in files) == b"".join(stored)
        recovery_point = data.draw(st.integers(0, plog.log_end_offset), label="recovery_point")
        plog.close()

        last = files[-1]
        last_base = int(last.stem)
        cut = data.draw(st.integers(0, last.stat().st_size), label="cut")
        os.truncate(last, cut)
        expected = [b for b in stored if base_of(b) < last_base]
        end = 0
        for b in stored:
            if base_of(b) >= last_base and end + len(b) <= cut:
                expected.append(b)
                end += len(b)
            elif base_of(b) >= last_base:
                break

        plog = PartitionLog(directory, config, recovery_point)
        try:
            assert read_all(plog) == expected
            assert plog.log_end_offset == (read_header(expected[-1]).next_offset if expected else 0)
            assert last.stat().st_size == end
            assert [f.name for f in segment_files(directory)] == [f.name for f in files]
            # The log goes on from where it was cut.
            out = with_offsets(batch(999), plog.log_end_offset, plog.leader_epoch)
            plog.append(out, read_header(out))
            plog.high_watermark = plog.log_end_offset
            assert read_all(plog) == expected + [bytes(out)]
        finally:
            plog.close()
