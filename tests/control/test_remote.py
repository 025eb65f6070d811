"""A node's Remote: run, spawn/pid/stop/kill/pause/resume of daemons, upload/download."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from faultline.control import AlreadyRunning, CommandFailed, CommandTimeout, NotRunning, wait_until
from faultline.control.processes import namespace_pids, process_cmdline, process_state

from .helpers import COUNTER, GRACEFUL, PY, SLEEPER, STUBBORN, gone, size

# --- run ---------------------------------------------------------------------


def test_run_returns_output_and_runs_in_the_node(cluster):
    remote = cluster.remotes["n1"]
    result = remote.run([PY, "-c", "import os, sys; print(os.getcwd()); print(sys.stdin.read())"], input="hi")
    assert result.returncode == 0 and result.stdout.split() == [str(remote.home), "hi"]
    assert remote.run(["sh", "-c", "echo $FAULTLINE_X"], env={"FAULTLINE_X": "y"}).stdout == "y\n"


def test_run_failure_says_node_command_and_stderr(cluster):
    remote = cluster.remotes["n2"]
    quiet = remote.run(["sh", "-c", "echo oops >&2; exit 3"], check=False)
    assert quiet.returncode == 3 and quiet.stderr == "oops\n"
    with pytest.raises(CommandFailed) as info:
        remote.run(["sh", "-c", "echo broken pipe dream >&2; exit 4"])
    assert isinstance(info.value, subprocess.CalledProcessError)
    assert info.value.returncode == 4 and info.value.node == "n2"
    assert "n2" in str(info.value) and "broken pipe dream" in str(info.value) and "status 4" in str(info.value)


def test_run_timeout_kills_the_command_and_its_children(cluster):
    remote = cluster.remotes["n3"]
    with pytest.raises(CommandTimeout) as info:
        remote.run(["sh", "-c", "sleep 300 & echo $! > bg.pid; sleep 300"], timeout=0.5)
    assert info.value.node == "n3" and "0.5s" in str(info.value)
    background = int((remote.home / "bg.pid").read_text())
    wait_until(lambda: gone(background), 10, f"the timed-out command's child {background} survived")


# --- daemons -----------------------------------------------------------------


def test_spawn_pid_and_log(cluster):
    remote = cluster.remotes["n1"]
    assert remote.pid("greeter") is None
    pid = remote.spawn("greeter", ["sh", "-c", "echo out $FAULTLINE_X; echo err >&2; exec sleep 300"],
                       "logs/greeter.log", env={"FAULTLINE_X": "x1"})
    assert remote.pid("greeter") == pid
    # spawn returns once `ip netns exec` has exec'd the command, so signals reach the daemon itself.
    assert not process_cmdline(pid).startswith("ip netns exec")
    # Its own session and process group, inside the node's namespace.
    assert os.getsid(pid) == pid and os.getpgid(pid) == pid
    assert pid in namespace_pids(cluster.namespaces["n1"])
    assert pid not in namespace_pids(cluster.namespaces["n2"])
    log = remote.home / "logs" / "greeter.log"
    wait_until(lambda: "out x1" in log.read_text() and "err" in log.read_text(), 10, "no output in the log")
    state = json.loads(cluster.state_path.read_text())
    assert state["nodes"]["n1"]["daemons"]["greeter"]["pid"] == pid

    with pytest.raises(AlreadyRunning):
        remote.spawn("greeter", [PY, "-c", SLEEPER], "logs/other.log")
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        remote.spawn("ghost", ["no-such-program-anywhere"], "ghost.log")


def test_a_daemon_that_exits_is_not_running_and_stop_reports_its_status(cluster):
    remote = cluster.remotes["n1"]
    remote.spawn("brief", ["sh", "-c", "exit 3"], "brief.log")
    wait_until(lambda: remote.pid("brief") is None, 10, "the daemon did not exit")
    assert remote.stop("brief") == 3
    assert remote.stop("brief") is None and remote.stop("never-started") is None


def test_stop_is_sigterm_then_waits(cluster):
    remote = cluster.remotes["n2"]
    pid = remote.spawn("graceful", [PY, "-c", GRACEFUL], "graceful.log")
    log = remote.home / "graceful.log"
    wait_until(lambda: "ready" in log.read_text(), 20, "the daemon never installed its handler")
    assert remote.stop("graceful", timeout=20) == 0
    assert "got SIGTERM" in log.read_text()
    assert remote.pid("graceful") is None and gone(pid)


def test_stop_escalates_to_sigkill_after_the_timeout(cluster):
    remote = cluster.remotes["n2"]
    pid = remote.spawn("stubborn", [PY, "-c", STUBBORN], "stubborn.log")
    wait_until(lambda: "ready" in (remote.home / "stubborn.log").read_text(), 20, "the daemon never started")
    assert remote.stop("stubborn", timeout=0.3) == -9
    assert remote.pid("stubborn") is None and gone(pid)


def test_stop_reaches_a_paused_daemon(cluster):
    remote = cluster.remotes["n3"]
    remote.spawn("graceful", [PY, "-c", GRACEFUL], "graceful.log")
    wait_until(lambda: "ready" in (remote.home / "graceful.log").read_text(), 20, "never ready")
    remote.pause("graceful")
    assert remote.stop("graceful", timeout=20) == 0


def test_kill_ends_the_whole_group_and_a_respawn_gets_a_new_pid(cluster):
    remote = cluster.remotes["n3"]
    first = remote.spawn("worker", ["sh", "-c", "sleep 300 & echo $! > child.pid; wait"], "worker.log")
    child_file = remote.home / "child.pid"
    child = wait_until(lambda: child_file.exists() and int(child_file.read_text() or 0), 10, "no child pid")
    assert os.getpgid(child) == first

    remote.kill("worker")
    assert remote.pid("worker") is None
    assert gone(first)
    wait_until(lambda: gone(child), 10, f"the daemon's child {child} survived kill")
    remote.kill("worker")  # killing a dead daemon is a no-op

    second = remote.spawn("worker", [PY, "-c", SLEEPER], "worker.log")
    assert second != first and remote.pid("worker") == second
    remote.kill("worker")
    assert remote.pid("worker") is None and gone(second)


def test_pause_stops_progress_and_resume_restarts_it(cluster):
    paused_node, witness_node = cluster.remotes["n1"], cluster.remotes["n2"]
    counter, witness = paused_node.home / "counter", witness_node.home / "counter"
    # Through sh, so the counter is a child in the group: pause must reach it too.
    pid = paused_node.spawn("counter", ["sh", "-c", f'"{PY}" -c "$0" "$1" & wait', COUNTER, str(counter)],
                            "counter.log")
    witness_node.spawn("counter", [PY, "-c", COUNTER, str(witness)], "counter.log")
    wait_until(lambda: size(counter) > 10 and size(witness) > 10, 20, "the counters never started")

    paused_node.pause("counter")
    assert paused_node.pid("counter") == pid  # paused is still running
    group = [p for p in namespace_pids(cluster.namespaces["n1"]) if os.getpgid(p) == pid]
    assert len(group) == 2
    wait_until(lambda: all(process_state(p) == "T" for p in group), 10, "not every process stopped")
    frozen, start = size(counter), size(witness)
    # The witness's progress shows time passed in which a running counter would have moved.
    wait_until(lambda: size(witness) >= start + 50, 30, "the witness counter stalled")
    assert size(counter) == frozen

    assert paused_node.resume("counter") is True
    wait_until(lambda: size(counter) > frozen + 10, 20, "the counter did not resume")


def test_pause_of_a_missing_daemon_raises_and_resume_is_always_safe(cluster):
    remote = cluster.remotes["n1"]
    with pytest.raises(NotRunning, match="n1"):
        remote.pause("nothing")
    assert remote.resume("nothing") is False
    remote.spawn("brief", ["true"], "brief.log")
    wait_until(lambda: remote.pid("brief") is None, 10, "`true` did not exit")
    with pytest.raises(NotRunning):
        remote.pause("brief")
    assert remote.resume("brief") is False


# --- files -------------------------------------------------------------------


def test_upload_download_round_trip(cluster, tmp_path):
    remote = cluster.remotes["n2"]
    payload = os.urandom(200_000)
    (tmp_path / "data.bin").write_bytes(payload)
    remote.upload(tmp_path / "data.bin", "conf/data.bin")
    assert (remote.home / "conf" / "data.bin").read_bytes() == payload
    # The node itself sees the file where it was put.
    digest = remote.run(["sha256sum", "conf/data.bin"]).stdout.split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()

    remote.download("conf/data.bin", tmp_path / "back" / "data.bin")
    assert (tmp_path / "back" / "data.bin").read_bytes() == payload

    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "a.txt").write_text("a")
    remote.upload(tmp_path / "tree", remote.home / "tree")
    remote.download("tree", tmp_path / "tree-back")
    assert (tmp_path / "tree-back" / "sub" / "a.txt").read_text() == "a"

    with pytest.raises(FileNotFoundError, match="n2"):
        remote.download("missing.log", tmp_path / "x")
