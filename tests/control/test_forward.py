"""The namespace backend on a host where Docker runs: FORWARD's policy DROP, bridge netfilter on.

The host state is made here as dockerd leaves it (and put back afterwards): without the run's
own FORWARD rule the nodes of a cluster cannot reach each other, with it they can, and a whole
`faultline run --nodes 3` (ZooKeeper and three replicated brokers) comes out valid, leaving no
rule of ours behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from faultline.control import cleanup, forward, wait_until

from .helpers import CLIENT, SERVER

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and iptables need root")

REPO = Path(__file__).resolve().parents[2]
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


@pytest.fixture
def docker_like_host():
    """FORWARD policy DROP and bridged frames through iptables, as on a host where dockerd runs."""
    if not BRIDGE_NF.exists():
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
    if not BRIDGE_NF.exists():
        pytest.skip("bridge netfilter (br_netfilter) is not available on this kernel")
    policy = re.search(r"^-P FORWARD (\w+)", subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True,
                                                           text=True, check=True).stdout, re.M)[1]
    bridge_nf = BRIDGE_NF.read_text().strip()
    subprocess.run(["iptables", "-w", "10", "-P", "FORWARD", "DROP"], check=True)
    BRIDGE_NF.write_text("1")
    try:
        yield
    finally:
        subprocess.run(["iptables", "-w", "10", "-P", "FORWARD", policy], check=True)
        BRIDGE_NF.write_text(bridge_nf)


def reach(remote, address: str) -> str:
    return remote.run([sys.executable, "-c", CLIENT, address, "7000"], check=False, timeout=20).stdout.strip()


def test_the_runs_own_forward_rule_is_what_lets_its_nodes_talk(docker_like_host, cluster):
    n1, n2 = cluster.remotes["n1"], cluster.remotes["n2"]
    assert len(forward.rules()[cluster.tag]) == 1
    n2.spawn("server", [sys.executable, "-u", "-c", SERVER, n2.address, "7000", "n2"], "server.log")
    wait_until(lambda: "listening" in (n2.home / "server.log").read_text(), 10, "the server did not listen")
    assert reach(n1, n2.address) == f"n2 {n1.address}"
    forward.remove(cluster.tag)
    assert reach(n1, n2.address) == ""  # what every run got on such a host before the rule
    forward.allow_bridge(cluster.tag, cluster.bridge)
    assert reach(n1, n2.address) == f"n2 {n1.address}"
    cluster.destroy()
    assert cluster.tag not in forward.rules()


def test_a_replicated_run_is_valid_on_a_host_where_docker_set_forward_to_drop(docker_like_host, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "faultline.runner.cli", "run", "--nodes", "3", "--time-limit", "8",
                           "--engine", "python", "--seed", "3", "--store", str(tmp_path), "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "queue" / "latest" / "results.json").read_text())
    assert results["valid"] is True and results["stats"]["by_f"]["send"]["ok"] > 50
    assert not forward.rules(), forward.rules()


def test_cleanup_removes_a_dead_runs_forward_rule_and_no_other():
    # A rule of ours whose run has no registry entry (its harness was SIGKILLed after the rule went
    # in), and a rule of somebody else's in the same chain.
    forward.allow_bridge("tdead01", "flbtdead01")
    foreign = ["FORWARD", "-i", "flbtdead01", "-o", "flbtdead01", "-m", "comment", "--comment", "not-ours",
               "-j", "ACCEPT"]
    subprocess.run(["iptables", "-w", "10", "-I", *foreign], check=True)
    try:
        found = cleanup(tags=["tdead01"])
        assert found.forward_rules == {"tdead01": ["-A FORWARD -i flbtdead01 -o flbtdead01 -m comment --comment "
                                                   "faultline-tdead01 -j ACCEPT"]}
        assert "removed FORWARD rule" in found.describe()
        assert "tdead01" not in forward.rules()
        assert subprocess.run(["iptables", "-w", "10", "-C", *foreign]).returncode == 0
    finally:
        subprocess.run(["iptables", "-w", "10", "-D", *foreign])
        forward.remove("tdead01")
