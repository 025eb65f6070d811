"""Which node counts a test spec accepts: brokers (`nodes`) and ZooKeeper servers (`zookeeper_nodes`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faultline.models import spec as specs
from faultline.models.spec import SpecError


@given(nodes=st.integers(1, 9), zk=st.one_of(st.none(), st.integers(-3, 9)))
def test_zookeeper_nodes_are_accepted_or_refused_with_the_reason(nodes, zk):
    effective = zk if zk is not None else (0 if nodes == 1 else 1)
    fine = effective >= 0 and (effective >= 1 or nodes == 1) and (effective == 0 or effective % 2 == 1)
    if fine:
        spec = specs.TestSpec(nodes=nodes, zookeeper_nodes=zk)
        assert spec.effective_zookeeper_nodes == effective
        assert spec.effective_replication_factor == min(3, nodes)
    else:
        with pytest.raises(SpecError, match="zookeeper-nodes") as refused:
            specs.TestSpec(nodes=nodes, zookeeper_nodes=zk)
        # Every refusal says what to give instead.
        assert "give" in str(refused.value) or "use an odd number" in str(refused.value)


def test_defaults_one_standalone_broker_or_one_zookeeper_for_a_cluster():
    assert specs.TestSpec().effective_zookeeper_nodes == 0
    assert specs.TestSpec(nodes=3).effective_zookeeper_nodes == 1
    assert specs.TestSpec(nodes=5, zookeeper_nodes=3).effective_zookeeper_nodes == 3


def test_kafka_in_zookeeper_mode_gets_zookeeper_even_alone():
    # A single Kafka 3.x broker in ZooKeeper mode cannot start without it; KRaft needs none.
    alone = specs.TestSpec(broker="kafka", kafka_version="3.9.1", kafka_mode="zookeeper", nodes=1)
    assert alone.effective_zookeeper_nodes == 1
    assert specs.TestSpec(broker="kafka", nodes=1).effective_zookeeper_nodes == 0
    with pytest.raises(SpecError, match="kafka-mode=zookeeper with zookeeper-nodes=0: .* give --zookeeper-nodes 1"):
        specs.TestSpec(broker="kafka", kafka_version="3.9.1", kafka_mode="zookeeper", nodes=1, zookeeper_nodes=0)
