"""Idempotent producers: in-sequence batches append, a retry of any of the last
five is answered with its first offsets and not stored twice, gaps, fenced
epochs and stale retries are refused with Kafka's errors, all of it survives
a restart (clean or not), and producer ids are never handed out twice."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from faultline.broker.config import load_config
from faultline.broker.producer_state import (
    BATCHES_REMEMBERED,
    Duplicate,
    ProducerStateError,
    ProducerStateTable,
)
from faultline.broker.records import CRC_START, BatchHeader, encode_batch, iter_headers, read_header, with_offsets
from faultline.broker.state import PRODUCER_ID_FILE, BrokerError, BrokerState

LISTEN = "127.0.0.1:9092"
SEQ_MOD = 2**31
OUT_OF_ORDER = ErrorCode.out_of_order_sequence_number
FENCED = ErrorCode.invalid_producer_epoch


# --- helpers --------------------------------------------------------------------------------


def open_broker(data_dir: Path, settings: dict[str, object] | None = None) -> BrokerState:
    overrides = [f"{k}={v}" for k, v in (settings or {}).items()]
    return BrokerState(load_config(1, LISTEN, data_dir, overrides=overrides))


def crash(state: BrokerState) -> None:
    """What a SIGKILL leaves: descriptors closed, nothing flushed, no checkpoint."""
    for topic in state.topics.values():
        for plog in topic.partitions.values():
            plog.close()


def pbatch(pid: int, epoch: int, seq: int, n: int = 1) -> bytes:
    values = [(None, b"p%d-e%d-s%d" % (pid, epoch, (seq + i) % SEQ_MOD)) for i in range(n)]
    return encode_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp=1000)


def log_bytes(plog) -> bytes:
    return b"".join(os.pread(s.fd, s.size, 0) for s in plog.segments)


def refuse(state: BrokerState, plog, raw: bytes, code: ErrorCode) -> str:
    end, before = plog.log_end_offset, log_bytes(plog)
    with pytest.raises(BrokerError) as info:
        state.append(plog, raw)
    assert info.value.code == code, str(info.value)
    assert plog.log_end_offset == end and log_bytes(plog) == before, "a refused batch was stored"
    return str(info.value)


def appended(state: BrokerState, plog, raw: bytes) -> tuple[int, int]:
    end = plog.log_end_offset
    result = state.append(plog, raw)
    assert not result.duplicate
    assert result.base_offset == end
    assert result.last_offset == end + read_header(raw).last_offset_delta
    return result.base_offset, result.last_offset


def duplicate(state: BrokerState, plog, raw: bytes) -> tuple[int, int]:
    end, before = plog.log_end_offset, log_bytes(plog)
    result = state.append(plog, raw)
    assert result.duplicate
    assert plog.log_end_offset == end and log_bytes(plog) == before, "a duplicate was stored again"
    return result.base_offset, result.last_offset


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


def one_partition(data_dir: Path, settings=None):
    state = open_broker(data_dir, settings)
    return state, state.create_topic("t", 1).partitions[0]


# --- sequences within one epoch ---------------------------------------------------------------


def test_in_sequence_batches_append_and_producers_are_independent(data_dir):
    state, plog = one_partition(data_dir)
    a, b = state.allocate_producer_id(), state.allocate_producer_id()
    assert appended(state, plog, pbatch(a, 0, 0, 3)) == (0, 2)
    assert appended(state, plog, pbatch(b, 0, 0, 2)) == (3, 4)
    assert appended(state, plog, pbatch(a, 0, 3, 1)) == (5, 5)
    assert appended(state, plog, pbatch(a, 0, 4, 5)) == (6, 10)
    assert appended(state, plog, pbatch(b, 0, 2, 1)) == (11, 11)
    headers = [h for _, h in iter_headers(log_bytes(plog))]
    assert [(h.producer_id, h.base_sequence, h.base_offset) for h in headers] == [
        (a, 0, 0), (b, 0, 3), (a, 3, 5), (a, 4, 6), (b, 2, 11)]
    state.shutdown()


def test_batches_without_a_producer_id_are_always_appended(data_dir):
    state, plog = one_partition(data_dir)
    raw = encode_batch([(None, b"same")])
    assert appended(state, plog, raw) == (0, 0)
    assert appended(state, plog, raw) == (1, 1)
    state.shutdown()


@pytest.mark.parametrize("back", range(1, BATCHES_REMEMBERED + 1))
def test_retry_of_any_of_the_last_five_batches_is_a_duplicate(data_dir, back):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    sent, offsets, seq = [], [], 0
    for i in range(9):
        raw = pbatch(pid, 0, seq, 1 + i % 3)
        offsets.append(appended(state, plog, raw))
        sent.append(raw)
        seq += 1 + i % 3
    assert duplicate(state, plog, sent[-back]) == offsets[-back]
    # Retrying again, and retrying the others, changes nothing.
    assert duplicate(state, plog, sent[-back]) == offsets[-back]
    for k in range(1, BATCHES_REMEMBERED + 1):
        assert duplicate(state, plog, sent[-k]) == offsets[-k]
    # The producer goes on where it was.
    assert appended(state, plog, pbatch(pid, 0, seq)) == (offsets[-1][1] + 1,) * 2
    state.shutdown()


@pytest.mark.parametrize("back", [BATCHES_REMEMBERED + 1, BATCHES_REMEMBERED + 2, 9])
def test_retry_older_than_the_last_five_is_out_of_order(data_dir, back):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    sent = [pbatch(pid, 0, seq) for seq in range(9)]
    for raw in sent:
        appended(state, plog, raw)
    refuse(state, plog, sent[-back], OUT_OF_ORDER)
    assert appended(state, plog, pbatch(pid, 0, 9)) == (9, 9)
    state.shutdown()


@pytest.mark.parametrize("first, n", [
    (4, 1),   # one sequence skipped
    (100, 2),  # far ahead
    (2, 1),   # inside the last batch, not a retry of it
    (1, 3),   # overlapping the last two batches
    (SEQ_MOD - 1, 1),
])
def test_a_sequence_gap_or_overlap_is_out_of_order(data_dir, first, n):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    appended(state, plog, pbatch(pid, 0, 0, 1))
    appended(state, plog, pbatch(pid, 0, 1, 2))  # sequences 1..2; next is 3
    message = refuse(state, plog, pbatch(pid, 0, first, n), OUT_OF_ORDER)
    assert "3" in message
    # A refusal leaves the producer's state as it was.
    assert appended(state, plog, pbatch(pid, 0, 3)) == (3, 3)
    state.shutdown()


@pytest.mark.parametrize("first", [1, 5, SEQ_MOD - 1])
def test_an_unknown_producer_may_start_at_any_sequence_as_kip_360_allows(data_dir, first):
    # Kafka 3.9 (ProducerAppendInfo.checkSequence): no state for the producer, so any first
    # sequence is taken; from then on the producer is known and must go on in sequence, and a
    # new epoch must start at 0.
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    assert appended(state, plog, pbatch(pid, 0, first)) == (0, 0)
    refuse(state, plog, pbatch(pid, 0, (first + 2) % SEQ_MOD), OUT_OF_ORDER)
    assert appended(state, plog, pbatch(pid, 0, (first + 1) % SEQ_MOD)) == (1, 1)
    refuse(state, plog, pbatch(pid, 3, first), OUT_OF_ORDER)
    assert appended(state, plog, pbatch(pid, 3, 0)) == (2, 2)
    state.shutdown()


def test_a_batch_claiming_more_offsets_than_records_is_refused(data_dir):
    # Kafka refuses a producer's batch whose last offset delta + 1 differs
    # from its record count ("Inconsistent batch offset range"): such a batch
    # would take offsets and sequence numbers that no record holds.
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    raw = bytearray(pbatch(pid, 0, 0, 1))
    struct.pack_into(">i", raw, 23, 9)  # last offset delta 9, record count still 1
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[CRC_START:])))
    refuse(state, plog, bytes(raw), ErrorCode.invalid_record)
    state.shutdown()


# --- epochs -----------------------------------------------------------------------------------


def test_an_older_epoch_is_fenced(data_dir):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    old = [pbatch(pid, 0, s) for s in range(3)]
    for raw in old:
        appended(state, plog, raw)
    assert appended(state, plog, pbatch(pid, 1, 0)) == (3, 3)
    message = refuse(state, plog, pbatch(pid, 0, 3), FENCED)
    assert "epoch" in message
    # Even a retry of a batch the old epoch had appended is fenced now.
    refuse(state, plog, old[-1], FENCED)
    refuse(state, plog, pbatch(pid, 0, 0), FENCED)
    assert appended(state, plog, pbatch(pid, 1, 1)) == (4, 4)
    state.shutdown()


@pytest.mark.parametrize("first", [1, 3, 4])
def test_a_new_epoch_must_start_at_sequence_zero(data_dir, first):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    for s in range(3):
        appended(state, plog, pbatch(pid, 0, s))
    refuse(state, plog, pbatch(pid, 1, first), OUT_OF_ORDER)
    # The refused bump changed nothing: epoch 0 goes on ...
    assert appended(state, plog, pbatch(pid, 0, 3)) == (3, 3)
    # ... until epoch 1 starts at 0; then epoch 1's sequence is its own.
    assert appended(state, plog, pbatch(pid, 1, 0, 2)) == (4, 5)
    assert duplicate(state, plog, pbatch(pid, 1, 0, 2)) == (4, 5)
    refuse(state, plog, pbatch(pid, 0, 4), FENCED)
    refuse(state, plog, pbatch(pid, 1, 3), OUT_OF_ORDER)
    assert appended(state, plog, pbatch(pid, 1, 2)) == (6, 6)
    state.shutdown()


# --- sequence wrap-around ------------------------------------------------------------------------


def seed(plog, raw: bytes) -> tuple[int, int]:
    """Put a batch straight into the log, as a long-lived producer's earlier
    appends would have left it (the table learns it as on log replay)."""
    out = with_offsets(raw, plog.log_end_offset, plog.leader_epoch)
    header = read_header(out)
    plog.append(out, header)
    plog.high_watermark = plog.log_end_offset
    return header.base_offset, header.last_offset


@pytest.mark.parametrize("restart", [None, "shutdown", "crash"])
def test_sequence_wraps_after_2_31_minus_1(data_dir, restart):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    seed(plog, pbatch(pid, 0, SEQ_MOD - 6, 4))  # sequences 2**31-6 .. 2**31-3
    wrapping = pbatch(pid, 0, SEQ_MOD - 2, 4)  # 2**31-2, 2**31-1, 0, 1
    assert read_header(wrapping).last_sequence == 1
    refuse(state, plog, pbatch(pid, 0, 0), OUT_OF_ORDER)  # not yet
    assert appended(state, plog, wrapping) == (4, 7)
    if restart:
        state.shutdown() if restart == "shutdown" else crash(state)
        state = open_broker(data_dir)
        plog = state.partition("t", 0)
    assert duplicate(state, plog, wrapping) == (4, 7)
    refuse(state, plog, pbatch(pid, 0, 0), OUT_OF_ORDER)
    refuse(state, plog, pbatch(pid, 0, SEQ_MOD - 1), OUT_OF_ORDER)
    assert appended(state, plog, pbatch(pid, 0, 2)) == (8, 8)
    state.shutdown()


def test_the_largest_sequence_is_followed_by_zero(data_dir):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    seed(plog, pbatch(pid, 0, SEQ_MOD - 3, 2))  # ... 2**31-2
    assert appended(state, plog, pbatch(pid, 0, SEQ_MOD - 1)) == (2, 2)
    refuse(state, plog, pbatch(pid, 0, 1), OUT_OF_ORDER)
    assert appended(state, plog, pbatch(pid, 0, 0)) == (3, 3)
    assert duplicate(state, plog, pbatch(pid, 0, SEQ_MOD - 1)) == (2, 2)
    state.shutdown()


# --- restarts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["shutdown", "crash"])
def test_producer_state_survives_a_restart(data_dir, how):
    settings = {"log.segment.bytes": 3 * len(pbatch(1, 0, 0, 2))}
    state, plog = one_partition(data_dir, settings)
    a, b = state.allocate_producer_id(), state.allocate_producer_id()
    sent, offsets = [], []
    for s in range(0, 16, 2):
        sent.append(pbatch(a, 0, s, 2))
        offsets.append(appended(state, plog, sent[-1]))
        if s % 4 == 0:
            appended(state, plog, pbatch(b, 0, s // 4))
    appended(state, plog, pbatch(b, 1, 0))  # b's epoch bumped
    assert len(plog.segments) > 3  # the last five batches of `a` lie in several segments
    end = plog.log_end_offset
    state.shutdown() if how == "shutdown" else crash(state)

    state = open_broker(data_dir, settings)
    plog = state.partition("t", 0)
    assert plog.log_end_offset == end
    for k in range(1, BATCHES_REMEMBERED + 1):
        assert duplicate(state, plog, sent[-k]) == offsets[-k]
    refuse(state, plog, sent[-BATCHES_REMEMBERED - 1], OUT_OF_ORDER)
    refuse(state, plog, pbatch(a, 0, 20), OUT_OF_ORDER)
    refuse(state, plog, pbatch(b, 0, 4), FENCED)
    assert appended(state, plog, pbatch(a, 0, 16)) == (end, end)
    assert appended(state, plog, pbatch(b, 1, 1)) == (end + 1, end + 1)
    state.shutdown()


def test_a_batch_lost_to_a_torn_tail_is_appended_again_when_retried(data_dir):
    state, plog = one_partition(data_dir)
    pid = state.allocate_producer_id()
    sent = [pbatch(pid, 0, s, 2) for s in range(0, 10, 2)]
    offsets = [appended(state, plog, raw) for raw in sent]
    crash(state)
    log_file = data_dir / "t-0" / f"{0:020d}.log"
    os.truncate(log_file, log_file.stat().st_size - 5)  # the last batch is torn

    state = open_broker(data_dir)
    plog = state.partition("t", 0)
    assert plog.log_end_offset == offsets[-1][0]
    # What survived is still a duplicate; the lost batch is the next in sequence.
    assert duplicate(state, plog, sent[-2]) == offsets[-2]
    assert appended(state, plog, sent[-1]) == offsets[-1]
    assert duplicate(state, plog, sent[-1]) == offsets[-1]
    state.shutdown()


# --- producer ids -------------------------------------------------------------------------------


def test_producer_ids_are_reserved_in_blocks_on_disk(data_dir):
    state = open_broker(data_dir, {"producer.id.block.size": 3})
    path = data_dir / PRODUCER_ID_FILE
    assert not path.exists()
    ids = []
    for expected_file in (3, 3, 3, 6, 6, 6, 9):
        ids.append(state.allocate_producer_id())
        assert int(path.read_text()) == expected_file
        assert int(path.read_text()) > ids[-1]
    assert ids == list(range(7))


@pytest.mark.parametrize("how", ["shutdown", "crash"])
@pytest.mark.parametrize("block", [1, 3, 1000])
def test_producer_ids_never_repeat_across_restarts(data_dir, how, block):
    settings = {"producer.id.block.size": block}
    handed_out: list[int] = []
    state = open_broker(data_dir, settings)
    for round_ in range(4):
        for _ in range(round_ + 2):
            handed_out.append(state.allocate_producer_id())
        if how == "shutdown":
            state.shutdown()
        else:
            crash(state)
        state = open_broker(data_dir, settings)
    handed_out.append(state.allocate_producer_id())
    assert len(set(handed_out)) == len(handed_out), handed_out
    assert handed_out == sorted(handed_out)


def test_producer_ids_stay_above_those_in_the_logs_when_the_block_file_is_lost(data_dir):
    state, plog = one_partition(data_dir)
    for _ in range(5):
        state.allocate_producer_id()
    appended(state, plog, pbatch(1234, 0, 0))  # a producer id this data directory has seen
    state.shutdown()
    (data_dir / PRODUCER_ID_FILE).unlink()
    state = open_broker(data_dir)
    assert state.allocate_producer_id() == 1235
    state.shutdown()


def test_a_block_size_change_keeps_ids_unique(data_dir):
    state = open_broker(data_dir, {"producer.id.block.size": 10})
    first = [state.allocate_producer_id() for _ in range(3)]
    crash(state)
    state = open_broker(data_dir, {"producer.id.block.size": 2})
    second = [state.allocate_producer_id() for _ in range(5)]
    crash(state)
    state = open_broker(data_dir, {"producer.id.block.size": 7})
    third = [state.allocate_producer_id() for _ in range(2)]
    ids = first + second + third
    assert len(set(ids)) == len(ids) and ids == sorted(ids)


@settings(max_examples=25, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=6),
       block=st.integers(1, 5))
def test_property_producer_ids_are_unique_over_any_run_of_restarts(plan, block):
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        settings = {"producer.id.block.size": block}
        ids: list[int] = []
        for count, clean in plan:
            state = open_broker(data_dir, settings)
            ids += [state.allocate_producer_id() for _ in range(count)]
            state.shutdown() if clean else crash(state)
        assert len(set(ids)) == len(ids)
        assert ids == sorted(ids)


# --- model-based: ProducerStateTable against the rules written out -------------------------------


def header(pid: int, epoch: int, first: int, count: int, base_offset: int) -> BatchHeader:
    return BatchHeader(base_offset=base_offset, batch_length=49, leader_epoch=0, magic=2, crc=0,
                       attributes=0, last_offset_delta=count - 1, base_timestamp=0, max_timestamp=0,
                       producer_id=pid, producer_epoch=epoch, base_sequence=first, record_count=count)


class ProducerTableMachine(RuleBasedStateMachine):
    """The model keeps every batch each producer appended in its current epoch;
    the table must answer as if it looked at the last five of them."""

    def __init__(self):
        super().__init__()
        self.table = ProducerStateTable()
        self.next_offset = 0
        # pid -> (epoch, [(first_seq, last_seq, first_offset, last_offset), ...])
        self.model: dict[int, tuple[int, list[tuple[int, int, int, int]]]] = {}

    def expected(self, pid, epoch, first, count):
        last = (first + count - 1) % SEQ_MOD
        if pid not in self.model:
            return ("append",)  # KIP-360: no state here, any first sequence
        current, batches = self.model[pid]
        if epoch < current:
            return ("refuse", FENCED)
        if epoch > current:
            return ("append",) if first == 0 else ("refuse", OUT_OF_ORDER)
        for f, l, fo, lo in batches[-BATCHES_REMEMBERED:]:
            if (f, l) == (first, last):
                return ("duplicate", fo, lo)
        if first == (batches[-1][1] + 1) % SEQ_MOD:
            return ("append",)
        return ("refuse", OUT_OF_ORDER)

    def learn(self, pid, epoch, first, count):
        h = header(pid, epoch, first, count, self.next_offset)
        current = self.model.get(pid)
        if current is None or current[0] != epoch:
            current = self.model[pid] = (epoch, [])
        current[1].append((first, h.last_sequence, h.base_offset, h.last_offset))
        self.next_offset = h.next_offset
        return h

    def submit(self, pid, epoch, first, count):
        expected = self.expected(pid, epoch, first, count)
        event(str(expected[:2]) if expected[0] == "refuse" else expected[0])
        h = header(pid, epoch, first, count, self.next_offset)
        try:
            verdict = self.table.check(h)
        except ProducerStateError as exc:
            assert expected == ("refuse", exc.code), (expected, str(exc))
            return
        if isinstance(verdict, Duplicate):
            assert expected == ("duplicate", verdict.first_offset, verdict.last_offset)
            return
        assert verdict is None and expected == ("append",), expected
        self.table.record(self.learn(pid, epoch, first, count))

    pids = st.sampled_from([10, 11, 12])
    counts = st.integers(1, 4)

    def current_epoch(self, pid):
        return self.model[pid][0] if pid in self.model else 0

    def next_seq(self, pid):
        if pid not in self.model:
            return 0
        return (self.model[pid][1][-1][1] + 1) % SEQ_MOD

    @rule(pid=pids, count=counts)
    def in_sequence(self, pid, count):
        self.submit(pid, self.current_epoch(pid), self.next_seq(pid), count)

    @rule(pid=pids, back=st.integers(1, 8))
    def retry(self, pid, back):
        if pid not in self.model:
            return
        epoch, batches = self.model[pid]
        if back > len(batches):
            return
        f, l, _, _ = batches[-back]
        self.submit(pid, epoch, f, (l - f) % SEQ_MOD + 1)

    @rule(pid=pids, epoch_step=st.integers(-1, 1), seq_step=st.integers(-6, 6), count=counts)
    def near_miss(self, pid, epoch_step, seq_step, count):
        epoch = max(self.current_epoch(pid) + epoch_step, 0)
        self.submit(pid, epoch, (self.next_seq(pid) + seq_step) % SEQ_MOD, count)

    @rule(pid=pids, first=st.sampled_from([0, 0, 1, 5]), count=counts)
    def bump_epoch(self, pid, first, count):
        self.submit(pid, self.current_epoch(pid) + 1, first, count)

    @rule(pid=pids, below=st.integers(1, 12), count=counts)
    def replay_near_the_wrap(self, pid, below, count):
        # As if the log held a long-lived producer's batch close to 2**31.
        h = self.learn(pid, self.current_epoch(pid), SEQ_MOD - below, count)
        self.table.record(h)

    @invariant()
    def remembers_at_most_five(self):
        for entry in self.table.producers.values():
            assert len(entry.batches) <= BATCHES_REMEMBERED


ProducerTableMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_producer_table_matches_the_model = ProducerTableMachine.TestCase
