"""The leader epoch cache of one partition: at which offset each leader epoch began.

In: epoch starts (`assign(epoch, start_offset)`) as a replica becomes leader or
appends batches of a new epoch, truncations, and the partition directory.
Out: `end_offset_for(epoch, log_end)`, the answer OffsetForLeaderEpoch gives
(the fix of KIP-101: a follower truncates to where its own history and the
leader's diverge, not to its high watermark; KIP-279: the answer names the
epoch it is for, so the follower can ask again), all as Kafka 3.9's
LeaderEpochFileCache, and the file Kafka keeps for it,
`leader-epoch-checkpoint`:

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

    def start_of(self, epoch: int) -> int | None:
        """The offset at which `epoch` began here, or None when this cache holds no such epoch."""
        return next((o for e, o in self.entries if e == epoch), None)

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` begins at `start_offset`; True if that changed the cache.

        As Kafka 3.9 (LeaderEpochFileCache.assign): the newest assignment wins. Entries from the
        end whose epoch is not older, or whose start is not earlier, than the new one are dropped
        first (an epoch in which nothing was written, or a history the log has since replaced),
        so a follower appending a leader's batches of an older epoch takes the leader's history."""
        if epoch < 0 or start_offset < 0:
            return False
        if self.entries:
            latest_epoch, latest_start = self.entries[-1]
            if epoch == latest_epoch and start_offset >= latest_start:
                return False
        dropped = []
        while self.entries and (self.entries[-1][0] >= epoch or self.entries[-1][1] >= start_offset):
            dropped.append(self.entries.pop())
        if len(dropped) > 1 or (dropped and dropped[0][1] != start_offset):
            log.warning("%s: epoch %d at offset %d replaced the entries %s", self.path.parent.name,
                        epoch, start_offset, dropped[::-1])
        self.entries.append((epoch, start_offset))
        self.save()
        return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower asking about `epoch`, as Kafka 3.9 answers
        (LeaderEpochFileCache.endOffsetFor): the latest epoch ends at the log end; an older one
        ends where the next larger epoch starts, answered with the largest epoch <= the one asked;
        an epoch older than every known one is answered as asked, ending where the first known
        epoch starts (so the follower truncates to it); an epoch newer than every known one, or
        none, gets (UNDEFINED, UNDEFINED)."""
        if epoch < 0 or not self.entries:
            return UNDEFINED, UNDEFINED
        if epoch == self.latest_epoch:
            return epoch, log_end
        epochs = [e for e, _ in self.entries]
        i = bisect.bisect_right(epochs, epoch)
        if i == len(epochs):
            return UNDEFINED, UNDEFINED
        if i == 0:
            return epoch, self.entries[0][1]
        return self.entries[i - 1][0], self.entries[i][1]

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut to end at `end_offset`: drop epochs that start at or after it, as
        Kafka's truncateFromEnd does (an epoch starting at the new log end holds nothing)."""
        before = len(self.entries)
        while self.entries and self.entries[-1][1] >= end_offset:
            self.entries.pop()
        if len(self.entries) != before:
            self.save()
