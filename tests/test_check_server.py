"""`faultline check-server`: a warm Spark session that `faultline check` hands its checks to, the
same verdicts as a check in its own process, and a check that still runs when the server is gone.

Each test's server listens at a socket of its own (FAULTLINE_CHECK_SERVER), so a server a user
runs on this machine takes no part and these servers serve no other test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultline.control.wait import wait_until
from tests.processes import alive, descendants
from tests.test_cli import good_dup_broken

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path):
    environment = {**os.environ, "FAULTLINE_CHECK_SERVER": str(tmp_path / "server" / "socket")}
    yield environment
    # Whatever a failed test left: the server and its JVM, found by the socket in its environment.
    subprocess.run([sys.executable, "-m", "faultline.runner.cli", "check-server", "stop"], env=environment,
                   capture_output=True, timeout=120)


def faultline(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "faultline.runner.cli", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout)


def server_pid(env: dict) -> int:
    proc = faultline(env, "check-server", "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.split("pid ")[1].split(",")[0])


def test_a_check_server_gives_the_verdicts_of_a_check_in_its_own_process_and_stops(tmp_path, env):
    proc = faultline(env, "check-server", "start", "--idle-timeout", "600")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ready at" in proc.stdout
    pid = server_pid(env)
    # Starting takes half a minute: `start` says each warm-up check as the server finishes it.
    assert [line.split(":")[1].strip() for line in proc.stdout.splitlines()
            if line.startswith("check server: warm-up check")] == [
        "warm-up check 1/3", "warm-up check 2/3", "warm-up check 3/3"], proc.stdout

    good, dup, broken = good_dup_broken(tmp_path)
    served = faultline(env, "check", str(good), str(dup), str(broken), "--no-progress")
    assert served.returncode == 2, served.stdout + served.stderr
    assert f"checked by the check server at {env['FAULTLINE_CHECK_SERVER']} (pid {pid})" in served.stderr
    by_server = {d.name: json.loads((d / "results.json").read_text()) for d in (good, dup, broken)}
    assert all((d / "report.html").exists() for d in (good, dup))
    assert by_server["good"]["valid"] is True
    assert by_server["dup"]["valid"] is False and by_server["dup"]["bad_anomaly_types"] == ["duplicate"]
    assert by_server["broken"]["valid"] == "unknown" and "history.jsonl:4" in by_server["broken"]["error"]
    assert "history.jsonl:4" in served.stdout

    # The same paths checked in this process: the same results, word for word.
    here = faultline(env, "check", str(good), str(dup), str(broken), "--no-progress", "--no-server")
    assert here.returncode == 2, here.stdout + here.stderr
    assert "check server" not in here.stderr
    assert {d.name: json.loads((d / "results.json").read_text()) for d in (good, dup, broken)} == by_server
    assert served.stdout == here.stdout

    status = faultline(env, "check-server", "status")
    assert status.returncode == 0 and "1 check(s) served" in status.stdout, status.stdout
    listed = faultline(env, "cleanup", "--dry-run", "--include-live")
    assert (f"a check server runs (pid {pid}, {env['FAULTLINE_CHECK_SERVER']}): cleanup --include-live would "
            "stop it") in listed.stdout, listed.stdout + listed.stderr
    jvm = descendants(pid)
    assert jvm, "the server runs Spark's JVM as its child"
    stopped = faultline(env, "check-server", "stop")
    assert stopped.returncode == 0 and f"stopped (pid {pid})" in stopped.stdout, stopped.stdout + stopped.stderr
    wait_until(lambda: not any(alive(p) for p in jvm | {pid}), 60, "the server's processes did not end")
    assert not Path(env["FAULTLINE_CHECK_SERVER"]).exists()
    gone = faultline(env, "check-server", "status")
    assert gone.returncode == 1 and "none runs" in gone.stdout


def test_an_idle_server_stops_by_itself_and_a_killed_one_leaves_the_check_to_its_own_process(tmp_path, env):
    sock = Path(env["FAULTLINE_CHECK_SERVER"])
    proc = faultline(env, "check-server", "start", "--no-warm-up", "--idle-timeout", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = server_pid(env)
    wait_until(lambda: not alive(pid), 60, "the idle server did not stop")
    assert not sock.exists()
    assert "2 s without a request; stopping" in sock.with_name("socket.log").read_text()

    proc = faultline(env, "check-server", "start", "--no-warm-up", "--idle-timeout", "600")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pid = server_pid(env)
    processes = descendants(pid) | {pid}
    os.kill(pid, signal.SIGKILL)
    # Spark's JVM ends with the Python process that started it.
    wait_until(lambda: not any(alive(p) for p in processes), 60, "the killed server's JVM did not end")
    assert sock.exists(), "a killed server leaves its socket"

    good, dup, _ = good_dup_broken(tmp_path)
    checked = faultline(env, "check", str(good), str(dup), "--no-progress")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "check server" not in checked.stderr
    assert json.loads((dup / "results.json").read_text())["bad_anomaly_types"] == ["duplicate"]
    status = faultline(env, "check-server", "status")
    assert status.returncode == 1 and "none runs" in status.stdout


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[16])


def test_a_background_server_warms_up_at_the_lowest_priority_and_a_check_that_comes_meanwhile_ends_it(
        tmp_path, env):
    # As `faultline run` starts its own: in the foreground of a process of its own session, at the
    # lowest CPU priority, listening before it warms up.
    sock = Path(env["FAULTLINE_CHECK_SERVER"])
    sock.parent.mkdir(mode=0o700)
    server = subprocess.Popen([sys.executable, "-m", "faultline.runner.cli", "check-server", "start", "--foreground",
                               "--background", "--idle-timeout", "600"], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: server.poll() is not None or sock.exists(), 120, "the server never listened")
        assert server.poll() is None
        jvm = descendants(server.pid)
        assert jvm, "the server runs Spark's JVM as its child"
        # nice 19 for the server and its JVM; the session's scheduling group too, where the kernel
        # groups by session.
        assert {nice_of(p) for p in jvm | {server.pid}} == {19}
        autogroup = Path(f"/proc/{server.pid}/autogroup")
        if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() and \
                Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            assert autogroup.read_text().strip().endswith("nice 19"), autogroup.read_text()

        # The first warm-up check (a cold JVM's) takes well over the few seconds this check needs to
        # reach the server: its jobs are cancelled, the check is served at once, and the warm-up ends.
        good, dup, _ = good_dup_broken(tmp_path)
        served = faultline(env, "check", str(good), str(dup), "--no-progress")
        assert served.returncode == 1, served.stdout + served.stderr
        assert f"checked by the check server at {sock} (pid {server.pid})" in served.stderr
        assert json.loads((dup / "results.json").read_text())["bad_anomaly_types"] == ["duplicate"]
        status = faultline(env, "check-server", "status")
        assert status.returncode == 0 and "1 check(s) served" in status.stdout, status.stdout
    finally:
        faultline(env, "check-server", "stop")
        out, _ = server.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith(("warm-up", "check server: serving"))]
    assert lines == ["warm-up ended after 0 check(s): a check is waiting",
                     "check server: serving after 0 of 3 warm-up checks"], out


def test_cleanup_removes_the_socket_folder_a_run_server_killed_while_starting_left_and_no_other(env):
    import tempfile

    stale = Path(tempfile.mkdtemp(prefix="faultline-run-check-"))
    fresh = Path(tempfile.mkdtemp(prefix="faultline-run-check-"))  # a server still starting: too young
    other = Path(tempfile.mkdtemp(prefix="faultline-run-checkout-"))  # not ours: another name
    try:
        old = time.time() - 600
        for folder in (stale, other):
            os.utime(folder, (old, old))
        listed = faultline(env, "cleanup", "--dry-run")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert (f"would remove the socket folder of a run's check server that no longer runs: {stale}"
                in listed.stdout), listed.stdout
        assert str(fresh) not in listed.stdout and str(other) not in listed.stdout
        assert stale.exists()
        cleaned = faultline(env, "cleanup")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert not stale.exists() and fresh.exists() and other.exists()
    finally:
        for folder in (stale, fresh, other):
            if folder.exists():
                folder.rmdir()
