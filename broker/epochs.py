"""The leader epoch cache of one partition: at which offset each leader epoch began.

In: epoch starts (`assign(epoch, start_offset)`) as a replica becomes leader or
appends batches of a new epoch, truncations, and the partition directory.
Out: `end_offset_for(epoch, log_end)`, the answer OffsetForLeaderEpoch gives
(the fix of KIP-101: a follower truncates to where its own history and the
leader's diverge, not to its high watermark), and the file Kafka keeps for
it, `leader-epoch-checkpoint`:

    0                 version
    <n>               number of entries
    <epoch> <offset>  one line per epoch, ascending
"""

from __future__ import annotations

import bisect
import logging
import os
from pathlib import Path

log = logging.getLogger("faultline.broker.epochs")

CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED = -1


class LeaderEpochCache:
    def __init__(self, directory: Path):
        self.path = directory / CHECKPOINT
        self.entries: list[tuple[int, int]] = []
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            count = int(lines[1])
            entries = [tuple(int(x) for x in line.split()) for line in lines[2:2 + count]]
        except (IndexError, ValueError):
            log.warning("%s is unreadable; the epoch cache is rebuilt from the log", self.path)
            return
        self.entries = [(e, o) for e, o in entries]

    def save(self) -> None:
        text = "0\n%d\n%s" % (len(self.entries), "".join(f"{e} {o}\n" for e, o in self.entries))
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` begins at `start_offset`; True if that is new."""
        if epoch < 0:
            return False
        if self.entries and self.entries[-1][0] >= epoch:
            if self.entries[-1][0] == epoch:
                return False
            # An older epoch than the latest cannot start now; the log is the authority.
            log.warning("%s: epoch %d after epoch %d ignored", self.path.parent.name, epoch, self.entries[-1][0])
            return False
        # Entries whose start lies beyond the new one came from a discarded history.
        while self.entries and self.entries[-1][1] > start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        self.save()
        return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower asking about `epoch`, as Kafka answers:
        the latest epoch gets the log end; an older epoch gets the start of the
        next larger epoch, along with the largest epoch <= the one asked;
        an epoch older than all known gets (UNDEFINED, UNDEFINED)."""
        if not self.entries:
            return UNDEFINED, UNDEFINED
        if epoch == self.latest_epoch:
            return epoch, log_end
        epochs = [e for e, _ in self.entries]
        i = bisect.bisect_right(epochs, epoch)
        if i == 0:
            return UNDEFINED, UNDEFINED
        if i == len(epochs):
            return self.entries[-1][0], log_end
        return self.entries[i - 1][0], self.entries[i][1]

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut to `end_offset`: drop epochs that start at or after it."""
        before = len(self.entries)
        while self.entries and self.entries[-1][1] >= end_offset:
            self.entries.pop()
        if len(self.entries) != before:
            self.save()
