"""The controller's rules and the leader epoch cache, as pure functions."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from faultline.broker.controller import assign_replicas, decide
from faultline.broker.epochs import LeaderEpochCache
from faultline.broker.zk import BrokerInfo, PartitionState, Snapshot, TopicInfo


def snapshot(live: dict[int, int], state: PartitionState, assignment=(1, 2, 3), shutting=()) -> Snapshot:
    """`live`: broker id -> registration czxid."""
    return Snapshot(
        brokers={b: BrokerInfo(b, "h", 9092, czxid) for b, czxid in live.items()},
        controller=min(live) if live else None,
        topics={"t": TopicInfo("t", None, {0: tuple(assignment)})},
        states={("t", 0): state},
        shutting_down=frozenset(shutting),
    )


def state(leader, epoch, isr, mzxid=100, version=5) -> PartitionState:
    return PartitionState(leader, epoch, tuple(isr), 1, version, mzxid)


def only_change(snap, unclean=False):
    changes = decide(snap, unclean, controller_epoch=7)
    assert len(changes) <= 1
    return changes[0] if changes else None


def test_a_healthy_partition_is_left_alone():
    assert only_change(snapshot({1: 10, 2: 11, 3: 12}, state(1, 0, [1, 2, 3]))) is None


def test_a_dead_leader_is_replaced_by_the_first_live_isr_member_with_a_new_epoch():
    change = only_change(snapshot({2: 11, 3: 12}, state(1, 4, [1, 3, 2])))
    assert (change.state.leader, change.state.leader_epoch, change.state.isr) == (2, 5, (2, 3))
    assert change.expected_version == 5 and change.state.controller_epoch == 7


def test_an_out_of_sync_replica_is_not_elected_without_unclean_election():
    snap = snapshot({3: 12}, state(1, 4, [1, 2]))
    change = only_change(snap)
    assert change.state.leader == -1 and change.state.isr == (1, 2), "offline, keeping the ISR"
    # Already offline: nothing more to write until an ISR member returns.
    assert only_change(snapshot({3: 12}, change.state)) is None


def test_unclean_election_picks_a_live_out_of_sync_replica():
    change = only_change(snapshot({3: 12}, state(1, 4, [1, 2])), unclean=True)
    assert (change.state.leader, change.state.isr) == (3, (3,))
    assert "UNCLEAN" in change.reason


def test_a_returning_isr_member_leads_an_offline_partition():
    change = only_change(snapshot({2: 200, 3: 12}, state(-1, 5, [1, 2])))
    assert change.state.leader == 2 and change.state.leader_epoch == 6


def test_a_restarted_leader_loses_leadership_to_a_fresh_isr_member():
    # Broker 1 registered again (czxid 300) after the state was written (mzxid 100).
    change = only_change(snapshot({1: 300, 2: 11, 3: 12}, state(1, 2, [1, 2, 3])))
    assert change.state.leader == 2 and change.state.isr == (2, 3)


def test_a_restarted_sole_isr_member_is_elected_again_with_a_new_epoch():
    change = only_change(snapshot({1: 300, 2: 11}, state(1, 2, [1])))
    assert (change.state.leader, change.state.leader_epoch, change.state.isr) == (1, 3, (1,))


def test_a_restarted_follower_leaves_the_isr_and_the_leader_stays_at_a_new_epoch():
    # Kafka 3.9's ZooKeeper controller bumps the leader epoch when it shrinks an ISR
    # (ReplicaStateMachine.doRemoveReplicasFromIsr, LeaderAndIsr.newLeaderAndIsr).
    change = only_change(snapshot({1: 10, 2: 300, 3: 12}, state(1, 2, [1, 2, 3])))
    assert (change.state.leader, change.state.leader_epoch, change.state.isr) == (1, 3, (1, 3))


def test_controlled_shutdown_moves_leadership_only_when_another_isr_member_can_take_it():
    moved = only_change(snapshot({1: 10, 2: 11, 3: 12}, state(1, 2, [1, 2, 3]), shutting=[1]))
    assert moved.state.leader == 2 and 1 not in moved.state.isr
    kept = only_change(snapshot({1: 10, 2: 11, 3: 12}, state(1, 2, [1]), shutting=[1]))
    assert kept is None


@settings(max_examples=300, deadline=None)
@given(
    live=st.dictionaries(st.integers(1, 5), st.sampled_from([10, 300]), max_size=5),
    leader=st.integers(-1, 5),
    isr=st.lists(st.integers(1, 5), unique=True, max_size=5),
    unclean=st.booleans(),
)
def test_elections_never_pick_a_dead_broker_or_an_out_of_sync_one_unless_unclean(live, leader, isr, unclean):
    assignment = (1, 2, 3, 4, 5)
    before = state(leader, 3, isr)
    change = only_change(snapshot(live, before, assignment), unclean)
    if change is None:
        return
    new = change.state
    if new.leader != -1:
        assert new.leader in live, "a leader must be alive"
        assert new.leader in new.isr
        assert new.leader_epoch == before.leader_epoch + 1, "every controller change is a new leader epoch"
        if new.leader != before.leader:
            assert new.leader in before.isr or (unclean and new.isr == (new.leader,))
        assert set(new.isr) <= set(before.isr) | {new.leader}
        assert all(b in live for b in new.isr)


def test_replicas_spread_leaders_evenly_and_never_repeat_a_broker():
    for seed in range(20):
        assignment = assign_replicas([1, 2, 3, 4], 8, 3, random.Random(seed))
        assert all(len(set(r)) == 3 for r in assignment.values())
        leaders = [r[0] for r in assignment.values()]
        assert sorted(leaders.count(b) for b in (1, 2, 3, 4)) == [2, 2, 2, 2]


def test_epoch_cache_answers_as_offset_for_leader_epoch_does(tmp_path):
    # Kafka 3.9, LeaderEpochFileCache.endOffsetFor.
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in [(2, 10), (4, 20), (5, 30)]:
        assert cache.assign(epoch, start)
    assert not cache.assign(5, 31), "the same epoch is not recorded twice"
    assert cache.end_offset_for(5, log_end=40) == (5, 40), "the latest epoch ends at the log end"
    assert cache.end_offset_for(2, log_end=40) == (2, 20)
    assert cache.end_offset_for(3, log_end=40) == (2, 20), "an unknown epoch: the largest one below it"
    assert cache.end_offset_for(1, log_end=40) == (1, 10), \
        "older than every known epoch: answered as asked, ending where the first known one starts"
    assert cache.end_offset_for(9, log_end=40) == (-1, -1), "newer than every known epoch"
    assert cache.end_offset_for(-1, log_end=40) == (-1, -1)
    # It survives a restart, and truncation drops epochs that begin at or beyond the new end.
    reopened = LeaderEpochCache(tmp_path)
    assert reopened.entries == [(2, 10), (4, 20), (5, 30)]
    reopened.truncate_from_end(30)
    assert LeaderEpochCache(tmp_path).entries == [(2, 10), (4, 20)]


def test_the_newest_epoch_assignment_replaces_what_it_contradicts(tmp_path):
    # Kafka 3.9, LeaderEpochFileCache.assign: entries whose epoch is not older, or whose start is
    # not earlier, than the new one go (a follower taking the leader's history of older epochs).
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in [(0, 0), (2, 10), (5, 30)]:
        cache.assign(epoch, start)
    assert cache.assign(3, 10)
    assert cache.entries == [(0, 0), (3, 10)]
    assert cache.assign(4, 10), "an epoch in which nothing was written is replaced by the next"
    assert cache.entries == [(0, 0), (4, 10)]
    assert cache.assign(4, 5), "the same epoch from an earlier offset moves its start"
    assert LeaderEpochCache(tmp_path).entries == [(0, 0), (4, 5)]
