"""The `zookeeper` fixture: a real ZooKeeper on 127.0.0.1 that tests of replicated brokers share."""

from __future__ import annotations

from kazoo.client import KazooClient

from faultline.db.zookeeper import LocalZooKeeper, four_letter


def test_the_shared_zookeeper_serves_writes_under_a_chroot(zookeeper):
    host, port = zookeeper.split(":")
    assert four_letter(host, "ruok", port=int(port)) == "imok"
    root = KazooClient(hosts=zookeeper, timeout=10)
    root.start(20)
    root.ensure_path("/fixture-test")
    zk = KazooClient(hosts=f"{zookeeper}/fixture-test", timeout=10)
    zk.start(20)
    try:
        zk.create("/brokers/ids/1", b'{"host":"127.0.0.1"}', ephemeral=True, makepath=True)
        assert zk.get_children("/brokers/ids") == ["1"]
    finally:
        zk.stop()
        zk.close()
    # Ephemeral nodes go with their session; the chroot keeps other tests' znodes apart.
    try:
        assert root.get_children("/fixture-test/brokers/ids") == []
    finally:
        root.stop()
        root.close()


def test_stop_leaves_no_java_process(tmp_path):
    zk = LocalZooKeeper(tmp_path).start()
    pid = zk.proc.pid
    zk.stop()
    assert zk.proc.poll() is not None
    try:
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().split()[2] == "Z", "the ZooKeeper process still runs after stop()"
    except FileNotFoundError:
        pass
