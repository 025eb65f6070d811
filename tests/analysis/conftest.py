"""Fixtures for the Spark analysis tests: one SparkSession for the whole test session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark():
    from faultline.history_analysis.session import get_session

    session = get_session("local[2]", shuffle_partitions=2)
    yield session
    session.stop()


def read_full(directory: Path) -> dict[str, list[dict]]:
    """Every witness written by analyse(full_dir=...), by type."""
    out = {}
    for path in sorted(Path(directory).glob("*.jsonl")):
        out[path.stem] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def by_scenario(full: dict[str, list[dict]]) -> dict[str, dict[str, list[dict]]]:
    """Witnesses grouped by the scenario owning their key ("<scenario>-t/<n>"), then by type."""
    out: dict[str, dict[str, list[dict]]] = {}
    for kind, witnesses in full.items():
        for w in witnesses:
            # A cycle: the key of its first step that has one (order steps have none).
            key = w["key"] if "key" in w else next(st["key"] for st in w["steps"] if st["key"])
            out.setdefault(key.split("-t/")[0], {}).setdefault(kind, []).append(w)
    return out
