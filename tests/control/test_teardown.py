"""destroy() removes a cluster entirely, and cleanup() removes what a
SIGKILLed harness left behind, touching nothing that is not ours."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from faultline.control import LocalCluster, RemoteError, cleanup, find_leftovers, wait_until
from faultline.control.iproute import list_namespaces
from faultline.control.processes import namespace_pids, process_cmdline, process_state
from faultline.control.registry import registry_path

from .helpers import ESCAPER, PY, SLEEPER, gone, new_tag, ours_on_host

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_destroy_kills_every_process_and_removes_every_object(make_cluster):
    cluster = make_cluster()
    n1, n2 = cluster.remotes["n1"], cluster.remotes["n2"]
    n1.spawn("sleeper", [PY, "-c", SLEEPER], "sleeper.log")
    n2.spawn("sleeper", [PY, "-c", SLEEPER], "sleeper.log")
    n2.pause("sleeper")
    n3_escaper = cluster.remotes["n3"].spawn("escaper", [PY, "-c", ESCAPER, "escaped.pid"], "escaper.log")
    escaped_file = cluster.remotes["n3"].home / "escaped.pid"
    escaped = wait_until(lambda: escaped_file.exists() and int(escaped_file.read_text() or 0), 20,
                         "the escaper never forked")
    assert os.getpgid(escaped) != n3_escaper  # out of reach of the daemon's process group
    # A process the harness did not spawn at all.
    stranger = subprocess.Popen(["ip", "netns", "exec", cluster.namespaces["n1"], PY, "-c", SLEEPER],
                                start_new_session=True)
    try:
        wait_until(lambda: stranger.pid in namespace_pids(cluster.namespaces["n1"]), 20,
                   "the stranger never entered n1's namespace")
        pids = [p for ns in cluster.namespaces.values() for p in namespace_pids(ns)]
        assert escaped in pids and len(pids) == 5, [(p, process_cmdline(p), process_state(p)) for p in pids] + [
            (name, r.daemons()) for name, r in cluster.remotes.items()]

        cluster.destroy()

        assert stranger.wait(10) == -signal.SIGKILL
        assert all(gone(p) for p in pids), [(p, open(f"/proc/{p}/stat").read()) for p in pids if not gone(p)]
        assert ours_on_host({cluster.tag}) == []
        assert not registry_path(cluster.tag).exists()
        assert json.loads(cluster.state_path.read_text())["status"] == "destroyed"
        assert all(r.pid("sleeper") is None for r in cluster.remotes.values())
        cluster.destroy()  # a second time is a no-op
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()


def test_create_refuses_names_in_use_and_touches_nothing(tmp_path, needs_root):
    tag = new_tag()
    with pytest.raises(ValueError):
        LocalCluster.create(tag, ["n1", "n1"], tmp_path)
    first = LocalCluster.create(tag, ["n1"], tmp_path / "a")
    try:
        # The same tag twice is refused before anything is built, and the first cluster is untouched.
        try:
            second = LocalCluster.create(tag, ["n1"], tmp_path / "b")
        except RemoteError as exc:
            assert "already" in str(exc)
        else:
            second.destroy()
            pytest.fail("a second cluster with the same tag was created")
        assert first.namespaces["n1"] in list_namespaces()
        assert first.remotes["n1"].run(["true"]).returncode == 0
    finally:
        first.destroy()
    assert ours_on_host({tag}) == []

    # A link that merely has one of our names (left by someone else) is refused, not deleted.
    other = new_tag()
    subprocess.run(["ip", "link", "add", f"fl{other}n2", "type", "bridge"], check=True)
    try:
        with pytest.raises(RemoteError, match=f"fl{other}n2"):
            LocalCluster.create(other, ["n1", "n2"], tmp_path / "c")
        assert ours_on_host({other}) == [f"bridge fl{other}n2"]
    finally:
        subprocess.run(["ip", "link", "del", f"fl{other}n2"], capture_output=True)


def test_a_create_that_fails_halfway_removes_what_it_built(tmp_path, needs_root, monkeypatch):
    tag = new_tag()
    real = LocalCluster._create_node
    built, pids = [], []

    def fail_on_the_third(self, node):
        if len(built) == 2:
            raise OSError("injected: the third node could not be built")
        real(self, node)
        built.append(node)
        # Something running inside, as a broker would be.
        pids.append(self.remotes[node].spawn("sleeper", [PY, "-c", SLEEPER], "sleeper.log"))

    monkeypatch.setattr(LocalCluster, "_create_node", fail_on_the_third)
    try:
        with pytest.raises(OSError, match="injected"):
            LocalCluster.create(tag, ["n1", "n2", "n3"], tmp_path)
        assert built == ["n1", "n2"] and len(pids) == 2
        assert all(gone(p) for p in pids)
        assert ours_on_host({tag}) == [] and not registry_path(tag).exists()
    finally:
        cleanup(tags=[tag], include_live=True)


CRASHING_HARNESS = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from faultline.control import LocalCluster
    tag, workdir, python, sleeper = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    cluster = LocalCluster.create(tag, ["n1", "n2"], workdir)
    pids = {node: remote.spawn("sleeper", [python, "-c", sleeper], "sleeper.log")
            for node, remote in cluster.remotes.items()}
    cluster.remotes["n2"].pause("sleeper")
    print(json.dumps({"pids": pids, "namespaces": list(cluster.namespaces.values()),
                      "links": [cluster.bridge, *cluster.veths.values()]}), flush=True)
    time.sleep(1000)
""")


@pytest.fixture
def decoys(needs_root):
    """Objects that look like ours but are not: cleanup must leave them alone."""
    tag = new_tag()
    # A near-miss namespace name; a bridge named like our veths; veths named unlike ours.
    names = {"namespace": f"faultline{tag}-n1", "bridge": f"fl{tag}n9", "veth": f"flx{tag}", "peer": f"fly{tag}"}
    made = []
    try:
        subprocess.run(["ip", "netns", "add", names["namespace"]], check=True)
        made.append(("netns", names["namespace"]))
        subprocess.run(["ip", "link", "add", names["bridge"], "type", "bridge"], check=True)
        made.append(("link", names["bridge"]))
        subprocess.run(["ip", "link", "add", names["veth"], "type", "veth", "peer", "name", names["peer"]],
                       check=True)
        made.append(("link", names["veth"]))
        yield names
    finally:
        for kind, name in reversed(made):
            subprocess.run(["ip", kind, "del", name], capture_output=True)


def test_cleanup_removes_what_a_sigkilled_harness_left(make_cluster, decoys, tmp_path):
    live = make_cluster(["n1"])
    live.remotes["n1"].spawn("sleeper", [PY, "-c", SLEEPER], "sleeper.log")
    tag = new_tag()
    child = subprocess.Popen([sys.executable, "-c", CRASHING_HARNESS, tag, str(tmp_path / "crashed"), PY, SLEEPER],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        line = child.stdout.readline() if ready else ""
        assert line, f"the harness child never reported (exit {child.poll()}): {child.stderr.read()[-2000:]}"
        made = json.loads(line)
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        daemons = list(made["pids"].values())
        assert not any(gone(p) for p in daemons)  # the harness died; its daemons did not

        before = find_leftovers()
        print("before cleanup:\n" + before.describe())
        assert {ns.name for ns in before.namespaces if ns.tag == tag} == set(made["namespaces"])
        assert {link.name for link in before.links if link.tag == tag} == set(made["links"])
        assert set(daemons) <= {p.pid for p in before.processes}
        assert registry_path(tag) in before.registry
        assert live.tag in before.live_runs and live.tag not in before.tags

        assert cleanup(dry_run=True).removed is False
        assert set(made["namespaces"]) <= set(list_namespaces())

        removed = cleanup()
        print("cleanup:\n" + removed.describe())
        assert removed.removed and not removed.errors
        assert {ns.name for ns in removed.namespaces if ns.tag == tag} == set(made["namespaces"])
        assert set(daemons) <= {p.pid for p in removed.processes}

        after = find_leftovers(tags=[tag])
        print("after cleanup:\n" + after.describe())
        assert not after and ours_on_host({tag}) == []
        assert all(gone(p) for p in daemons)
        assert not registry_path(tag).exists()
        assert json.loads((tmp_path / "crashed" / "cluster.json").read_text())["status"] == "cleaned up"

        # The live run and the look-alikes are untouched.
        assert live.remotes["n1"].pid("sleeper") is not None
        assert live.namespaces["n1"] in list_namespaces() and registry_path(live.tag).exists()
        assert decoys["namespace"] in list_namespaces()
        for link in (decoys["bridge"], decoys["veth"], decoys["peer"]):
            assert subprocess.run(["ip", "link", "show", link], capture_output=True).returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
        cleanup(tags=[tag], include_live=True)
