"""`faultline run` end to end: namespaces, brokers, workload, history, Spark check, verdict."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultline.control import forward, lazyfs
from faultline.models.history import read_history
from faultline.control.wait import wait_until
from tests.processes import alive, descendants
from tests.browser import load

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

REPO = Path(__file__).resolve().parents[2]


def faultline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "faultline.runner.cli", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def ours(listing: str) -> list[str]:
    return [line for line in listing.splitlines() if "faultline" in line or " fl" in line]


REPORT_PLOTS = ("latency", "quantiles", "throughput", "lag", "unseen")
NOTHING_LEFT = {"namespaces": [], "links": [], "processes": [], "mounts": [], "forward_rules": [], "docker": []}


def run_check_servers() -> str:
    """The check servers that runs start for themselves (check_server.RunServer), as pgrep lists them."""
    return subprocess.run(["pgrep", "-af", "faultline.runner.cli check-server start --foreground --background"],
                          capture_output=True, text=True).stdout


def leftovers() -> dict[str, list[str]]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    # Brokers of `faultline run` keep their data in its temporary work folder; brokers
    # of other tests (another checkout's suite, say) are none of these tests' business.
    procs = subprocess.run(["pgrep", "-af", "faultline.broker.main .*--data-dir /tmp/faultline-"],
                           capture_output=True, text=True).stdout
    procs += subprocess.run(["pgrep", "-af", "faultline.control.lazyfs /tmp/faultline-"], capture_output=True,
                            text=True).stdout
    procs += subprocess.run(["pgrep", "-af", "QuorumPeerMain /tmp/faultline-"], capture_output=True, text=True).stdout
    procs += run_check_servers()
    return {
        "namespaces": [l for l in netns.splitlines() if l.startswith("faultline-")],
        "links": [l.split(":")[1].strip() for l in links.splitlines() if l.split(":")[1].strip().startswith("fl")],
        "processes": [l for l in procs.splitlines() if l.strip()],
        # The power-loss file system's mounts (of any run: a test run by hand is as much a leftover).
        "mounts": lazyfs.mounts(),
        "forward_rules": [rule for rules in forward.rules().values() for rule in rules],
        "docker": docker_leftovers(),
    }


def docker_leftovers() -> list[str]:
    """Containers and networks labelled as a run's on the daemon DOCKER_HOST names (when the
    session started one: see the docker_host fixture)."""
    if not os.environ.get("DOCKER_HOST"):
        return []
    from faultline.control.docker_cluster import connect
    from faultline.control.names import LABEL_RUN

    client = connect()
    try:
        return ([f"container {c['Names'][0]}" for c in client.api.containers(all=True, filters={"label": LABEL_RUN})]
                + [f"network {n['Name']}" for n in client.api.networks(filters={"label": LABEL_RUN})])
    finally:
        client.close()


def test_healthy_run_is_valid(tmp_path):
    store = tmp_path / "store"
    proc = faultline("run", "--time-limit", "8", "--rate", "60", "--concurrency", "3", "--seed", "7",
                     "--store", str(store), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = (store / "latest").resolve()
    assert run_dir.parent.name == "queue"
    for name in ("test.json", "history.jsonl", "results.json", "clients.log", "nodes/n1/broker.log"):
        assert (run_dir / name).exists(), name
    spec = json.loads((run_dir / "test.json").read_text())
    assert spec["seed"] == 7 and spec["producer"]["acks"] == "all"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True, results
    assert results["model"] == "exactly-once"
    history = read_history(run_dir / "history.jsonl").ops
    fs = {op["f"] for op in history}
    assert {"send", "poll", "assign"} <= fs
    assert results["stats"]["ok"] > 50
    # Checked by a Spark session of the run's own, started before its nodes (warming up beside the run),
    # stopped after the check: its log is kept in the store, and nothing of it is left (leftovers).
    assert "checked by the run's own check server (pid " in proc.stderr, proc.stderr
    assert "check server: checked 1 path(s) in" in (run_dir / "check-server.log").read_text()
    # Every acknowledged value was read in the final phase.
    acked = {m["value"] for op in history if op["type"] == "ok" and op["f"] == "send" for m in op["mops"]}
    read = {r["value"] for op in history if op["type"] == "ok" and op["f"] == "poll"
            for m in op["mops"] for r in m.get("records", [])}
    assert acked and acked <= read
    assert leftovers() == NOTHING_LEFT
    # Its report, as a person opens it: every plot drawn, nothing fetched, no fault to shade.
    report = run_dir / "report.html"
    page = load(report.as_uri(), "report-healthy-run.png",
                [*[f"#plot-{p} svg" for p in REPORT_PLOTS], "[id^='latency-fault-']"],
                text_of=("#verdict", "#found"))
    assert page.console == [] and page.errors == [] and page.requests == [report.as_uri()]
    assert page.counts == {**{f"#plot-{p} svg": 1 for p in REPORT_PLOTS}, "[id^='latency-fault-']": 0}
    assert page.texts["#verdict"] == "VALID"
    # The rate reached is said beside the one asked, and warned about exactly when 20% short. (Each
    # worker waits its random delay after its previous operation completed, and polls that find
    # nothing take 100 ms: 3 workers reach about half of 60 ops/s.)
    rate = results["rate"]
    assert rate["asked"] == 60 and 0 < rate["achieved"] <= 75, rate
    assert f"rate: {rate['achieved']:g} client operations/s in the main phase, of 60 asked" in proc.stdout
    warned = [n for n in results.get("notes", []) if n.startswith("warning: the harness")]
    assert len(warned) == (rate["achieved"] < 48), (rate, warned)


def test_a_run_asked_for_more_than_it_can_do_says_the_shortfall(tmp_path):
    store = tmp_path / "store"
    proc = faultline("run", "--time-limit", "5", "--rate", "50000", "--concurrency", "2", "--seed", "3",
                     "--engine", "python", "--store", str(store), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(((store / "latest").resolve() / "results.json").read_text())
    rate = results["rate"]
    assert rate["asked"] == 50000 and 0 < rate["achieved"] < 40000, rate
    [warning] = [n for n in results["notes"] if n.startswith("warning: the harness")]
    assert f"invoked {rate['achieved']:g} client operations per second in the main phase" in warning
    assert f"note: {warning}" in proc.stdout
    assert leftovers() == NOTHING_LEFT


def test_a_broker_started_under_a_clock_offset_and_strobed_stamps_the_skewed_time(tmp_path):
    store = tmp_path / "store"
    # Seed 3's schedule strobes first (5 s of flips), then steps the clock and heals it.
    proc = faultline("run", "--time-limit", "12", "--rate", "50", "--concurrency", "2", "--seed", "3",
                     "--engine", "python", "--clock-offset", "n1=7200", "--nemesis", "clock", "--nemesis-interval", "3",
                     "--store", str(store), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = (store / "latest").resolve()
    assert json.loads((run_dir / "test.json").read_text())["clock_offsets"] == {"n1": 7200}
    first = (run_dir / "nodes" / "n1" / "broker.log").read_text().split()[0]
    ahead = datetime.datetime.fromisoformat(first.replace("Z", "+00:00")) - datetime.datetime.fromtimestamp(
        (run_dir / "test.json").stat().st_mtime, datetime.timezone.utc)
    assert datetime.timedelta(hours=1.5) < ahead < datetime.timedelta(hours=2.5), first
    faults = [op for op in read_history(run_dir / "history.jsonl").ops
              if op["process"] == "nemesis" and op["type"] == "info"]
    strobes = [op["value"] for op in faults if op["f"] == "strobe-clock"]
    assert strobes and strobes[0]["nodes"] == ["n1"] and strobes[0]["flips"] == 5, faults
    for op in faults:  # every repair returns n1 to where it started, not to +0
        value = op["value"].get("ClockNemesis", op["value"]) if op["f"] == "heal" else op["value"]
        if op["f"] in ("reset-clock", "strobe-clock", "heal"):
            assert set(value["offsets_s"].values()) <= {7200}, op
    assert leftovers() == NOTHING_LEFT


def test_each_kill_ends_the_broker_and_the_restarted_one_serves_again(tmp_path):
    # Whether acks=0 loses writes to a kill is timing; tests/broker/test_acks.py shows that
    # loss deterministically. What a run must show is that each kill ended the process (the
    # restart has a new pid), that the restarted broker took writes again, and that a
    # best-effort producer is judged by the best-effort model.
    store = tmp_path / "store"
    proc = faultline("run", "--time-limit", "20", "--rate", "300", "--concurrency", "4", "--seed", "3",
                     "--engine", "python", "--producer", "acks=0", "--producer", "enable.idempotence=false",
                     "--nemesis", "kill", "--nemesis-interval", "3", "--store", str(store), "--no-progress")
    run_dir = (store / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    # Whatever acks=0 lost to the kills, its model allows it: the run is valid.
    assert proc.returncode == 0 and results["valid"] is True, proc.stdout + proc.stderr
    history = read_history(run_dir / "history.jsonl").ops
    faults = [op for op in history if op["process"] == "nemesis" and op["type"] == "info"]
    kills = [op for op in faults if op["f"] == "kill"]
    # A kill is undone by the schedule's next start, or by the heal that ends the run.
    restarts = [(op, op["value"]) for op in faults if op["f"] == "start"]
    restarts += [(op, op["value"]["KillNemesis"]) for op in faults if op["f"] == "heal"]
    assert len(kills) >= 2, proc.stdout
    for kill in kills:
        assert kill["value"]["nodes"] == ["n1"] and kill["value"]["pids"]["n1"] > 0
        start, started = min((r for r in restarts if r[0]["index"] > kill["index"]), key=lambda r: r[0]["index"])
        assert started["pids"]["n1"] not in (None, kill["value"]["pids"]["n1"]), (kill, start)
        if start["f"] == "start":
            served = [op for op in history
                      if op["index"] > start["index"] and op["f"] == "send" and op["type"] == "ok"]
            assert served, f"no send succeeded after the restart at index {start['index']}"
    assert results["model"].startswith("best-effort")
    assert leftovers() == NOTHING_LEFT


def test_cleanup_after_the_harness_is_killed(tmp_path):
    store = tmp_path / "store"
    started = time.time()
    run = subprocess.Popen([sys.executable, "-m", "faultline.runner.cli", "run", "--time-limit", "60",
                            "--store", str(store), "--no-progress"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: any("faultline.broker.main" in p for p in leftovers()["processes"]), 60,
                   "the run never started its broker")
        before = leftovers()
        assert before["namespaces"] and before["links"]
        # The run's own check server starts before the nodes; its Spark JVM soon after.
        wait_until(lambda: run_check_servers(), 60, "the run never started its check server")
        server = int(run_check_servers().split()[0])
        wait_until(lambda: descendants(server), 120, "the run's check server never started Spark")
        checking = descendants(server) | {server}
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        assert leftovers()["processes"], "the broker should outlive a SIGKILLed harness"
        # The check server and its JVM end with the harness, without `faultline cleanup`, and the
        # server's socket folder with them.
        wait_until(lambda: not any(alive(p) for p in checking), 60,
                   "the run's check server outlived its SIGKILLed harness")
        folder = Path(os.environ.get("TMPDIR", "/tmp"))
        assert not [f for f in folder.glob("faultline-run-check-*")
                    if f.stat().st_uid == os.getuid() and f.stat().st_mtime >= started], "its socket folder was left"
        cleaned = faultline("cleanup")
        assert cleaned.returncode == 0, cleaned.stderr
        assert leftovers() == NOTHING_LEFT, cleaned.stdout
        # Running it again finds nothing more to do.
        again = faultline("cleanup")
        assert again.returncode == 0
    finally:
        if run.poll() is None:
            run.kill()
        faultline("cleanup")


def test_the_same_seed_gives_the_same_schedule_and_invocations(tmp_path):
    # What the seed fixes: the nemesis's schedule (functions and their target seeds) and each
    # worker's stream of operations. Timing still decides how many operations fit in the time
    # limit, and an indeterminate completion makes a worker re-assign, so runs agree on the
    # common prefix of each stream, and a worker's stream is compared up to its first `info`.
    # Poll-unseen adds keys to some assigns from what completed before them, and names them
    # (`unseen`): the keys the worker's stream drew are the others.
    def streams(store):
        proc = faultline("run", "--time-limit", "12", "--rate", "60", "--concurrency", "3", "--seed", "7",
                         "--engine", "python", "--nemesis", "kill", "--nemesis-interval", "3", "--store", str(store), "--no-progress")
        # One broker, acks=all: a SIGKILL loses nothing the OS had (no power loss): valid.
        assert proc.returncode == 0, proc.stdout + proc.stderr
        history = read_history((store / "latest").resolve() / "history.jsonl").ops
        end = next(op["index"] for op in history if op["process"] == "nemesis" and op["f"] == "heal")
        nemesis = [(op["f"], op.get("seed")) for op in history
                   if op["process"] == "nemesis" and op["type"] == "invoke" and op["index"] < end]
        workers: dict[int, list] = {}
        stopped: set[int] = set()
        for op in history[:end]:
            if op["process"] == "nemesis":
                continue
            worker = op["process"] % 3
            if op["type"] == "info":
                stopped.add(worker)
            if op["type"] == "invoke" and worker not in stopped:
                workers.setdefault(worker, []).append(
                    (op["f"], [(m.get("key"), m.get("value")) for m in op.get("mops", [])],
                     None if "keys" not in op else sorted(set(op["keys"]) - set(op.get("unseen", {}))),
                     op.get("seek_to_beginning")))
        return nemesis, workers

    def common_prefix(a, b):
        n = min(len(a), len(b))
        assert a[:n] == b[:n]
        return n

    nemesis1, workers1 = streams(tmp_path / "one")
    nemesis2, workers2 = streams(tmp_path / "two")
    assert common_prefix(nemesis1, nemesis2) >= 3  # kill, start, kill at least
    assert set(workers1) == set(workers2) == {0, 1, 2}
    compared = sum(common_prefix(workers1[w], workers2[w]) for w in workers1)
    assert compared >= 30, (workers1, workers2)
    assert leftovers() == NOTHING_LEFT
