"""Idempotent producer state of one partition.

In: each appended batch's producer id, epoch and sequence range (from its
header), and each incoming batch to judge. Out: a verdict for the incoming
batch: append it, answer it as a duplicate with the offset it got the first
time, or refuse it with Kafka's error.

As in Kafka, the last five batches of every producer are remembered, so a
retried batch among them is acknowledged again without a second append. A
producer with no state here may begin at any sequence (KIP-360); a known one
must go on from its last sequence, or start a new epoch at 0. The
table holds nothing that the log does not: a restarted broker rebuilds it by
replaying the batch headers of its log.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from .records import NO_PRODUCER_ID, NO_SEQUENCE, BatchHeader

BATCHES_REMEMBERED = 5
SEQUENCE_MODULUS = 2**31


class ProducerStateError(Exception):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class BatchMeta:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=BATCHES_REMEMBERED))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE


@dataclass
class Duplicate:
    """The batch was appended before: answer with its original offsets."""

    first_offset: int
    last_offset: int


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, header: BatchHeader) -> Duplicate | None:
        """Judge an incoming batch. None: append it. Duplicate: do not append.
        Raises ProducerStateError when Kafka would refuse it."""
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return None
        epoch, first, last = header.producer_epoch, header.base_sequence, header.last_sequence
        if first < 0:
            raise ProducerStateError(
                ErrorCode.invalid_record, f"producer {pid} sent a batch without a sequence number"
            )
        entry = self.producers.get(pid)
        if entry is None:
            # KIP-360, as Kafka 3.9 (ProducerAppendInfo.checkSequence): a producer this partition
            # holds no state for (new, or its batches all truncated away) may start at any sequence.
            return None
        if epoch < entry.epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"producer {pid} epoch {epoch} is older than the current epoch {entry.epoch} (fenced)",
            )
        if epoch > entry.epoch:
            if first != 0:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {pid} started epoch {epoch} at sequence {first}, not 0",
                )
            return None
        for meta in entry.batches:
            if meta.first_seq == first and meta.last_seq == last:
                return Duplicate(meta.first_offset, meta.last_offset)
        expected = (entry.last_seq + 1) % SEQUENCE_MODULUS
        if first != expected:
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid} epoch {epoch} sent sequence {first}; the next expected is {expected}",
            )
        return None

    def record(self, header: BatchHeader) -> None:
        """Remember an appended batch (header carries its assigned base offset)."""
        pid = header.producer_id
        if pid == NO_PRODUCER_ID or header.is_control:
            return
        entry = self.producers.get(pid)
        if entry is None or header.producer_epoch != entry.epoch:
            entry = self.producers[pid] = ProducerEntry(header.producer_epoch)
        entry.batches.append(
            BatchMeta(header.base_sequence, header.last_sequence, header.base_offset, header.last_offset)
        )

    def max_producer_id(self) -> int:
        return max(self.producers, default=-1)
