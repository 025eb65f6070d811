"""What this broker does for the partitions it follows: truncate, then copy the leader's log.

In: a replica that has just become a follower of a broker at a leader epoch, and that broker's
address from the cluster snapshot. Out: the log truncated where it may diverge from the
leader's: as Kafka 3.9, by leader epoch, asking the leader again after each cut until the logs
agree (OffsetForLeaderEpoch, KIP-101 and KIP-279); or, as older Kafka did, by one question
(`faultline.truncation=leader-epoch-once`) or to this replica's own high watermark
(`faultline.truncation=high-watermark`); then the leader's batches appended
unchanged, and the high watermark the leader reports. A log that ends beyond the leader's is cut
back to the leader's end; batches that do not line up with this log stop the fetcher (DIVERGED).
"""

from __future__ import annotations

import asyncio
import logging

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchRequest
from kio.schema.list_offsets.v7.request import ListOffsetsRequest
from kio.schema.offset_for_leader_epoch.v4.request import OffsetForLeaderEpochRequest

from .peer import PeerConnection, PeerError
from .records import iter_headers
from .replica import Replica
from .state import BrokerError

# Every replication module logs under the one name the replica manager always used, so that
# broker logs (and whoever reads them) see the same lines as before the code was split.
log = logging.getLogger("faultline.broker.replica")


class FollowerFetcher:
    """Part of `ReplicaManager`, which holds the state used here (`config`, `me`, `snapshot`,
    `changed`)."""

    def _peer(self, broker: int) -> PeerConnection | None:
        info = self.snapshot.brokers.get(broker) if self.snapshot else None
        if info is None:
            return None
        return PeerConnection(info.host, info.port, f"broker-{self.me}-replica-fetcher")

    async def _follow(self, r: Replica, generation: int) -> None:
        backoff = self.config["replica.fetch.backoff.ms"] / 1000
        conn: PeerConnection | None = None
        truncated = False
        try:
            while r.generation == generation:
                if conn is None:
                    conn = self._peer(r.leader)
                    if conn is None:
                        await asyncio.sleep(backoff)
                        continue
                try:
                    if not truncated:
                        await self._truncate(r, conn)
                        truncated = True
                    await self._fetch_once(r, conn, generation)
                except PeerError as exc:
                    log.info("%s: fetching from broker %d failed: %s", r.name, r.leader, exc)
                    conn.close()
                    conn = None
                    await asyncio.sleep(backoff)
                except BrokerError as exc:
                    # The leader does not (yet) agree it leads this epoch: wait for the metadata to settle.
                    log.info("%s: broker %d refused the fetch: %s: %s", r.name, r.leader, exc.code.name, exc)
                    await asyncio.sleep(min(backoff, 0.2))
                except Exception:  # noqa: BLE001 - a fetcher must not die silently
                    log.exception("%s: the replica fetcher failed; retrying", r.name)
                    if conn is not None:
                        conn.close()
                        conn = None
                    await asyncio.sleep(backoff)
        finally:
            if conn is not None:
                conn.close()

    async def _truncate(self, r: Replica, conn: PeerConnection) -> None:
        """Cut this replica's log where it may diverge from the leader's, as
        `faultline.truncation` says (default: Kafka 3.9's)."""
        how = self.config["faultline.truncation"]
        if how == "high-watermark" or r.log.epochs.latest_epoch < 0:
            # Before Kafka 0.11, and in Kafka 3.9 for a log that knows no epoch.
            self._truncate_to(r, r.log.high_watermark, f"to its high watermark {r.log.high_watermark}")
            return
        for _ in range(1000):
            asked = r.log.epochs.latest_epoch
            if asked < 0:
                return
            epoch, end = await self._epoch_end(r, conn, asked)
            target, done, why = self._truncation_target(r, asked, epoch, end, how)
            self._truncate_to(r, target, why)
            if done:
                return
        raise RuntimeError(f"{r.name}: truncation did not settle after 1000 OffsetForLeaderEpoch rounds")

    async def _epoch_end(self, r: Replica, conn: PeerConnection, asked: int) -> tuple[int, int]:
        resp = await conn.request(OffsetForLeaderEpochRequest, {
            "replica_id": self.me,
            "topics": [{"topic": r.topic, "partitions": [
                {"partition": r.index, "current_leader_epoch": r.leader_epoch, "leader_epoch": asked}]}],
        }, timeout=10)
        answer = resp.topics[0].partitions[0]
        if answer.error_code != ErrorCode.none:
            raise BrokerError(answer.error_code, f"OffsetForLeaderEpoch for epoch {asked}")
        return answer.leader_epoch, answer.end_offset

    @staticmethod
    def _truncation_target(r: Replica, asked: int, epoch: int, end: int, how: str) -> tuple[int, bool, str]:
        """(offset to truncate to, whether truncation is complete, why), from the leader's answer
        (`epoch`, `end`) for the epoch `asked`: Kafka 3.9's AbstractFetcherThread
        getOffsetTruncationState (KIP-279) or, for `leader-epoch-once`, KIP-101's one step."""
        plog = r.log
        leo = plog.log_end_offset
        if end < 0:
            # The leader knows no epoch this new: Kafka keeps the log (truncates to its fetch
            # offset, the log end for a log with epochs); KIP-101 alone fell back to the high watermark.
            if how == "leader-epoch-once":
                return plog.high_watermark, True, f"to its high watermark {plog.high_watermark} " \
                                                  f"(the leader knows no epoch <= {asked})"
            return leo, True, f"nowhere: the leader knows no epoch <= {asked}"
        if how == "leader-epoch-once":
            return min(end, leo), True, f"by leader epoch, once: epoch {asked} ends at {end} on the leader"
        own = plog.epochs.end_offset_for(epoch, leo)
        if own[1] < 0:
            return min(end, leo), True, f"to the leader's end {end} of epoch {epoch}, older than any here"
        own_epoch, own_end = own
        if own_epoch != epoch:
            return min(own_end, leo), False, (f"by leader epoch: the leader's last epoch <= {asked} is {epoch}, "
                                              f"unknown here; cut to the end {own_end} of epoch {own_epoch} "
                                              f"and ask again")
        return min(own_end, end, leo), True, (f"by leader epoch: epoch {epoch} ends at {end} on the leader "
                                              f"and at {own_end} here")

    def _truncate_to(self, r: Replica, target: int, how: str) -> None:
        before = r.log.log_end_offset
        if target < before:
            r.log.truncate_to(target)
            log.warning("%s: truncated from %d to %d %s", r.name, before, r.log.log_end_offset, how)
        else:
            log.info("%s: no truncation needed (log end %d; %s)", r.name, before, how)

    async def _fetch_once(self, r: Replica, conn: PeerConnection, generation: int) -> None:
        plog = r.log
        wait_ms = self.config["replica.fetch.wait.max.ms"]
        resp = await conn.request(FetchRequest, {
            "replica_id": self.me, "max_wait": wait_ms, "min_bytes": self.config["replica.fetch.min.bytes"],
            "max_bytes": self.config["replica.fetch.max.bytes"], "isolation_level": 0,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": r.topic, "partitions": [{
                "partition": r.index, "current_leader_epoch": r.leader_epoch,
                "fetch_offset": plog.log_end_offset, "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": self.config["replica.fetch.max.bytes"]}]}],
            "forgotten_topics_data": [], "rack_id": "",
        }, timeout=wait_ms / 1000 + 10)
        if r.generation != generation:
            return
        if resp.error_code != ErrorCode.none:
            raise BrokerError(resp.error_code, "fetch refused")
        part = resp.responses[0].partitions[0]
        if part.error_code == ErrorCode.offset_out_of_range:
            await self._handle_out_of_range(r, conn)
            return
        if part.error_code != ErrorCode.none:
            raise BrokerError(part.error_code, "partition fetch refused")
        data = part.records or b""
        end = 0
        for pos, header in iter_headers(data):
            if header.base_offset != plog.log_end_offset:
                # Batch boundaries differ from the leader's: the logs have diverged (what truncating
                # to the high watermark can do). As Kafka's fetcher marks such a partition failed,
                # this replica stops fetching it rather than append out of order.
                log.error("%s: DIVERGED: the leader's batch covers offsets %d..%d, but this replica's log ends "
                          "at %d; it stops fetching this partition", r.name, header.base_offset,
                          header.last_offset, plog.log_end_offset)
                r.generation += 1
                break
            plog.append(data[pos:pos + header.size], header)
            plog.epochs.assign(header.leader_epoch, header.base_offset)
            end = pos + header.size
        plog.high_watermark = min(part.high_watermark, plog.log_end_offset)
        if end:
            self.changed.notify()

    async def _handle_out_of_range(self, r: Replica, conn: PeerConnection) -> None:
        """The leader's log ends below this replica's: cut back to the leader's end (as Kafka does)."""
        resp = await conn.request(ListOffsetsRequest, {
            "replica_id": self.me, "isolation_level": 0,
            "topics": [{"name": r.topic, "partitions": [
                {"partition_index": r.index, "current_leader_epoch": r.leader_epoch, "timestamp": -1}]}],
        }, timeout=10)
        answer = resp.topics[0].partitions[0]
        if answer.error_code != ErrorCode.none:
            raise BrokerError(answer.error_code, "ListOffsets for the leader's log end")
        before = r.log.log_end_offset
        if answer.offset < before:
            r.log.truncate_to(answer.offset)
            log.warning("%s: the leader's log ends at %d, below ours at %d: truncated to %d", r.name,
                        answer.offset, before, r.log.log_end_offset)
