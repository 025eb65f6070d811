"""ZooKeeper as `faultline run` starts it: a standalone server or an ensemble, one per namespace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from faultline.control.wait import wait_until
from faultline.db.zookeeper import ZooKeeperDB, four_letter


def client(connect: str) -> KazooClient:
    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(20)
    return zk


def test_an_ensemble_of_three_replicates_and_survives_one_member(make_cluster, tmp_path):
    cluster = make_cluster(("zk1", "zk2", "zk3"))
    zk = ZooKeeperDB(cluster.remotes, tmp_path / "work")
    zk.setup()
    try:
        modes = sorted(four_letter(r.address, "srvr").split("Mode: ")[1].split()[0] for r in cluster.remotes.values())
        assert modes == ["follower", "follower", "leader"]
        one = client(f"{cluster.remotes['zk1'].address}:2181")
        other = client(f"{cluster.remotes['zk3'].address}:2181")
        one.create("/written-on-zk1", b"hello")
        other.sync("/written-on-zk1")
        assert other.get("/written-on-zk1")[0] == b"hello"
        one.stop()
        other.stop()
        zk.kill("zk1")
        survivors = ",".join(f"{cluster.remotes[n].address}:2181" for n in ("zk2", "zk3"))
        quorum = client(survivors)
        wait_until(lambda: quorum.create("/after-one-died", b"x", sequence=True), 30,
                   "two of three members did not keep serving writes")
        quorum.stop()
    finally:
        zk.teardown(tmp_path / "store")
    assert (tmp_path / "store" / "nodes" / "zk2" / "zookeeper.log").exists()
    assert all(not zk.running(n) for n in cluster.remotes)


def test_a_missing_zookeeper_package_is_named(make_cluster, tmp_path, monkeypatch):
    from faultline.db import zookeeper

    monkeypatch.setattr(zookeeper, "JAR", tmp_path / "no-such.jar")
    cluster = make_cluster(("zk1",))
    with pytest.raises(RuntimeError, match="install Debian's zookeeper package"):
        ZooKeeperDB(cluster.remotes, tmp_path)


def test_a_standalone_server_in_a_namespace_serves_and_cluster_view_reads_it(make_cluster, tmp_path):
    from faultline.db.zookeeper import ClusterView

    cluster = make_cluster(("zk1",))
    zk = ZooKeeperDB(cluster.remotes, tmp_path / "work")
    zk.setup()
    try:
        assert "Mode: standalone" in four_letter(cluster.remotes["zk1"].address, "srvr")
        assert "server." not in (tmp_path / "work" / "zk1" / "zoo.cfg").read_text()
        writer = client(zk.connect)
        view = ClusterView(zk.connect)
        try:
            # An empty cluster: no controller, no brokers, no partition state yet.
            assert view.controller() is None and view.partition_state("t", 0) is None
            writer.create("/brokers/ids/2", b'{"host":"10.0.0.2","port":9092}', ephemeral=True, makepath=True)
            writer.create("/controller", b'{"version":1,"brokerid":2,"timestamp":"0"}', ephemeral=True)
            state = {"controller_epoch": 1, "leader": 2, "version": 1, "leader_epoch": 0, "isr": [2]}
            writer.create("/brokers/topics/t/partitions/0/state", json.dumps(state).encode(), makepath=True)
            assert view.brokers() == [2] and view.controller() == 2
            assert view.partition_state("t", 0) == state
        finally:
            view.close()
            writer.stop()
    finally:
        zk.teardown(tmp_path / "store")
    assert not zk.running("zk1")
    assert (tmp_path / "store" / "nodes" / "zk1" / "zoo.cfg").exists()


def test_two_of_three_members_down_stops_writes(make_cluster, tmp_path):
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    cluster = make_cluster(("zk1", "zk2", "zk3"))
    zk = ZooKeeperDB(cluster.remotes, tmp_path / "work")
    zk.setup()
    try:
        zk.kill("zk1")
        zk.kill("zk2")
        last = f"{cluster.remotes['zk3'].address}:2181"
        # The lone survivor drops out of the quorum and stops serving clients.
        wait_until(lambda: "not currently serving" in four_letter(cluster.remotes["zk3"].address, "srvr"),
                   30, "the last of three members still serves after two died")
        lone = KazooClient(hosts=last, timeout=4)
        with pytest.raises((KazooTimeoutError, KazooException)):
            lone.start(6)
            lone.create("/no-quorum", b"x")
        lone.stop()
        lone.close()
    finally:
        zk.teardown(tmp_path / "store")


def test_cleanup_kills_a_zookeeper_its_harness_left(make_cluster, tmp_path):
    from faultline.control import cleanup

    cluster = make_cluster(("zk1",))
    zk = ZooKeeperDB(cluster.remotes, tmp_path / "work")
    zk.setup()
    pid = cluster.remotes["zk1"].pid("zookeeper")
    assert pid is not None
    # No teardown, as after a harness killed with SIGKILL: cleanup must stop the java process.
    removed = cleanup(tags=[cluster.tag], include_live=True)
    assert not removed.errors
    assert pid in {p.pid for p in removed.processes}
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or
               Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
               10, f"ZooKeeper (pid {pid}) survived faultline cleanup")


def test_a_server_that_cannot_start_is_reported_at_once_with_its_log(make_cluster, tmp_path, monkeypatch):
    import time

    from faultline.db import zookeeper

    good = zookeeper.zoo_cfg
    monkeypatch.setattr(zookeeper, "zoo_cfg", lambda *a, **k: good(*a, **k).replace("tickTime=500", "tickTime=soon"))
    cluster = make_cluster(("zk1",))
    zk = ZooKeeperDB(cluster.remotes, tmp_path / "work")
    began = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"ZooKeeper on zk1 exited while starting; .*zookeeper.log ends") as err:
            zk.setup()
    finally:
        zk.teardown(tmp_path / "store")
    assert time.monotonic() - began < 30, "a server that exited was waited for until the timeout"
    assert "tickTime" in str(err.value) or "Invalid config" in str(err.value)
