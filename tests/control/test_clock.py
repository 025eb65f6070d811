"""Clock skew through libfaketime: a process's wall clock follows its node's offset file."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

import pytest

from faultline.control.clock import CANDIDATES, environment, set_offset
from faultline.control.wait import wait_until
from tests.conftest import free_port

pytestmark = pytest.mark.skipif(not any(p.exists() for p in CANDIDATES), reason="libfaketime is not installed")

TICKER = r"""
import select, sys, time
while True:
    print(f"{time.time():.3f} {time.monotonic():.3f}", flush=True)
    select.select([], [], [], 0.2)  # time.sleep fails under libfaketime (see faultline.broker)
"""


def last_line(path) -> tuple[float, float]:
    lines = path.read_text().split("\n")
    wall, mono = lines[-2].split()
    return float(wall), float(mono)


def test_the_wall_clock_follows_the_offset_file_while_the_monotonic_clock_does_not(tmp_path):
    offsets = tmp_path / "faketime"
    out = tmp_path / "ticks"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", TICKER], stdout=f,
                                env={**os.environ, **environment(offsets)})
    try:
        wait_until(lambda: out.read_text().count("\n") >= 2, 20, "the ticker did not start")
        wall, _ = last_line(out)
        assert abs(wall - time.time()) < 5, "+0 at the start"
        set_offset(offsets, 3600)
        wait_until(lambda: last_line(out)[0] - time.time() > 3590, 10, "the clock did not jump an hour ahead")
        _, mono_before = last_line(out)
        set_offset(offsets, -120)
        wait_until(lambda: time.time() - last_line(out)[0] > 110, 10, "the clock did not go two minutes back")
        _, mono_after = last_line(out)
        assert 0 <= mono_after - mono_before < 10, "the monotonic clock kept running forward"
    finally:
        proc.kill()
        proc.wait()


def test_a_skewed_broker_stamps_its_log_with_the_skewed_time(tmp_path):
    offsets = tmp_path / "faketime"
    set_offset(offsets, 86400)
    log = tmp_path / "broker.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "faultline.broker.main", "--node-id", "1", "--listen",
                                 f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data")],
                                stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **environment(offsets)})
    try:
        wait_until(lambda: "serving on" in log.read_text(), 30, "the broker did not start")
        stamp = log.read_text().split()[0]
        logged = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        ahead = logged - datetime.datetime.now(datetime.timezone.utc)
        assert datetime.timedelta(hours=23) < ahead < datetime.timedelta(hours=25), stamp
    finally:
        proc.kill()
        proc.wait()
