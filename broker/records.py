"""Record batches (message format v2) as raw bytes.

In: bytes holding one or more record batches, as a producer sends them or as
a segment file stores them. Out: the 61-byte batch headers, CRC checks, a
copy with a new base offset, and (for the rare callers that need individual
records, such as a ListOffsets by timestamp) the records themselves.

The broker never re-encodes a batch: it keeps what the producer sent and only
rewrites the fields outside the CRC (base offset, partition leader epoch).
"""

from __future__ import annotations

import gzip
import zlib
import struct
from typing import Iterator, NamedTuple

from crc32c import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
# Bytes before batchLength's count starts: baseOffset (8) + batchLength (4).
LOG_OVERHEAD = 12
CRC_START = 21  # the CRC covers attributes .. end of batch
MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1


class CorruptBatch(ValueError):
    """The bytes are not a valid v2 record batch."""


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % 2**31

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


def read_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def check_batch(buf: bytes | memoryview, pos: int = 0, limit: int | None = None) -> BatchHeader:
    """Validate the batch at `pos` fully (length, magic, CRC, counts); return its header."""
    end = len(buf) if limit is None else limit
    if end - pos < HEADER_SIZE:
        raise CorruptBatch(f"{end - pos} bytes are too few for a record batch header ({HEADER_SIZE})")
    header = read_header(buf, pos)
    if header.magic != MAGIC_V2:
        raise CorruptBatch(f"magic {header.magic} is not supported; only message format v2 is")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > end:
        raise CorruptBatch(
            f"batch length {header.batch_length} does not fit the {end - pos} bytes given"
        )
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptBatch("negative last offset delta or record count")
    if header.record_count != header.last_offset_delta + 1 and not header.is_control:
        # Compaction can leave gaps, but a producer's batch never has them.
        if header.record_count > header.last_offset_delta + 1:
            raise CorruptBatch(
                f"{header.record_count} records do not fit last offset delta {header.last_offset_delta}"
            )
    actual = crc32c(memoryview(buf)[pos + CRC_START : pos + header.size])
    if actual != header.crc:
        raise CorruptBatch(f"CRC32C mismatch: header says {header.crc:#010x}, bytes give {actual:#010x}")
    return header


def iter_headers(buf: bytes | memoryview, base_pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for every complete batch in `buf`; stop at a partial one."""
    pos = 0
    n = len(buf)
    while n - pos >= HEADER_SIZE:
        header = read_header(buf, pos)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > n:
            return
        yield base_pos + pos, header
        pos += header.size


def with_offsets(batch: bytes, base_offset: int, leader_epoch: int) -> bytearray:
    """A copy of `batch` with new base offset and leader epoch; both lie outside the CRC."""
    out = bytearray(batch)
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">i", out, 12, leader_epoch)
    return out


def set_log_append_time(batch: bytearray, timestamp_ms: int) -> None:
    """Stamp the broker's time on a batch (LogAppendTime) and recompute its CRC."""
    attributes = struct.unpack_from(">h", batch, CRC_START)[0] | TIMESTAMP_TYPE_BIT
    struct.pack_into(">h", batch, CRC_START, attributes)
    struct.pack_into(">q", batch, 35, timestamp_ms)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[CRC_START:]))


# --- individual records -----------------------------------------------------


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise CorruptBatch("record varint runs past the end of the batch")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptBatch("record varint is longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


def _bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = _varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buf):
        raise CorruptBatch("record field runs past the end of the batch")
    return bytes(buf[pos : pos + length]), pos + length


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise CorruptBatch(f"gzip body does not decompress: {exc}") from None
    names = {2: "snappy", 3: "lz4", 4: "zstd"}
    raise CorruptBatch(f"compression codec {names.get(codec, codec)} cannot be decoded by the broker")


def decode_records(batch: bytes | memoryview, pos: int = 0) -> list[Record]:
    """Decode the records of the batch at `pos` (uncompressed or gzip)."""
    header = read_header(batch, pos)
    body = _decompress(header.attributes & COMPRESSION_MASK, bytes(batch[pos + HEADER_SIZE : pos + header.size]))
    records = []
    p = 0
    log_append_time = bool(header.attributes & TIMESTAMP_TYPE_BIT)
    for _ in range(header.record_count):
        length, p = _varint(body, p)
        end = p + length
        p += 1  # attributes, unused in v2
        ts_delta, p = _varint(body, p)
        off_delta, p = _varint(body, p)
        key, p = _bytes(body, p)
        value, p = _bytes(body, p)
        n_headers, p = _varint(body, p)
        headers = []
        for _ in range(n_headers):
            hkey, p = _bytes(body, p)
            hval, p = _bytes(body, p)
            headers.append(((hkey or b"").decode("utf-8", "replace"), hval))
        if p != end:
            raise CorruptBatch("record length disagrees with its fields")
        # Under LogAppendTime every record carries the broker's time, kept in maxTimestamp.
        timestamp = header.max_timestamp if log_append_time else header.base_timestamp + ts_delta
        records.append(Record(header.base_offset + off_delta, timestamp, key, value, tuple(headers)))
    if p != len(body):
        raise CorruptBatch(f"{len(body) - p} bytes follow the batch's last record")
    return records


DECODABLE_CODECS = (0, 1)


def validate_records(batch: bytes | memoryview, pos: int = 0) -> None:
    """Raise CorruptBatch unless every record of the batch decodes and the offset
    deltas run 0, 1, 2, ... (as Kafka's log validator requires of a producer's batch).
    Batches in codecs the broker cannot decode are left to their CRC."""
    header = read_header(batch, pos)
    if header.attributes & COMPRESSION_MASK not in DECODABLE_CODECS:
        return
    records = decode_records(batch, pos)
    for i, record in enumerate(records):
        if record.offset != header.base_offset + i:
            raise CorruptBatch(f"record {i} has offset delta {record.offset - header.base_offset}, not {i}")


def encode_varint(value: int) -> bytes:
    """A zigzag varint, as records encode their lengths and deltas."""
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _encode_bytes(data: bytes | None) -> bytes:
    if data is None:
        return encode_varint(-1)
    return encode_varint(len(data)) + data


def encode_batch(
    values: list[tuple[bytes | None, bytes | None]],
    *,
    base_offset: int = 0,
    timestamp: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    attributes: int = 0,
) -> bytes:
    """Build an uncompressed v2 batch of (key, value) records. Used for control
    batches and by tests that speak the wire protocol directly."""
    body = bytearray()
    for delta, (key, value) in enumerate(values):
        rec = b"\x00" + encode_varint(0) + encode_varint(delta) + _encode_bytes(key) + _encode_bytes(value) + encode_varint(0)
        body += encode_varint(len(rec)) + rec
    n = len(values)
    header = bytearray(HEADER.pack(
        base_offset, HEADER_SIZE - LOG_OVERHEAD + len(body), -1, MAGIC_V2, 0, attributes,
        n - 1, timestamp, timestamp, producer_id, producer_epoch, base_sequence, n,
    ))
    out = header + body
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)
