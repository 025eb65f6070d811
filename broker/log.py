"""One partition's log on disk: segments, offset indexes, recovery, flushing.

In: record batches to append (already validated and given their offsets by
the caller's `PartitionLog.append`), reads by offset, flush requests.
Out: files laid out as Kafka lays them out, one directory per partition:

    <data-dir>/<topic>-<partition>/00000000000000000000.log    record batches
    <data-dir>/<topic>-<partition>/00000000000000000000.index  (relative offset, position) pairs

A segment is rolled when the next batch would make it larger than
`log.segment.bytes`. The index is sparse: one entry per `log.index.interval.bytes`
of log. Data reaches the disk by fsync only as `log.flush.interval.messages`
and `log.flush.interval.ms` say; otherwise it sits in the OS page cache, as
with Kafka, and a power cut may take it.

On open, the segments at or above the recovery point (the offset up to which
everything was fsynced, kept in the data directory's
`recovery-point-offset-checkpoint`) are scanned: every batch's CRC is checked
and the log is cut at the first torn or corrupt batch.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .epochs import LeaderEpochCache
from .producer_state import ProducerStateTable
from .records import HEADER_SIZE, MAGIC_V2, BatchHeader, CorruptBatch, check_batch, decode_records, iter_headers, read_header

log = logging.getLogger("faultline.broker.log")

INDEX_ENTRY = struct.Struct(">ii")
SCAN_CHUNK = 1 << 20


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class Segment:
    def __init__(self, directory: Path, base_offset: int, index_interval: int):
        self.base_offset = base_offset
        self.log_path = directory / segment_name(base_offset, ".log")
        self.index_path = directory / segment_name(base_offset, ".index")
        self.index_interval = index_interval
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.index_offsets = array("q")
        self.index_positions = array("q")
        self.bytes_since_index = 0
        self.next_offset = base_offset

    # -- writing ---------------------------------------------------------------

    def append(self, data: bytes | bytearray, header: BatchHeader) -> None:
        position = self.size
        os.pwrite(self.fd, data, position)
        self.size += len(data)
        if not self.index_offsets or self.bytes_since_index >= self.index_interval:
            self._add_index_entry(header.base_offset, position)
            self.bytes_since_index = 0
        self.bytes_since_index += len(data)
        self.next_offset = header.next_offset

    def _add_index_entry(self, offset: int, position: int) -> None:
        entry = INDEX_ENTRY.pack(offset - self.base_offset, position)
        os.pwrite(self.index_fd, entry, len(self.index_offsets) * INDEX_ENTRY.size)
        self.index_offsets.append(offset)
        self.index_positions.append(position)

    def flush(self) -> None:
        os.fsync(self.fd)
        os.fsync(self.index_fd)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.index_fd)

    def delete(self) -> None:
        self.close()
        self.log_path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)

    def truncate(self, position: int, next_offset: int) -> None:
        """Cut the segment at byte `position`; `next_offset` is then its end offset."""
        os.ftruncate(self.fd, position)
        self.size = position
        keep = bisect.bisect_left(self.index_positions, position)
        del self.index_offsets[keep:]
        del self.index_positions[keep:]
        os.ftruncate(self.index_fd, keep * INDEX_ENTRY.size)
        self.bytes_since_index = position - (self.index_positions[-1] if keep else 0)
        self.next_offset = next_offset

    # -- reading ---------------------------------------------------------------

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    def scan(self, start: int = 0, check: bool = False) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of each batch from `start`; with `check`,
        raise CorruptBatch at the first batch whose CRC or framing is bad.
        Stops quietly at a torn batch at the end of the file."""
        pos = start
        while pos < self.size:
            chunk = self.read(pos, max(SCAN_CHUNK, HEADER_SIZE))
            consumed = 0
            for rel, header in iter_headers(chunk):
                if check:
                    check_batch(chunk, rel)
                yield pos + rel, header
                consumed = rel + header.size
            if consumed == 0:
                if len(chunk) >= HEADER_SIZE:
                    header = read_header(chunk)
                    if header.size > len(chunk) and pos + header.size <= self.size:
                        # One batch larger than the chunk: read it whole.
                        whole = self.read(pos, header.size)
                        if check:
                            check_batch(whole)
                        yield pos, header
                        pos += header.size
                        continue
                    if check and header.batch_length < HEADER_SIZE - 12:
                        raise CorruptBatch(f"batch length {header.batch_length} is too small")
                raise CorruptBatch(f"torn batch at byte {pos} of {self.log_path.name}")
            pos += consumed

    def rebuild(self, check: bool) -> None:
        """Rebuild the index from the log; cut the log at the first bad batch."""
        self.index_offsets = array("q")
        self.index_positions = array("q")
        os.ftruncate(self.index_fd, 0)
        self.bytes_since_index = 0
        end = 0
        self.next_offset = self.base_offset
        try:
            for pos, header in self.scan(0, check=check):
                if check and header.base_offset != self.next_offset:
                    # The base offset lies outside the CRC: a flipped bit there shows only as a jump.
                    raise CorruptBatch(f"batch at byte {pos} starts at offset {header.base_offset}, "
                                       f"not {self.next_offset}")
                if not self.index_offsets or self.bytes_since_index >= self.index_interval:
                    self._add_index_entry(header.base_offset, pos)
                    self.bytes_since_index = 0
                self.bytes_since_index += header.size
                end = pos + header.size
                self.next_offset = header.next_offset
        except CorruptBatch as exc:
            log.warning("recovery: %s: %s; cutting %d bytes at byte %d",
                        self.log_path, exc, self.size - end, end)
            os.ftruncate(self.fd, end)
            self.size = end

    def load_index(self) -> bool:
        """Load the index file; False when it does not match the log."""
        raw = os.pread(self.index_fd, os.fstat(self.index_fd).st_size, 0)
        if len(raw) % INDEX_ENTRY.size:
            return False
        last_pos = -1
        for rel, pos in INDEX_ENTRY.iter_unpack(raw):
            if pos <= last_pos or pos > self.size - HEADER_SIZE or rel < 0:
                return False
            # Each entry must point at the start of the batch it names.
            header = read_header(self.read(pos, HEADER_SIZE))
            if header.magic != MAGIC_V2 or header.base_offset != self.base_offset + rel:
                return False
            self.index_offsets.append(self.base_offset + rel)
            self.index_positions.append(pos)
            last_pos = pos
        if self.size and not self.index_offsets:
            return False
        # Find the end offset from the last indexed batch onwards.
        start = self.index_positions[-1] if self.index_positions else 0
        end = start
        try:
            for pos, header in self.scan(start):
                self.next_offset = header.next_offset
                end = pos + header.size
        except CorruptBatch:
            return False
        if end != self.size:
            return False
        self.bytes_since_index = end - start
        return True

    def position_of(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset >= offset."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        start = self.index_positions[i] if i >= 0 else 0
        for pos, header in self.scan(start):
            if header.last_offset >= offset:
                return pos, header
        return None


@dataclass
class ReadResult:
    data: bytes
    first_offset: int


class PartitionLog:
    """The log of one topic-partition."""

    def __init__(self, directory: Path, config, recovery_point: int = 0):
        self.directory = directory
        self.config = config
        self.segments: list[Segment] = []
        self.producers = ProducerStateTable()
        self.recovery_point = recovery_point
        self.unflushed_messages = 0
        self.last_flush_time = time.monotonic()
        self.leader_epoch = 0
        # True while this log's replica set is itself alone (standalone, or an ISR of one):
        # an append then moves the high watermark at once.
        self.hw_follows_leo = True
        self._directory_dirty = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        self.epochs = LeaderEpochCache(directory)
        self._open()
        self.high_watermark = self.log_end_offset

    # -- open and recover --------------------------------------------------------

    def _open(self) -> None:
        interval = self.config["log.index.interval.bytes"]
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for base in bases:
            self.segments.append(Segment(self.directory, base, interval))
        for orphan in self.directory.glob("*.index"):
            if not orphan.stem.isdigit() or int(orphan.stem) not in bases:
                orphan.unlink()
        if not self.segments:
            self.segments.append(Segment(self.directory, 0, interval))
            return
        recovering = False
        for i, seg in enumerate(self.segments):
            next_base = self.segments[i + 1].base_offset if i + 1 < len(self.segments) else None
            if recovering:
                # Everything after a cut belongs to a torn tail.
                log.warning("recovery: %s lies after a corrupt batch; deleting it", seg.log_path)
                seg.delete()
                continue
            unflushed = next_base is None or next_base > self.recovery_point
            if unflushed or not seg.load_index():
                before = seg.size
                seg.rebuild(check=True)
                if seg.size != before:
                    recovering = True
            if next_base is not None and seg.next_offset != next_base and not recovering:
                log.warning("recovery: %s ends at offset %d but the next segment starts at %d",
                            seg.log_path, seg.next_offset, next_base)
        self.segments = [s for s in self.segments if s.log_path.exists()]
        self._scan_state()
        self.recovery_point = min(self.recovery_point, self.log_end_offset)

    def _scan_state(self) -> None:
        """Rebuild the producer table and the epoch cache from the batches on disk."""
        stored = self.epochs.entries
        self.producers = ProducerStateTable()
        scanned: list[tuple[int, int]] = []
        for seg in self.segments:
            for _, header in seg.scan():
                self.producers.record(header)
                if header.leader_epoch >= 0 and (not scanned or header.leader_epoch > scanned[-1][0]):
                    scanned.append((header.leader_epoch, header.base_offset))
        # Epochs begun after the last batch (a leader that has not written yet) are known only
        # from the checkpoint; anything starting beyond the log end came from a lost tail.
        last = scanned[-1][0] if scanned else -1
        end = self.log_end_offset
        scanned += [(e, o) for e, o in stored if e > last and o <= end]
        if scanned != stored:
            self.epochs.entries = scanned
            self.epochs.save()
        self.leader_epoch = max(self.leader_epoch, self.epochs.latest_epoch, 0)

    # -- state -------------------------------------------------------------------

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    # -- writing -----------------------------------------------------------------

    def append(self, batch: bytes | bytearray, header: BatchHeader) -> None:
        """Append one batch whose header already carries its base offset."""
        if header.base_offset != self.log_end_offset:
            raise ValueError(f"batch at {header.base_offset} appended at log end {self.log_end_offset}")
        seg = self.active
        if seg.size and seg.size + len(batch) > self.config["log.segment.bytes"]:
            seg = self.roll()
        seg.append(batch, header)
        self.producers.record(header)
        self.unflushed_messages += header.record_count
        if self.unflushed_messages >= self.config["log.flush.interval.messages"]:
            self.flush()

    def truncate_to(self, offset: int) -> int:
        """Cut the log so that nothing at or above `offset` remains (whole batches:
        a batch holding `offset` goes entirely). Returns the new log end offset."""
        if offset >= self.log_end_offset:
            return self.log_end_offset
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            self.segments.pop().delete()
            self._directory_dirty = True
        seg = self.active
        found = seg.position_of(offset)
        if found is not None:
            position, header = found
            seg.truncate(position, header.base_offset)
        # Before the rescan, which keeps checkpointed epochs that start at or below the log end.
        self.epochs.truncate_from_end(self.log_end_offset)
        self._scan_state()
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        log.info("truncated %s to offset %d", self.directory.name, self.log_end_offset)
        return self.log_end_offset

    def roll(self) -> Segment:
        old = self.active
        # Kafka flushes a rolled segment in the background; its data is then
        # below the recovery point and need not be scanned again.
        old.flush()
        seg = Segment(self.directory, self.log_end_offset, self.config["log.index.interval.bytes"])
        seg.next_offset = self.log_end_offset
        self.segments.append(seg)
        self._directory_dirty = True
        log.info("rolled %s at offset %d", self.directory.name, seg.base_offset)
        return seg

    def flush(self) -> None:
        for seg in self.segments:
            if seg.base_offset >= self.recovery_point or seg is self.active:
                seg.flush()
        if self._directory_dirty:
            # A new segment file survives a power cut only once its directory entry is on disk.
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._directory_dirty = False
        self.recovery_point = self.log_end_offset
        self.unflushed_messages = 0
        self.last_flush_time = time.monotonic()

    def flush_due(self, now: float) -> bool:
        """Whether the time-based flusher should fsync this log now. As Kafka's LogManager
        (flushDirtyLogs): once `log.flush.interval.ms` (unset: `log.flush.scheduler.interval.ms`)
        has passed since the last flush, and only when something was appended since."""
        interval = self.config["log.flush.interval.ms"] or self.config["log.flush.scheduler.interval.ms"]
        return self.unflushed_messages > 0 and (now - self.last_flush_time) * 1000 >= interval

    def close(self) -> None:
        for seg in self.segments:
            seg.close()

    # -- reading -----------------------------------------------------------------

    def _segment_for(self, offset: int) -> int:
        bases = [s.base_offset for s in self.segments]
        return max(bisect.bisect_right(bases, offset) - 1, 0)

    def read(self, offset: int, max_bytes: int, upper: int, min_one: bool) -> bytes:
        """Whole batches from the one containing `offset`, ending below `upper`,
        at most `max_bytes` unless `min_one` and the first batch is larger."""
        if offset >= upper or (max_bytes <= 0 and not min_one):
            return b""
        i = self._segment_for(offset)
        while i < len(self.segments):
            seg = self.segments[i]
            found = seg.position_of(offset)
            if found is not None:
                break
            i += 1
        else:
            return b""
        start, first = found
        if first.base_offset >= upper:
            return b""
        want = max_bytes
        if min_one and first.size > max_bytes:
            want = first.size
        chunk = seg.read(start, min(want, seg.size - start))
        end = 0
        for rel, header in iter_headers(chunk):
            if header.base_offset >= upper:
                break
            end = rel + header.size
        return chunk[:end]

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """First (offset, timestamp) whose record timestamp >= `timestamp`."""
        for seg in self.segments:
            for pos, header in seg.scan():
                if header.max_timestamp < timestamp or header.is_control:
                    continue
                if header.base_offset >= self.high_watermark:
                    return None
                batch = seg.read(pos, header.size)
                try:
                    for record in decode_records(batch):
                        if record.timestamp >= timestamp and record.offset < self.high_watermark:
                            return record.offset, record.timestamp
                except CorruptBatch:
                    # A codec the broker cannot decode: answer at batch granularity.
                    return header.base_offset, header.max_timestamp
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp."""
        best: tuple[Segment, int, BatchHeader] | None = None
        for seg in self.segments:
            for pos, header in seg.scan():
                if header.is_control or header.base_offset >= self.high_watermark:
                    continue
                if best is None or header.max_timestamp > best[2].max_timestamp:
                    best = (seg, pos, header)
        if best is None:
            return None
        seg, pos, header = best
        try:
            records = decode_records(seg.read(pos, header.size))
        except CorruptBatch:
            return header.last_offset, header.max_timestamp
        top = max(records, key=lambda r: (r.timestamp, -r.offset))
        return top.offset, top.timestamp
