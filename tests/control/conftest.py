"""Fixtures for the control tests: real network namespaces, always removed.

In: nothing. Out: `make_cluster(nodes)` building `LocalCluster`s with fresh
tags under the test's tmp_path, destroyed after the test even when it fails,
and a session-end check that none of the tags used left a namespace or link.
"""

from __future__ import annotations

import os
import shutil

import pytest

from faultline.control import LocalCluster

from .helpers import USED_TAGS, new_tag, ours_on_host


@pytest.fixture
def needs_root():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's `ip`")


@pytest.fixture(scope="session", autouse=True)
def _nothing_of_ours_left():
    yield
    if os.geteuid() == 0 and shutil.which("ip"):
        left = ours_on_host(USED_TAGS)
        assert not left, f"the control tests left these behind: {left}"


@pytest.fixture
def make_cluster(tmp_path, needs_root):
    clusters: list[LocalCluster] = []

    def make(nodes=("n1", "n2", "n3")) -> LocalCluster:
        tag = new_tag()
        cluster = LocalCluster.create(tag, list(nodes), tmp_path / tag)
        clusters.append(cluster)
        return cluster

    yield make
    errors = []
    for cluster in clusters:
        try:
            cluster.destroy()
        except Exception as exc:  # noqa: BLE001 - every cluster still gets its turn
            errors.append(exc)
    left = ours_on_host({c.tag for c in clusters})
    assert not errors and not left, f"teardown failed: {errors}; left behind: {left}"


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    return make_cluster()
