"""Fixtures shared by the broker's storage tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _close_leftover_files(tmp_path):
    """Close the segment files a test left open (a test that fails midway, or a
    simulated crash followed by more work), so that descriptors do not pile up."""
    yield
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        return
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(fd_dir / fd).startswith(str(tmp_path)):
                os.close(int(fd))
        except OSError:
            pass


@pytest.fixture
def cluster_factory(tmp_path, zookeeper):
    from tests.broker.cluster import Cluster

    made = []

    def make(nodes: int = 3, settings: dict | None = None, start: bool = True) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", zookeeper, nodes, settings)
        made.append(c)
        return c.start() if start else c

    yield make
    for c in made:
        c.close()
