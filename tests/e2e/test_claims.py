"""`faultline claims --quick` for real: a claim's unsafe and safe configurations run on the
reference broker, judged, and tabled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.browser import load
from tests.e2e.test_run import NOTHING_LEFT, faultline, leftovers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def test_quick_claims_reproduce_acks_1_loss_and_hold_with_acks_all(tmp_path):
    store = tmp_path / "store"
    proc = faultline("claims", "--quick", "--only", "acks-1-loses-on-leader-death", "--store", str(store),
                     timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [out] = list((store / "claims").iterdir())
    [row] = json.loads((out / "claims.json").read_text())
    unsafe, safe = row["sides"]["unsafe"], row["sides"]["safe"]
    # acks=1 with followers 2 s behind: the leader kills lose acknowledged writes; acks=all with
    # min.insync.replicas=2 waits for a follower's copy and loses nothing.
    assert (row["system"], row["verdict"]) == ("reference", "CONFIRMED"), (row, proc.stdout)
    assert (unsafe["verdict"], unsafe["showing"], unsafe["runs"]) == ("REPRODUCED", 1, [row["witness"]])
    assert (safe["verdict"], safe["showing"], len(safe["runs"])) == ("HELD", 0, 1)
    witness = json.loads((Path(row["witness"]) / "results.json").read_text())
    assert {"lost-write", "unseen"} & set(witness["anomaly_types"])
    assert "| acks-1-loses-on-leader-death | reference | REPRODUCED: lost-write or unseen in 1 of 1 seeds" in \
        (out / "claims.md").read_text()
    assert f"`faultline repro {row['witness']}`" in proc.stdout
    page = load((out / "claims.html").as_uri(), "claims-quick.png", ["#claims tr", "tr.confirmed"])
    assert page.console == [] and page.errors == [] and page.counts == {"#claims tr": 2, "tr.confirmed": 1}
    assert leftovers() == NOTHING_LEFT
