"""ZooKeeper as `faultline run` starts it: a standalone server or an ensemble, one per namespace."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from faultline.control.wait import wait_until
from faultline.runner.zookeeper import ZooKeeperDB, four_letter


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
    from faultline.runner import zookeeper

    monkeypatch.setattr(zookeeper, "JAR", tmp_path / "no-such.jar")
    cluster = make_cluster(("zk1",))
    with pytest.raises(RuntimeError, match="install Debian's zookeeper package"):
        ZooKeeperDB(cluster.remotes, tmp_path)
