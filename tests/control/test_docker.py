"""The Docker backend's nodes: a `DockerCluster` of real containers on a private dockerd, each a
`DockerRemote` held to the same contract as the namespace backend's (run, daemons and their
signals, files), partitions by iptables inside the containers, and `faultline cleanup` after a
harness is SIGKILLed: our labelled containers and network go, a bystander container stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from faultline.control import AlreadyRunning, CommandFailed, CommandTimeout, NotRunning, wait_until
from faultline.control.docker_cluster import DockerCluster, connect
from faultline.control.names import LABEL_NODE, LABEL_RUN
from faultline.control.net import Net
from faultline.control.registry import registry_path

from .helpers import CLIENT, SERVER, new_tag

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "python3"


@pytest.fixture(scope="module")
def cluster(node_image, tmp_path_factory):
    cluster = DockerCluster.create(new_tag(), ["n1", "n2"], tmp_path_factory.mktemp("docker"), image=node_image)
    yield cluster
    cluster.destroy()
    client = connect()
    assert not client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={cluster.tag}"})
    assert not client.api.networks(filters={"label": f"{LABEL_RUN}={cluster.tag}"})
    assert not registry_path(cluster.tag).exists()


def reach(remote, address: str, port: int) -> str:
    return remote.run([PY, "-c", CLIENT, address, str(port)], check=False, timeout=20).stdout.strip()


def test_each_node_is_a_labelled_container_with_its_address_on_the_runs_network(cluster):
    client = connect()
    containers = client.api.containers(filters={"label": f"{LABEL_RUN}={cluster.tag}"})
    assert sorted(c["Labels"][LABEL_NODE] for c in containers) == ["n1", "n2"]
    for c in containers:
        node = c["Labels"][LABEL_NODE]
        settings = c["NetworkSettings"]["Networks"][cluster.network]
        assert settings["IPAddress"] == cluster.remotes[node].address
    assert [cluster.remotes[n].address for n in ("n1", "n2")] == [str(h) for h in list(cluster.subnet.hosts())[1:3]]
    state = json.loads(registry_path(cluster.tag).read_text())
    assert state["backend"] == "docker" and state["status"] == "up"
    assert state["docker"]["host"] == os.environ["DOCKER_HOST"]
    # The node's home is this machine's folder: what the harness writes there, the node reads.
    (cluster.remotes["n1"].home / "hello").write_text("from the harness\n")
    assert cluster.remotes["n1"].run(["cat", "hello"]).stdout == "from the harness\n"
    assert cluster.remotes["n1"].run(["hostname"]).stdout.strip() == "n1"


def test_nodes_reach_each_other_and_the_harness_reaches_them_until_a_partition_cuts_them(cluster):
    n1, n2 = cluster.remotes["n1"], cluster.remotes["n2"]
    n2.spawn("server", [PY, "-u", "-c", SERVER, n2.address, "7000", "n2"], "server.log")
    try:
        wait_until(lambda: "listening" in (n2.home / "server.log").read_text(), 20, "the server did not listen")
        assert reach(n1, n2.address, 7000) == f"n2 {n1.address}"
        import socket

        with socket.create_connection((n2.address, 7000), timeout=5) as s:
            assert s.makefile().readline().split()[0] == "n2"
        net = Net(cluster.remotes)
        net.drop({"n1": {"n2"}})
        assert reach(n1, n2.address, 7000) == ""
        assert net.heal() == {"n1": "healed"}
        assert reach(n1, n2.address, 7000) == f"n2 {n1.address}"
    finally:
        n2.kill("server")


def test_run_gives_output_status_environment_and_stdin_in_the_node(cluster):
    remote = cluster.remotes["n1"]
    result = remote.run([PY, "-c", "import os, sys; print(os.getcwd()); print(sys.stdin.read())"], input="hi")
    assert result.returncode == 0 and result.stdout.split() == [str(remote.home), "hi"]
    assert remote.run(["sh", "-c", "echo $FAULTLINE_X"], env={"FAULTLINE_X": "y"}).stdout == "y\n"
    quiet = remote.run(["sh", "-c", "echo oops >&2; exit 3"], check=False)
    assert quiet.returncode == 3 and quiet.stderr == "oops\n"
    with pytest.raises(CommandFailed) as info:
        remote.run(["sh", "-c", "echo broken pipe dream >&2; exit 4"])
    assert info.value.returncode == 4 and info.value.node == "n1" and "broken pipe dream" in str(info.value)


def test_a_timed_out_command_is_killed_with_its_children(cluster):
    remote = cluster.remotes["n2"]
    with pytest.raises(CommandTimeout) as info:
        remote.run(["sh", "-c", "sleep 300 & echo $! > bg.pid; sleep 300"], timeout=1)
    assert info.value.node == "n2"
    child = (remote.home / "bg.pid").read_text().strip()
    wait_until(lambda: remote.run(["sh", "-c", f"kill -0 {child}"], check=False).returncode != 0, 10,
               f"the timed-out command's child {child} survived")


def state(remote, pid: int) -> str:
    return remote.run(["sh", "-c", f"cat /proc/{pid}/stat"]).stdout.rsplit(")", 1)[1].split()[0]


def test_a_daemon_is_spawned_paused_resumed_stopped_and_killed_with_its_process_group(cluster):
    remote = cluster.remotes["n1"]
    assert remote.pid("d") is None
    pid = remote.spawn("d", ["sh", "-c", "echo out $FAULTLINE_X; sleep 300 & echo $! > child.pid; wait"],
                       "logs/d.log", env={"FAULTLINE_X": "x1"})
    assert remote.pid("d") == pid
    with pytest.raises(AlreadyRunning):
        remote.spawn("d", ["sleep", "1"], "logs/d.log")
    wait_until(lambda: (remote.home / "child.pid").exists(), 10, "the daemon did not start its child")
    child = int((remote.home / "child.pid").read_text())
    assert (remote.home / "logs" / "d.log").read_text() == "out x1\n"
    remote.pause("d")
    assert state(remote, pid) == "T" and state(remote, child) == "T"
    assert remote.resume("d") is True
    assert state(remote, pid) != "T" and state(remote, child) != "T"
    remote.kill("d")
    assert remote.pid("d") is None
    wait_until(lambda: remote.run(["sh", "-c", f"kill -0 {child}"], check=False).returncode != 0, 10,
               "the daemon's child outlived the kill of its group")
    with pytest.raises(NotRunning):
        remote.pause("d")
    assert remote.resume("d") is False
    # A daemon that exits cleanly on SIGTERM reports 0; one that ignores it is killed after the timeout.
    remote.spawn("graceful", [PY, "-c", "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: "
                              "sys.exit(0))\nprint('up', flush=True)\ntime.sleep(300)"], "graceful.log")
    wait_until(lambda: "up" in (remote.home / "graceful.log").read_text(), 10, "graceful did not start")
    assert remote.stop("graceful") == 0
    remote.spawn("stubborn", [PY, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                              "print('up', flush=True)\ntime.sleep(300)"], "stubborn.log")
    wait_until(lambda: "up" in (remote.home / "stubborn.log").read_text(), 10, "stubborn did not start")
    assert remote.stop("stubborn", timeout=1) == -signal.SIGKILL
    with pytest.raises(FileNotFoundError, match="no program 'no-such-program'"):
        remote.spawn("missing", ["no-such-program"], "missing.log")


def test_upload_and_download_copy_files_and_folders_outside_the_shared_home(cluster, tmp_path):
    remote = cluster.remotes["n2"]
    folder = tmp_path / "up"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha\n")
    (folder / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    remote.upload(folder, "/var/tmp/fl/up")
    assert remote.run(["cat", "/var/tmp/fl/up/a.txt"]).stdout == "alpha\n"
    remote.download("/var/tmp/fl/up", tmp_path / "down")
    assert (tmp_path / "down" / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "down" / "sub" / "b.bin").read_bytes() == bytes(range(256)) * 100
    remote.upload(folder / "a.txt", "/var/tmp/fl/single")
    remote.download("/var/tmp/fl/single", tmp_path / "single.txt")
    assert (tmp_path / "single.txt").read_text() == "alpha\n"
    with pytest.raises(FileNotFoundError):
        remote.download("/var/tmp/fl/nothing-here", tmp_path / "nothing")


HARNESS = textwrap.dedent("""
    import sys, time
    from faultline.control.docker_cluster import DockerCluster
    cluster = DockerCluster.create(sys.argv[1], ["n1", "n2"], sys.argv[2], image=sys.argv[3])
    cluster.remotes["n1"].spawn("sleeper", ["sleep", "600"], "sleeper.log")
    print("up", flush=True)
    time.sleep(600)
""")


def test_cleanup_removes_what_a_killed_harness_left_on_docker_and_nothing_else(node_image, tmp_path):
    client = connect()
    tag = new_tag()
    bystander = client.containers.run(node_image, ["sleep", "600"], detach=True, name=f"bystander-{tag}",
                                      labels={"org.example": "not-faultline"})
    try:
        harness = subprocess.Popen([sys.executable, "-c", HARNESS, tag, str(tmp_path / "work"), node_image],
                                   stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert harness.stdout.readline().strip() == "up"
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        labelled = {"label": f"{LABEL_RUN}={tag}"}
        assert len(client.api.containers(filters=labelled)) == 2
        proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "cleanup"], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"removed Docker container faultline-{tag}-n1 (run {tag}" in proc.stdout
        assert f"removed Docker network faultline-{tag} (run {tag}" in proc.stdout
        assert not client.api.containers(all=True, filters=labelled)
        assert not client.api.networks(filters=labelled)
        assert not registry_path(tag).exists()
        bystander.reload()
        assert bystander.status == "running"
    finally:
        bystander.remove(force=True)
